"""The sender's decision for one frame: which tensors to compress, and how the frame travels.

One rule for every size: a tensor with bytes is compressed when it has at least
``min_bytes`` bytes and a dtype not in ``excluded_dtypes`` (and the result is smaller),
whether its frame rides inline in the header message or not. A frame whose header part
and (compressed) tensor bytes fit :data:`~p2p_collective._frames._framing.HEADER_MAX` travels as
one message with the bytes inline; the receiver decodes compressed entries of an inline
frame straight from the header message.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import replace

import torch

from p2p_collective._compression._chunks import ChunkStream
from p2p_collective._compression._state import WireCodec
from p2p_collective._frames._framing import (
    FIXED,
    HEADER_MAX,
    Flag,
    entry_size,
    patch_entry_codec,
    patch_flags,
    patch_wire_total,
)
from p2p_collective._frames._payload import OutFrame, flat_bytes
from p2p_compress import plan_compression
from p2p_compress.internal import CompressionPlan, WireEntry


class Packed:
    """A frame after the compression decision: what the direction thread puts on the wire.

    Attributes:
        frame: The frame, its metadata patched for the compressed tensors.
        plan: The compression plan holding the buffer leases of compressed payload
            messages, or None when there are none (all raw, or all inline).
        reasons: Per tensor with bytes, "" when compressed or why it stayed raw; or one
            reason for all of them.
        ready: ``time.monotonic()`` at which the frame was ready to go (0: unknown).
        codec_seconds: Time spent compressing.
        chunks: A chunked frame's chunk stream (compressed as it is sent), else None.
    """

    __slots__ = (
        "__weakref__",
        "adaptive_dtype",
        "chunks",
        "codec_sample",
        "codec_seconds",
        "codec_tried",
        "frame",
        "plan",
        "ready",
        "reasons",
    )

    def __init__(
        self,
        frame: OutFrame,
        plan: CompressionPlan | None,
        reasons: list[str] | str,
        ready: float,
        codec_seconds: float = 0.0,
        chunks: ChunkStream | None = None,
    ) -> None:
        self.chunks = chunks
        self.codec_sample = (0, 0)  # (raw, wire) bytes the codec was tried on
        self.codec_tried: int | None = None  # the codec id of codec_sample
        self.adaptive_dtype = ""  # an adaptive link: the dtype its figures are kept by
        self.frame = frame
        self.plan = plan
        self.reasons = reasons
        self.ready = ready
        self.codec_seconds = codec_seconds


def _inline(frame: OutFrame, head_len: int, entries: list[WireEntry]) -> OutFrame:
    """The frame as one header message: its header part, then every tensor's wire bytes."""
    total = head_len + sum(e.wire_bytes for e in entries)
    buffer = torch.empty(total, dtype=torch.uint8)
    buffer[:head_len].copy_(frame.buffer[:head_len])
    off = head_len
    for e in entries:
        if e.wire_bytes:
            src = e.payload if e.compressed else flat_bytes(e.payload)
            buffer[off : off + e.wire_bytes].copy_(src)
            off += e.wire_bytes
    view = buffer.numpy().data
    patch_flags(view, Flag.INLINE)
    return replace(frame, view=view, buffer=buffer, ext=False, payloads=[])


def compress_frame(codec: WireCodec, frame: OutFrame, codec_id: int | None = None) -> Packed:
    """Decide per tensor, compress the ones that shrink, patch the frame's metadata.

    An inline frame stays inline (its compressed bytes are smaller); a frame of payload
    messages becomes inline when its compressed bytes fit the header message.
    ``codec_id`` picks the codec (an adaptive link's choice; None: the job's).

    Raises:
        CompressionError: A codec failed (the leases taken are returned first).
    """
    with_bytes = [(i, m) for i, m in enumerate(frame.metas) if m.raw_bytes]
    # Cheap pre-check, so a frame without candidates never creates the provider.
    if not any(codec.eligible(m) for _, m in with_bytes):
        return Packed(frame, None, [codec.raw_reason(m) for _, m in with_bytes], time.monotonic())
    if frame.payloads:
        sources = [p.view(m.dtype) for p, (_, m) in zip(frame.payloads, with_bytes, strict=True)]
    else:  # inline: the tensors' bytes sit in the header message
        sources = [flat_bytes(frame.tensors[i]).view(m.dtype) for i, m in with_bytes]
    t0 = time.perf_counter()
    config = codec.config_for(codec_id)
    plan = plan_compression(sources, config, codec.provider(codec_id), codec.pool)
    spent = time.perf_counter() - t0
    entries = plan.entries
    reasons = [e.reason for e in entries]
    tried = [e for e in entries if e.reason in ("", "not_smaller")]
    sample = (sum(e.raw_bytes for e in tried), sum(e.wire_bytes for e in tried))
    if not any(e.compressed for e in entries):
        packed = Packed(frame, None, reasons, time.monotonic(), spent)
        packed.codec_sample, packed.codec_tried = sample, config.codec_id
        return packed
    metas = list(frame.metas)
    payloads = list(frame.payloads)
    view = frame.view
    offsets = []
    off = FIXED.size
    for m in frame.metas:
        offsets.append(off)
        off += entry_size(len(m.shape))
    for j, ((i, m), e) in enumerate(zip(with_bytes, entries, strict=True)):
        if e.compressed:
            metas[i] = m._replace(codec_id=e.codec_id, wire_bytes=e.wire_bytes)
            patch_entry_codec(view, offsets[i], e.codec_id, e.wire_bytes)
            if payloads:
                payloads[j] = e.payload
    patch_wire_total(view, sum(m.wire_bytes for m in metas))
    head_len = len(view) - (0 if frame.payloads else sum(m.raw_bytes for _, m in with_bytes))
    if not frame.ext and head_len + plan.wire_bytes <= HEADER_MAX:
        try:
            small = _inline(replace(frame, metas=metas), head_len, entries)
        finally:
            plan.release_all()  # the bytes were copied into the header message
        packed = Packed(small, None, reasons, time.monotonic(), spent)
        packed.codec_sample, packed.codec_tried = sample, config.codec_id
        return packed
    packed = Packed(replace(frame, metas=metas, payloads=payloads), plan, reasons, 0.0, spent)
    packed.codec_sample, packed.codec_tried = sample, config.codec_id
    # A frame dropped unsent (its direction broke or closed) gives its buffers back.
    weakref.finalize(packed, plan.release_all)
    packed.ready = time.monotonic()
    return packed
