"""Putting a frame on a link and taking one off it, message by message.

The receiving side posts a receive only for sizes it has read from a frame header it
validated (magic, version, sequence number, consistent metadata): gloo aborts the whole
process when a message is longer than the receive posted for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from p2p_collective._compression import FrameDecoder, WireCodec, WireStats, check_entries
from p2p_collective._compression._chunk_recv import receive_chunks
from p2p_collective._errors import FramingError
from p2p_collective._frames._framing import (
    FIXED,
    HEADER_MAX,
    NO_MAGIC,
    Device,
    Flag,
    Kind,
    TensorMeta,
    parse_fixed,
    parse_meta,
)
from p2p_collective._frames._framing import patch_seq as _patch_seq
from p2p_collective._frames._payload import OutFrame, allocate, flat_bytes
from p2p_collective._frames._recvpool import ReceiveBufferPool
from p2p_collective._links._emulation import ArrivalGate
from p2p_collective._links._link import Link


def patch_frame_seq(frame: OutFrame, seq: int) -> None:
    """Write the direction's sequence number into an encoded frame's header."""
    _patch_seq(frame.view, seq)


HEADER_MAX_TENSOR = HEADER_MAX - FIXED.size
"""``send_tensor`` payloads up to this many bytes ride in the header message."""


@dataclass
class Received:
    """A frame taken off the wire, not yet rebuilt into the sent object."""

    kind: int
    flags: int
    metas: list[TensorMeta]
    names: list[str] | None
    obj: memoryview | None
    tensors: list[torch.Tensor]
    transport_messages: int
    payload_bytes: int
    wire_bytes: int


def _allocate(make: Callable[[], torch.Tensor], nbytes: int, peer: str) -> torch.Tensor:
    try:
        return make()
    except (RuntimeError, MemoryError) as exc:  # the frame cannot be taken off the wire
        raise FramingError(
            f"frame from {peer!r}: cannot allocate the {nbytes} bytes it announces: {exc}"
        ) from exc


class _Hold:
    """Holds the messages of one frame from an emulated link until each has arrived."""

    __slots__ = ("arrival", "byte_ps", "deadline", "gate", "held")

    def __init__(
        self, gate: ArrivalGate, arrival: float, byte_ps: int, deadline: float | None
    ) -> None:
        self.gate = gate
        self.arrival = arrival
        self.byte_ps = byte_ps
        self.deadline = deadline
        self.held = 0.0

    def __call__(self, after: int) -> None:
        """Wait until the frame's bytes up to ``after`` past the header message arrived."""
        self.held += self.gate.hold(self.arrival, after, self.byte_ps, self.deadline)

    def after_recv(
        self, recv: Callable[[torch.Tensor], None], after: int, buf: torch.Tensor
    ) -> None:
        """``recv(buf)``, then wait until those bytes arrived."""
        recv(buf)
        self(after)


def read_frame(
    link: Link,
    scratch: torch.Tensor,
    scratch_view: memoryview,
    expected_seq: int,
    deadline: float | None,
    pool: ReceiveBufferPool,
    codec: WireCodec | None = None,
    stats: WireStats | None = None,
    *,
    header_received: bool = False,
    gate: ArrivalGate | None = None,
) -> Received:
    """Receive one whole frame: header, optional extension, one message per tensor.

    Compressed tensors (``codec`` given) are received into pooled buffers of exactly
    their validated wire size and decoded into the allocated tensors, overlapping the
    receives of the frame's later payloads.

    Args:
        link: The direction's link.
        scratch: A HEADER_MAX-byte uint8 tensor the header message is received into.
        scratch_view: A memoryview of ``scratch``.
        expected_seq: The sequence number the frame must carry.
        deadline: ``time.monotonic()`` deadline, or None.
        pool: Where large receive buffers come from.
        codec: The Collective's compression state (None: compression off).
        stats: The direction's tensor counters, updated once the frame is complete.
        header_received: The header message is already in ``scratch`` (taken by a
            :class:`HeaderReceiver`); only the rest of the frame is received here.
        gate: Holds each message of a frame from an emulated link until its emulated
            arrival (the header says whether the link is emulated).

    Raises:
        FramingError: The header or metadata is not a valid frame for ``expected_seq``,
            or it announces something this version cannot receive.
        CollectiveTimeoutError, PeerError: From the link.
    """
    peer = link.peer
    if not header_received:
        scratch_view[:4] = NO_MAGIC
        link.recv(scratch, deadline, header=True)
    received_at = time.monotonic()
    hdr = parse_fixed(scratch_view, expected_seq, peer)
    # From an emulated link (the header says so), each message is held until its
    # emulated arrival: ``hold(bytes after the header)``; None otherwise.
    hold = None
    arrival = None if gate is None else gate.arrival(hdr.arrive_ns, hdr.hold_us, received_at)
    if arrival is not None and gate is not None:
        hold = _Hold(gate, arrival, hdr.byte_ps, deadline)

    if hdr.kind == Kind.RAW:
        raise FramingError(
            f"frame from {peer!r} (sequence {expected_seq}) comes from send_tensor() where"
            " this side called recv(); pair send with recv and send_tensor with recv_tensor"
        )
    if (
        hdr.kind == Kind.OBJECT
        and not (hdr.n_tensors or hdr.meta_len or hdr.wire_total)
        and not hdr.flags & Flag.EXT
    ):
        # A plain object (the common small message): no metadata, no payload messages.
        end = FIXED.size + hdr.obj_len
        obj = scratch_view[FIXED.size : end] if hdr.obj_len else None
        if hold is not None:
            hold(0)
            if stats is not None:
                stats.add_seconds(emulated=hold.held)
        return Received(hdr.kind, hdr.flags, [], None, obj, [], 1, hdr.obj_len, end)
    messages = 1
    wire = hdr.inline_len
    if hdr.flags & Flag.EXT:
        ext = _allocate(
            lambda: pool.take(hdr.meta_len + hdr.obj_len), hdr.meta_len + hdr.obj_len, peer
        )
        if ext.numel():
            link.recv(ext, deadline)
            messages += 1
            wire += ext.numel()
            if hold is not None:
                hold(wire - hdr.inline_len)
        body = ext.numpy().data
    else:
        body = scratch_view[FIXED.size : hdr.inline_len]
    metas, names = parse_meta(body[: hdr.meta_len], hdr, peer)
    for i, m in enumerate(metas):
        if m.device != Device.CPU:
            raise FramingError(
                f"frame from {peer!r}: tensor {i} has device kind {m.device}; this version"
                " receives CPU tensors only"
            )
    compressed = check_entries(metas, codec, peer)
    tensors = [_allocate(partial(allocate, m, pool.take), m.raw_bytes, peer) for m in metas]
    decoder = None
    if compressed:
        assert codec is not None  # check_entries refuses compressed entries without one
        decoder = FrameDecoder(codec, stats if stats is not None else WireStats(), peer)
    if hdr.flags & Flag.CHUNKED:  # each tensor as chunks, each after its descriptor
        if hold is not None:
            hold(0)
        metas, n, w = receive_chunks(
            link.recv,
            metas,
            tensors,
            codec,
            stats,
            peer,
            deadline,
            gate if hold else None,
            expected_seq,
        )
        messages += n
        wire += w
    elif hdr.flags & Flag.INLINE:
        if hold is not None:
            hold(0)
        off = FIXED.size + hdr.meta_len + hdr.obj_len
        for i, (t, m) in enumerate(zip(tensors, metas, strict=True)):
            if m.wire_bytes:
                src = scratch[off : off + m.wire_bytes]
                if decoder is not None and m.codec_id:
                    decoder.decode_now(i, m, src, t)
                else:
                    flat_bytes(t).copy_(src)
                off += m.wire_bytes
    else:
        last = max((i for i, m in enumerate(metas) if m.wire_bytes), default=-1)
        try:
            for i, (t, m) in enumerate(zip(tensors, metas, strict=True)):
                if not m.wire_bytes:
                    continue
                after = wire + m.wire_bytes - hdr.inline_len
                if decoder is not None and m.codec_id:
                    recv: Callable[[torch.Tensor], None] = partial(link.recv, deadline=deadline)
                    if hold is not None:  # decoding starts once the payload has "arrived"
                        recv = partial(hold.after_recv, recv, after)
                    decoder.receive(recv, i, m, t, deadline, i < last)
                else:
                    link.recv(flat_bytes(t), deadline)
                    if hold is not None:
                        hold(after)
                messages += 1
                wire += m.wire_bytes
            if decoder is not None:
                decoder.finish(deadline)
        except BaseException:
            if decoder is not None:
                decoder.abort()
            raise
    if stats is not None:
        if decoder is not None and not hdr.flags & Flag.CHUNKED:
            stats.report_decodes(expected_seq, decoder.decodes)
        stats.count(metas, None)
        if hold is not None:
            stats.add_seconds(emulated=hold.held)
    obj = body[hdr.meta_len : hdr.meta_len + hdr.obj_len] if hdr.obj_len else None
    payload = sum(m.raw_bytes for m in metas) + hdr.obj_len
    return Received(hdr.kind, hdr.flags, metas, names, obj, tensors, messages, payload, wire)
