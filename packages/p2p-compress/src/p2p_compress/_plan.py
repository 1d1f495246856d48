"""The sender's compression decision (seed 000 steps 1-5) and the receiver's decode."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

import torch

from p2p_compress._codecs._codec import CODEC_NAMES, CODEC_RAW, TensorCodec
from p2p_compress._codecs._memory import tensor_bytes, uint8_buffer_bytes
from p2p_compress._config import TensorCompressionConfig
from p2p_compress._errors import CompressionError
from p2p_compress._pool import BufferLease, TensorBufferPool
from p2p_compress._provider import TensorCodecProvider

RAW_REASONS = (
    "disabled",
    "not_cpu",
    "below_min_bytes",
    "excluded_dtype",
    "codec_busy",
    "unsupported_size",
    "no_buffer",
    "not_smaller",
)
"""Every value of :attr:`WireEntry.reason` for a raw entry, in the order they are checked."""


@dataclass(frozen=True, slots=True)
class WireEntry:
    """How one tensor goes on the wire.

    Attributes:
        codec_id: 0 raw, 1 lz4, 2 zstd.
        raw_bytes: the tensor's byte count.
        wire_bytes: bytes on the wire (``raw_bytes`` when raw).
        payload: what to send: the original tensor when raw, else a ``torch.uint8`` view
            ``[:wire_bytes]`` of a pooled buffer (valid until the entry is released).
        reason: why the tensor stays raw (one of :data:`RAW_REASONS`), "" when compressed.
    """

    codec_id: int
    raw_bytes: int
    wire_bytes: int
    payload: torch.Tensor
    reason: str
    lease: BufferLease | None = field(default=None, repr=False, compare=False)

    @property
    def compressed(self) -> bool:
        """True when the payload is compressed."""
        return self.codec_id != CODEC_RAW


class CompressionPlan:
    """Per-tensor wire entries plus the buffer leases to return after sending.

    Release each compressed entry after its payload's send completed
    (:meth:`release_entry`), or everything at once (:meth:`release_all`, also on
    leaving a ``with`` block). Releasing is idempotent and thread-safe.
    """

    def __init__(self, entries: list[WireEntry]) -> None:
        self.entries = entries
        self._lock = threading.Lock()

    @property
    def raw_bytes(self) -> int:
        """Total raw bytes of all tensors."""
        return sum(e.raw_bytes for e in self.entries)

    @property
    def wire_bytes(self) -> int:
        """Total bytes the payloads put on the wire."""
        return sum(e.wire_bytes for e in self.entries)

    def release_entry(self, index: int) -> None:
        """Return entry ``index``'s buffer to the pool (no-op when raw or already done)."""
        lease = self.entries[index].lease
        if lease is not None:
            lease.release()

    def release_all(self) -> None:
        """Return every entry's buffer to the pool (idempotent)."""
        with self._lock:
            for entry in self.entries:
                if entry.lease is not None:
                    entry.lease.release()

    def __enter__(self) -> CompressionPlan:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release_all()

    def __repr__(self) -> str:
        n = sum(e.compressed for e in self.entries)
        return (
            f"<CompressionPlan {len(self.entries)} tensors, {n} compressed, "
            f"{self.raw_bytes} -> {self.wire_bytes} bytes>"
        )


def _raw(tensor: torch.Tensor, nbytes: int, reason: str) -> WireEntry:
    return WireEntry(CODEC_RAW, nbytes, nbytes, tensor, reason)


def plan_compression(
    tensors: Sequence[torch.Tensor],
    config: TensorCompressionConfig | None,
    provider: TensorCodecProvider,
    pool: TensorBufferPool,
) -> CompressionPlan:
    """Decide, per tensor, raw or compressed, and compress the ones that shrink.

    Seed 000's sender steps: (1) acquire the provider's encoder without waiting, at the
    first eligible tensor (none free: the eligible tensors stay raw, ``codec_busy``);
    (2) walk the tensors in order, keep CPU tensors with at least ``min_bytes`` bytes and
    a dtype not excluded, lease a buffer for each (a size the codec cannot take or an
    exhausted budget keeps it raw); (3) keep the result only if smaller, else discard
    the buffer (not cached); (4) report per-tensor codec and wire size; (5) release the
    codec as soon as compression ends. The leases stay with the plan until the caller
    releases them after sending.

    Args:
        tensors: the tensors of one message, in wire order (any device).
        config: the compression config; None or ``enabled=False`` keeps all raw.
        provider: the process's codec provider (its codec must match ``config``'s).
        pool: the process's buffer pool.

    Returns:
        A plan with one :class:`WireEntry` per tensor, in order.

    Raises:
        TypeError: an element is not a tensor.
        ValueError: an eligible CPU tensor is not contiguous (or not dense), or the
            provider's codec differs from ``config``'s.
        CompressionError: the codec failed; leases taken so far are returned first.

    Example:
        >>> from p2p_compress import Lz4CodecConfig, TensorBufferPool, TensorCodecProvider
        >>> cfg = TensorCompressionConfig(Lz4CodecConfig(), min_bytes=1024)
        >>> provider, pool = TensorCodecProvider(cfg), TensorBufferPool(1 << 20)
        >>> plan = plan_compression([torch.zeros(4096, dtype=torch.int64), torch.ones(3)],
        ...                         cfg, provider, pool)
        >>> [(e.codec_id, e.reason) for e in plan.entries]
        [(1, ''), (0, 'below_min_bytes')]
        >>> plan.release_all()
    """
    enabled = config is not None and config.enabled
    min_bytes: int = 0
    excluded: tuple[torch.dtype, ...] = ()
    if config is not None and enabled:
        if provider.codec_config is not config.codec and provider.codec_config != config.codec:
            raise ValueError(
                f"provider codec {provider.codec_config} does not match config codec {config.codec}"
            )
        min_bytes, excluded = config.min_bytes, config.excluded_dtypes
    entries: list[WireEntry] = []
    codec: TensorCodec | None = None
    acquired = False
    try:
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"tensors[{i}] must be a torch.Tensor, got {type(t).__name__}")
            nbytes = t.nbytes
            if not enabled:
                reason = "disabled"
            elif not t.is_cpu:
                reason = "not_cpu"
            elif nbytes < min_bytes:
                reason = "below_min_bytes"
            elif t.dtype in excluded:
                reason = "excluded_dtype"
            else:
                if not acquired:  # step 1, at the first eligible tensor
                    codec, acquired = provider.acquire_encoder(), True
                if codec is not None:
                    entries.append(_compress_one(t, nbytes, codec, pool, i))
                    continue
                reason = "codec_busy"
            entries.append(WireEntry(CODEC_RAW, nbytes, nbytes, t, reason))
    except BaseException:
        CompressionPlan(entries).release_all()
        raise
    finally:
        if codec is not None:
            provider.release(codec)
    return CompressionPlan(entries)


def _compress_one(
    t: torch.Tensor, nbytes: int, codec: TensorCodec, pool: TensorBufferPool, index: int
) -> WireEntry:
    tensor_bytes(t, f"tensors[{index}]")
    bound = codec.max_compressed_size(nbytes)
    if bound is None:
        return _raw(t, nbytes, "unsupported_size")
    lease = pool.acquire(bound)
    if lease is None:
        return _raw(t, nbytes, "no_buffer")
    buffer = lease.buffer
    try:
        # Arguments are checked above and the pool's buffers are uint8 and contiguous.
        written = codec._compress(t, nbytes, buffer, lease.capacity)
    except BaseException:
        lease.discard()
        raise
    if written >= nbytes:
        lease.discard()
        return _raw(t, nbytes, "not_smaller")
    return WireEntry(codec.codec_id, nbytes, written, buffer[:written], "", lease)


def decompress_into_tensor(
    codec_id: int,
    src: torch.Tensor,
    dst: torch.Tensor,
    provider: TensorCodecProvider,
    *,
    timeout: float | None,
) -> None:
    """Decode one received payload straight into its preallocated target.

    Acquires the provider's decoder (waiting up to ``timeout``), decompresses ``src``
    into ``dst``'s memory, and releases the decoder at once. ``codec_id`` 0 (raw)
    copies the bytes of ``src`` (any dtype) without a codec.

    Args:
        codec_id: the payload's wire codec id (0 raw, 1 lz4, 2 zstd).
        src: the received payload, a contiguous CPU ``torch.uint8`` tensor (any dtype
            when raw).
        dst: the contiguous CPU target tensor with the sender's dtype and shape.
        provider: the process's codec provider.
        timeout: seconds to wait for a decoder; None waits without limit.

    Raises:
        TypeError: ``src`` or ``dst`` is not a tensor.
        ValueError: a tensor is not contiguous/dense CPU, or a compressed ``src`` is not
            uint8.
        CompressionError: ``codec_id`` is unknown or not the provider's codec, a raw
            payload's size differs from ``dst``'s, or the payload is corrupt or truncated.
        CompressionTimeoutError: no decoder became free within ``timeout``.

    Example:
        >>> from p2p_compress import Lz4CodecConfig, TensorBufferPool, TensorCodecProvider
        >>> cfg = TensorCompressionConfig(Lz4CodecConfig(), min_bytes=0, excluded_dtypes=())
        >>> provider, pool = TensorCodecProvider(cfg), TensorBufferPool(1 << 20)
        >>> x = torch.zeros(1000)
        >>> with plan_compression([x], cfg, provider, pool) as plan:
        ...     e = plan.entries[0]
        ...     out = torch.empty_like(x)
        ...     decompress_into_tensor(e.codec_id, e.payload, out, provider, timeout=5.0)
        >>> bool(torch.equal(out, x))
        True
    """
    nbytes = tensor_bytes(dst, "dst")
    if codec_id == CODEC_RAW:
        wire = tensor_bytes(src, "src")
        if wire != nbytes:
            raise CompressionError(f"raw payload holds {wire} bytes, the target holds {nbytes}")
        if nbytes:
            ctypes.memmove(dst.data_ptr(), src.data_ptr(), nbytes)
        return
    wire = uint8_buffer_bytes(src, "src")
    if codec_id != provider.codec_id:
        name = CODEC_NAMES.get(codec_id, f"unknown codec id {codec_id}")
        raise CompressionError(
            f"payload uses {name} (codec id {codec_id}) but this process is configured for "
            f"{provider.codec_name} (codec id {provider.codec_id})"
        )
    codec = provider.acquire_decoder(timeout=timeout)
    try:
        codec._decompress(src, wire, dst, nbytes)  # arguments checked above
    finally:
        provider.release(codec)
