"""The receiving side of compression on the wire: entry checks and overlapped decoding.

A compressed payload is received into a pooled buffer (from the Collective's
:class:`~p2p_compress.TensorBufferPool`, or a plain allocation when its budget is spent:
the bytes are on their way and must be taken) of exactly the wire size read from the
validated frame. A decoder is acquired only once the payload has arrived; it
decompresses straight into the allocated target tensor and is released at once, then
the buffer goes back to the pool. While more payloads of the same frame are still to
come, decoding runs on the Collective's decoder thread so that the direction thread
already receives the next payload.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from p2p_collective._compression._decode_rates import FrameDecodes
from p2p_collective._compression._jobs import Job
from p2p_collective._compression._state import CODEC_IDS, WireCodec
from p2p_collective._compression._stats import WireStats
from p2p_collective._errors import CollectiveTimeoutError, FramingError
from p2p_collective._frames._framing import TensorMeta
from p2p_collective._links._transport import remaining
from p2p_compress import CompressionError, CompressionTimeoutError, decompress_into_tensor
from p2p_compress.internal import CODEC_NAMES, CODEC_RAW, BufferLease


def codec_name(codec_id: int) -> str:
    """A wire codec id in words, for messages."""
    return CODEC_NAMES.get(codec_id, f"unknown codec id {codec_id}")


def decodes(codec: WireCodec | None) -> str:
    """What this side decodes, in words (the end of a refusal's sentence)."""
    if codec is None:
        return "has compression off"
    return f"decodes only {', '.join(CODEC_IDS)} (configured codec {codec.config.codec_name})"


def check_entries(metas: list[TensorMeta], codec: WireCodec | None, peer: str) -> bool:
    """Validate the codec fields of a frame's tensor entries; True when any is compressed.

    A side with compression on decodes lz4, zstd and sparse whatever its own ``codec`` is
    (an adaptive sender picks any of them per link).

    Raises:
        FramingError: An entry names an unknown codec or compression is off here, or a wire
            size no compressed payload can have (compressed payloads are always smaller
            than their tensor, and never empty).
    """
    compressed = False
    for i, m in enumerate(metas):
        if m.codec_id == CODEC_RAW:
            continue
        if codec is None or m.codec_id not in CODEC_IDS.values():
            raise FramingError(
                f"frame from {peer!r}: tensor {i} is compressed with"
                f" {codec_name(m.codec_id)} but this side {decodes(codec)}"
            )
        if not 0 < m.wire_bytes < m.raw_bytes:
            raise FramingError(
                f"frame from {peer!r}: compressed tensor {i} has {m.wire_bytes} wire bytes"
                f" for {m.raw_bytes} raw bytes"
            )
        compressed = True
    return compressed


class _Pending:
    __slots__ = ("index", "job", "lease", "meta")

    def __init__(
        self, index: int, meta: TensorMeta, job: Job[float], lease: BufferLease | None
    ) -> None:
        self.index = index
        self.meta = meta
        self.job = job
        self.lease = lease


class FrameDecoder:
    """Receives and decodes the compressed payloads of one frame.

    Args:
        codec: The Collective's compression state.
        stats: The receiving direction's counters.
        peer: The sender's name, for error messages.
    """

    def __init__(self, codec: WireCodec, stats: WireStats, peer: str) -> None:
        self._codec = codec
        self._stats = stats
        self._peer = peer
        self._pending: list[_Pending] = []
        self.decodes = FrameDecodes()  # per codec: raw bytes and seconds of its calls

    def receive(
        self,
        recv: Callable[[torch.Tensor], None],
        index: int,
        meta: TensorMeta,
        target: torch.Tensor,
        deadline: float | None,
        more: bool,
    ) -> None:
        """Receive tensor ``index``'s compressed payload with ``recv``, then decode it.

        Args:
            recv: Receives one message into the flat uint8 tensor it is given.
            index: The tensor's position in the frame.
            meta: Its validated entry.
            target: The allocated tensor to decode into.
            deadline: ``time.monotonic()`` deadline, or None.
            more: Whether more payload messages of this frame follow (then decoding
                runs on the decoder thread, overlapping the next receive).

        Raises:
            FramingError: The payload is corrupt (decoded here).
            CollectiveTimeoutError: No decoder became free in time (decoded here).
            CollectiveError: From ``recv``.
        """
        lease = self._codec.pool.acquire(meta.wire_bytes)
        buf = torch.empty(meta.wire_bytes, dtype=torch.uint8) if lease is None else lease.buffer
        src = buf[: meta.wire_bytes]
        try:
            recv(src)
        except BaseException:
            if lease is not None:
                lease.discard()  # the transport may still write into it
            raise
        job = self._job(meta, src, target, lease, deadline)
        pending = _Pending(index, meta, job, lease)
        if more and self._codec.pipeline.overlap:
            self._pending.append(pending)
            self._codec.decoder.put(job)
        else:
            self._collect(pending, deadline)

    def decode_now(
        self, index: int, meta: TensorMeta, src: torch.Tensor, target: torch.Tensor
    ) -> None:
        """Decode a compressed payload that arrived inside the header message.

        Raises:
            FramingError: The payload is corrupt.
        """
        self._collect(_Pending(index, meta, self._job(meta, src, target, None, None), None), None)

    def _job(
        self,
        meta: TensorMeta,
        src: torch.Tensor,
        target: torch.Tensor,
        lease: BufferLease | None,
        deadline: float | None,
    ) -> Job[float]:
        provider = self._codec.provider(meta.codec_id)

        def decode() -> float:
            t0 = time.perf_counter()
            try:
                decompress_into_tensor(
                    meta.codec_id, src, target, provider, timeout=remaining(deadline)
                )
            finally:
                if lease is not None:
                    lease.release()
            return time.perf_counter() - t0

        return Job(decode)

    def _collect(self, pending: _Pending, deadline: float | None) -> None:
        meta = pending.meta
        try:
            took = pending.job.result(deadline)
            self._stats.add_seconds(codec=took)
            self.decodes.add(meta.codec_id, meta.raw_bytes, took)
        except CompressionTimeoutError as exc:
            raise CollectiveTimeoutError(
                f"no decoder became free for tensor {pending.index} from {self._peer!r}"
                f" before the deadline: {exc}"
            ) from exc
        except CompressionError as exc:
            raise FramingError(
                f"frame from {self._peer!r}: compressed tensor {pending.index}"
                f" ({CODEC_NAMES.get(meta.codec_id)}, {meta.wire_bytes} wire bytes for"
                f" {meta.raw_bytes} raw bytes) does not decode: {exc}"
            ) from exc

    def finish(self, deadline: float | None) -> None:
        """Wait for (or run) every pending decode, in order; raise the first failure.

        Raises:
            FramingError: A payload is corrupt.
            CollectiveTimeoutError: Decoding did not end before ``deadline``.
        """
        try:
            while self._pending:
                self._collect(self._pending[0], deadline)
                self._pending.pop(0)
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop the decodes that have not started (the frame failed); free their buffers."""
        pending, self._pending = self._pending, []
        for p in pending:
            if p.job.cancel() and p.lease is not None:
                p.lease.release()
