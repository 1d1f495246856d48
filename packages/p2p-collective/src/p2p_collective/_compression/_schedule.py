"""When a frame is compressed: now, on a compressor thread, or by its direction thread."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from functools import partial

import torch

from p2p_collective._compression._adaptive import SHUFFLED, LinkAdvisor, Sampler
from p2p_collective._compression._chunks import chunk_frame, is_chunked
from p2p_collective._compression._jobs import Job
from p2p_collective._compression._pack import Packed, compress_frame
from p2p_collective._compression._state import WireCodec
from p2p_collective._compression._stats import WireStats
from p2p_collective._frames._payload import OutFrame
from p2p_compress.internal import CODEC_SPARSE, shuffle_itemsize


def _main_dtype(codec: WireCodec, frame: OutFrame) -> str:
    """The dtype of the frame's largest eligible tensor (an adaptive link's figures key)."""
    sizes: dict[str, int] = {}
    for m in frame.metas:
        if m.raw_bytes and codec.eligible(m):
            name = str(m.dtype).removeprefix("torch.")
            sizes[name] = sizes.get(name, 0) + m.raw_bytes
    return max(sizes, key=lambda k: sizes[k]) if sizes else ""


def _adaptive_reasons(codec: WireCodec, frame: OutFrame) -> list[str]:
    """Why each tensor of a frame an adaptive link sends raw stays raw."""
    return [
        "adaptive" if codec.eligible(m) else codec.raw_reason(m) for m in frame.metas if m.raw_bytes
    ]


def _probe_aside(
    codec: WireCodec,
    codec_id: int,
    data: torch.Tensor,
    itemsize: int,
    sampler: Sampler,
    advisor: LinkAdvisor,
    dtype: str,
    compress: bool,
) -> None:
    """Compress and decode 256 KiB of ``data`` aside with codec ``codec_id`` (as chunks go).

    The decode figure goes to the advisor (source ``probe``), and with ``compress`` the
    compress figures too (a learning frame's own chunks give those).
    """
    provider = codec.provider(codec_id)
    encoder = provider.acquire_encoder()
    if encoder is None:
        return
    shuffle = itemsize if codec_id != CODEC_SPARSE else 0
    try:
        raw, wire, seconds, decode = sampler.measure(encoder, data, shuffle)
    finally:
        provider.release(encoder)
    if compress:
        advisor.observe_codec(codec_id, dtype, raw, wire, seconds)
    advisor.observe_decode(codec_id, dtype, raw, decode)


def _adaptive_chunks(
    codec: WireCodec, frame: OutFrame, advisor: LinkAdvisor, dtype: str, sampler: Sampler
) -> Packed:
    """A chunked frame of an adaptive link, its codec chosen now (as it goes on the wire).

    Its data class is the dtype and the ratio class of a sample of its largest eligible
    tensor, with ``:s`` when that tensor's chunks are byte-shuffled.
    """
    with_bytes = [m for m in frame.metas if m.raw_bytes]
    candidates = [
        (m.raw_bytes, j)
        for j, m in enumerate(with_bytes)
        if codec.eligible(m) and str(m.dtype).removeprefix("torch.") == dtype
    ]
    _, largest = max(candidates)
    data = frame.payloads[largest]
    dtype = f"{dtype}:c{sampler.sample_class(data)}"
    itemsize = shuffle_itemsize(with_bytes[largest].dtype, data)
    if itemsize:
        dtype += SHUFFLED
    choice = advisor.decide(dtype, True)
    if choice.codec is None:  # raw: one plain frame; a probe is compressed aside
        if choice.probe is not None:
            _probe_aside(codec, choice.probe, data, itemsize, sampler, advisor, dtype, True)
        packed = Packed(frame, None, _adaptive_reasons(codec, frame), 0.0)
        packed.adaptive_dtype = dtype
        return packed
    for cid in choice.learn:  # the receiver's first decodes run cold: a figure of our own
        _probe_aside(codec, cid, data, itemsize, sampler, advisor, dtype, False)
    stream = chunk_frame(codec, frame, choice, {largest: itemsize})  # sampled once
    assert stream is not None
    packed = Packed(frame, None, [], 0.0, chunks=stream)
    packed.adaptive_dtype = dtype
    weakref.finalize(packed, stream.abandon)  # dropped unsent: buffers go back
    return packed


class Outgoing:
    """One queued send: its frame, compressed now or by the compressor thread."""

    __slots__ = ("_job", "_later", "_packed", "submitted")

    def __init__(self, packed: Packed | None, job: Job[Packed] | None) -> None:
        self._packed = packed
        self._job = job
        self._later: Callable[[], Packed] | None = None
        self.submitted = time.monotonic()

    @classmethod
    def prepare(
        cls,
        codec: WireCodec | None,
        frame: OutFrame,
        async_op: bool,
        stats: WireStats | None = None,
    ) -> Outgoing:
        """Compress ``frame`` now (synchronous send), later (asynchronous) or not at all.

        ``stats`` are the sending direction's counters; with ``adaptive`` they hold the
        link's :class:`LinkAdvisor`, which may send the eligible tensors raw.

        Raises:
            CompressionError: A codec failed (synchronous sends only).
        """
        if codec is None:
            return cls(Packed(frame, None, "disabled", 0.0), None)
        if not any(m.raw_bytes and codec.eligible(m) for m in frame.metas):
            reasons = [codec.raw_reason(m) for m in frame.metas if m.raw_bytes]
            return cls(Packed(frame, None, reasons, 0.0), None)
        adaptive = codec.pipeline.adaptive
        if adaptive is not None and stats is not None:
            if stats.advisor is None:
                stats.advisor = LinkAdvisor(
                    codec.adaptive_ids,
                    codec.compressor_threads,
                    adaptive.probe_every,
                    codec.decoder_threads,  # the peer's, until its records say
                )
            if stats.advisor.memory_link:  # raw, nothing sampled or probed
                stats.advisor.decide("", False)  # (keeps its reason current)
                return cls(Packed(frame, None, _adaptive_reasons(codec, frame), 0.0), None)
            dtype = _main_dtype(codec, frame)
            if is_chunked(codec, frame):  # decided as it goes, by then earlier frames taught more
                out = cls(None, None)
                if stats.sampler is None:
                    stats.sampler = Sampler()
                job = partial(_adaptive_chunks, codec, frame, stats.advisor, dtype, stats.sampler)
                out._later = job
                return out
            choice = stats.advisor.decide(dtype, False)
            use = choice.probe if choice.probe is not None else choice.codec
            if use is None:  # raw pays best on this link
                packed = Packed(frame, None, _adaptive_reasons(codec, frame), 0.0)
                packed.adaptive_dtype = dtype
                return cls(packed, None)
            return cls._compress(codec, frame, async_op, use, dtype)
        stream = chunk_frame(codec, frame)
        if stream is not None:  # compressed chunk by chunk, a window ahead of the wire
            packed = Packed(frame, None, [], 0.0, chunks=stream)
            weakref.finalize(packed, stream.abandon)  # dropped unsent: buffers go back
            return cls(packed, None)
        return cls._compress(codec, frame, async_op, None, "")

    @classmethod
    def _compress(
        cls, codec: WireCodec, frame: OutFrame, async_op: bool, codec_id: int | None, dtype: str
    ) -> Outgoing:
        """Compress a frame too small for chunks: now (synchronous send) or on a thread."""

        def run() -> Packed:
            packed = compress_frame(codec, frame, codec_id)
            packed.adaptive_dtype = dtype
            return packed

        if not async_op:
            return cls(run(), None)
        job: Job[Packed] = Job(run)
        if codec.pipeline.overlap:
            codec.compressor.put(job)
        # else the direction thread compresses it right before sending it
        return cls(None, job)

    def resolve(self, deadline: float | None) -> Packed:
        """The packed frame (compressing it here if the compressor has not started it).

        Raises:
            CompressionError: A codec failed.
            CollectiveTimeoutError: The compressor did not finish before ``deadline``.
        """
        packed = self._packed
        if packed is None and self._later is not None:
            packed = self._packed = self._later()
            self._later = None
        if packed is None:
            assert self._job is not None
            packed = self._packed = self._job.result(deadline)
            self._job = None
        if not packed.ready:
            packed.ready = self.submitted
        return packed
