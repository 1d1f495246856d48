"""Putting a packed frame on the wire, message by message, paced and counted."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from p2p_collective._compression._chunks import (
    DESCRIPTOR,
    ChunkStream,
    actual_metas,
    pack_descriptor,
)
from p2p_collective._compression._pack import Packed
from p2p_collective._compression._stats import WireStats
from p2p_collective._links._emulation import LinkPacer


class _TimedSend:
    """A link's send, counting the bytes and the seconds spent in it."""

    __slots__ = ("nbytes", "seconds", "send")

    def __init__(self, send: Callable[[torch.Tensor, float | None, bool], None]) -> None:
        self.send = send
        self.nbytes = 0
        self.seconds = 0.0

    def __call__(self, msg: torch.Tensor, deadline: float | None, header: bool) -> None:
        t0 = time.perf_counter()
        self.send(msg, deadline, header)
        self.seconds += time.perf_counter() - t0
        self.nbytes += int(msg.numel())


def transmit(
    send: Callable[[torch.Tensor, float | None, bool], None],
    packed: Packed,
    pacer: LinkPacer | None,
    stats: WireStats,
    deadline: float | None,
    transport: str | None = None,
    seq: int | None = None,
) -> int:
    """Put a packed frame on the wire, message by message; return the message count.

    With an adaptive link (``stats.advisor``) the link's delivered rate, its
    ``transport`` (the link's name, e.g. ``"shm"``) and the codec's figures of this frame
    are handed to the advisor, and the frame's data class is remembered by its sequence
    number ``seq`` (the receiver's decode records name it).
    """
    advisor = stats.advisor
    if advisor is None:
        return _transmit(send, packed, pacer, stats, deadline)
    if seq is not None and packed.adaptive_dtype:  # before its records can come back
        advisor.sending(seq, packed.adaptive_dtype)
    timed = _TimedSend(send)
    paced = stats.emulated_seconds
    sent = _transmit(timed, packed, pacer, stats, deadline)
    paced = stats.emulated_seconds - paced
    emulated = None
    if pacer is not None and pacer.bandwidth_mbps is not None:
        emulated = pacer.bandwidth_mbps * 1e6 / 8
    if packed.chunks is not None:
        sent_raw = not any(c.codec_id for c in packed.chunks.chunks)
    else:
        sent_raw = not any(m.codec_id for m in packed.frame.metas)
    advisor.observe_link(timed.nbytes, timed.seconds + paced, emulated, sent_raw, transport)
    dtype = packed.adaptive_dtype
    if packed.chunks is not None:
        for c in packed.chunks.chunks:
            if c.seconds and c.use is not None:
                advisor.observe_codec(c.use, dtype, int(c.source.numel()), c.wire_len, c.seconds)
    elif packed.codec_seconds and packed.codec_tried is not None:
        raw, wire = packed.codec_sample
        advisor.observe_codec(packed.codec_tried, dtype, raw, wire, packed.codec_seconds)
    return sent


def _transmit(
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
    if packed.chunks is not None:
        return _transmit_chunked(send, packed, packed.chunks, pacer, stats, deadline)
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


def _transmit_chunked(
    send: Callable[[torch.Tensor, float | None, bool], None],
    packed: Packed,
    stream: ChunkStream,
    pacer: LinkPacer | None,
    stats: WireStats,
    deadline: float | None,
) -> int:
    """A chunked frame: its header now, then each chunk as soon as it is ready.

    On an emulated link the header is scheduled as a frame of its own and each chunk as
    a message of its own, from the moment it was ready; its descriptor tells the
    receiver when its last byte arrives.
    """
    frame = packed.frame
    headers = frame.header_messages()
    paced = 0.0
    wire = 0
    try:
        if pacer is not None:
            sizes = [int(m.numel()) for m in headers]
            paced = pacer.release(sizes, packed.ready, deadline, frame.view)
        for k, msg in enumerate(headers):
            send(msg, deadline, k == 0)
            wire += int(msg.numel())
        for index in range(len(stream.chunks)):
            chunk = stream.take(index, deadline, packed.ready)
            assert chunk.payload is not None
            n = chunk.wire_len
            arrive_ns = hold_us = 0
            if pacer is not None:
                arrive_ns, hold_us, slept = pacer.schedule(
                    DESCRIPTOR.size + n, chunk.ready, deadline
                )
                paced += slept
            desc = pack_descriptor(
                chunk.codec_id, int(chunk.source.numel()), n, arrive_ns, hold_us, chunk.shuffled
            )
            send(torch.frombuffer(bytearray(desc), dtype=torch.uint8), deadline, False)
            send(chunk.payload, deadline, False)
            wire += DESCRIPTOR.size + n
            if chunk.lease is not None:
                chunk.lease.release()  # this chunk's send completed
                chunk.lease = None
    except BaseException:
        stream.abandon()
        stats.add_seconds(codec=sum(c.seconds for c in stream.chunks), emulated=paced)
        raise
    frame.sent_wire_bytes = wire
    tensor_reasons, chunk_reasons = stream.reasons()
    compressed = sum(1 for c in stream.chunks if not c.reason)
    codec_seconds = sum(c.seconds for c in stream.chunks)
    stats.count(actual_metas(frame.metas, stream), tensor_reasons, codec_seconds, paced)
    stats.count_chunks(len(stream.chunks), compressed, chunk_reasons)
    return len(headers) + 2 * len(stream.chunks)
