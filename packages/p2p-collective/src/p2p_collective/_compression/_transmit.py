"""Putting a packed frame on the wire, message by message, paced and counted."""

from __future__ import annotations

from collections.abc import Callable

import torch

from p2p_collective._compression._pack import Packed
from p2p_collective._compression._stats import WireStats
from p2p_collective._emulation import LinkPacer


def transmit(
    send: Callable[[torch.Tensor, float | None, bool], None],
    packed: Packed,
    pacer: LinkPacer | None,
    stats: WireStats,
    deadline: float | None,
) -> int:
    """Put a packed frame on the wire, message by message; return the message count.

    On an emulated link the frame is scheduled first by its real wire size (the sender
    waits for its turn; the header then tells the receiver when the frame arrives); each
    compressed payload's buffer goes back to the pool once its send completed. On a
    failure the buffers not yet sent are discarded, not cached: the transport may still
    hold them.
    """
    frame, plan = packed.frame, packed.plan
    headers = frame.header_messages()
    payloads = frame.payloads
    if plan is None and pacer is None:  # the plain path: nothing to pace or give back
        for k, msg in enumerate(headers):
            send(msg, deadline, k == 0)  # the frame's first message travels as a header
        for msg in payloads:
            send(msg, deadline, False)
        stats.count(frame.metas, packed.reasons, packed.codec_seconds)
        return len(headers) + len(payloads)
    paced = 0.0
    try:
        if pacer is not None:
            sizes = [int(m.numel()) for m in headers] + [int(m.numel()) for m in payloads]
            paced = pacer.release(sizes, packed.ready, deadline, frame.view)
        for k, msg in enumerate(headers):
            send(msg, deadline, k == 0)
        for j, msg in enumerate(payloads):
            send(msg, deadline, False)
            if plan is not None:
                plan.release_entry(j)  # this payload's send completed
    except BaseException:
        if plan is not None:
            for entry in plan.entries:
                if entry.lease is not None:
                    entry.lease.discard()
        stats.add_seconds(codec=packed.codec_seconds, emulated=paced)
        raise
    stats.count(frame.metas, packed.reasons, packed.codec_seconds, paced)
    return len(headers) + len(payloads)
