"""The sender's decision for one frame: which payload tensors to compress, into what."""

from __future__ import annotations

import time
import weakref
from dataclasses import replace

from p2p_collective._compression._state import WireCodec
from p2p_collective._framing import FIXED, entry_size, patch_entry_codec, patch_wire_total
from p2p_collective._payload import OutFrame
from p2p_compress import CompressionPlan, plan_compression


class Packed:
    """A frame after the compression decision: what the direction thread puts on the wire.

    Attributes:
        frame: The frame, its metadata patched for the compressed tensors.
        plan: The compression plan holding the buffer leases, or None when all are raw.
        reasons: Per tensor with bytes, "" when compressed or why it stayed raw; or one
            reason for all of them.
        ready: ``time.monotonic()`` at which the frame was ready to go (0: unknown).
        codec_seconds: Time spent compressing.
    """

    __slots__ = ("__weakref__", "codec_seconds", "frame", "plan", "ready", "reasons")

    def __init__(
        self,
        frame: OutFrame,
        plan: CompressionPlan | None,
        reasons: list[str] | str,
        ready: float,
        codec_seconds: float = 0.0,
    ) -> None:
        self.frame = frame
        self.plan = plan
        self.reasons = reasons
        self.ready = ready
        self.codec_seconds = codec_seconds


def compress_frame(codec: WireCodec, frame: OutFrame) -> Packed:
    """Decide per payload tensor, compress the ones that shrink, patch the frame's metadata.

    Raises:
        CompressionError: A codec failed (the leases taken are returned first).
    """
    cfg = codec.config
    with_bytes = [(i, m) for i, m in enumerate(frame.metas) if m.raw_bytes]
    # Cheap pre-check, so a frame without candidates never creates the provider.
    eligible = any(
        m.raw_bytes >= cfg.min_bytes and m.dtype not in cfg.excluded_dtypes for _, m in with_bytes
    )
    if not eligible:
        reasons = [
            "below_min_bytes" if m.raw_bytes < cfg.min_bytes else "excluded_dtype"
            for _, m in with_bytes
        ]
        return Packed(frame, None, reasons, time.monotonic())
    sources = [p.view(m.dtype) for p, (_, m) in zip(frame.payloads, with_bytes, strict=True)]
    t0 = time.perf_counter()
    plan = plan_compression(sources, cfg, codec.provider(), codec.pool)
    spent = time.perf_counter() - t0
    entries = plan.entries
    reasons = [e.reason for e in entries]
    if not any(e.compressed for e in entries):
        return Packed(frame, None, reasons, time.monotonic(), spent)
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
            payloads[j] = e.payload
    patch_wire_total(view, sum(m.wire_bytes for m in metas))
    packed = Packed(replace(frame, metas=metas, payloads=payloads), plan, reasons, 0.0, spent)
    # A frame dropped unsent (its direction broke or closed) gives its buffers back.
    weakref.finalize(packed, plan.release_all)
    packed.ready = time.monotonic()
    return packed
