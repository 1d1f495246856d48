"""Standalone use: compress a tensor, a list or a dict of tensors into pooled buffers and back."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, TypeAlias

import torch

from p2p_compress._config import (
    CodecConfig,
    Lz4CodecConfig,
    SparseCodecConfig,
    TensorCompressionConfig,
    ZstdCodecConfig,
)
from p2p_compress._plan import CompressionPlan, decompress_into_tensor, plan_compression
from p2p_compress._pool import TensorBufferPool
from p2p_compress._provider import TensorCodecProvider

Tensors: TypeAlias = torch.Tensor | Sequence[torch.Tensor] | Mapping[str, torch.Tensor]
CodecChoice: TypeAlias = str | CodecConfig | TensorCompressionConfig

_lock = threading.Lock()
_pool: TensorBufferPool | None = None
_providers: dict[CodecConfig, TensorCodecProvider] = {}


def default_buffer_pool() -> TensorBufferPool:
    """Return the process-wide pool (2 GiB budget) used when no pool is passed."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = TensorBufferPool()
        return _pool


def default_codec_provider(
    codec: CodecConfig | TensorCompressionConfig,
) -> TensorCodecProvider:
    """Return the process-wide provider for a codec config, creating it at first use."""
    key = codec.codec if isinstance(codec, TensorCompressionConfig) else codec
    with _lock:
        provider = _providers.get(key)
        if provider is None:
            provider = _providers[key] = TensorCodecProvider(key)
        return provider


@dataclass(frozen=True)
class CompressedTensor:
    """One tensor of a :class:`CompressedTensors`.

    Attributes:
        dtype: the original dtype.
        shape: the original shape.
        codec_id: 0 raw, 1 lz4, 2 zstd, 3 sparse.
        raw_bytes: the original byte count.
        wire_bytes: the payload's byte count.
        payload: a ``torch.uint8`` view of the pooled buffer when compressed; the
            original tensor (not a copy) when raw.
        reason: why it stayed raw, "" when compressed.
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    codec_id: int
    raw_bytes: int
    wire_bytes: int
    payload: torch.Tensor
    reason: str


class CompressedTensors:
    """Compressed tensors in pooled buffers, remembering the container they came from.

    Call :meth:`release` (or leave a ``with`` block) to return the buffers to the pool;
    after that the compressed payloads may be reused and can no longer be decoded.

    Attributes:
        kind: ``"tensor"``, ``"list"``, ``"tuple"`` or ``"dict"``.
        keys: the dict's keys in order (``kind == "dict"``), else None.
        items: one :class:`CompressedTensor` per input tensor, in order.
        provider: the provider that compressed them (and decodes them).
    """

    def __init__(
        self,
        kind: Literal["tensor", "list", "tuple", "dict"],
        keys: tuple[str, ...] | None,
        items: tuple[CompressedTensor, ...],
        plan: CompressionPlan,
        provider: TensorCodecProvider,
    ) -> None:
        self.kind = kind
        self.keys = keys
        self.items = items
        self.provider = provider
        self._plan = plan
        self._released = False

    @property
    def codec_name(self) -> str:
        """The provider's codec name."""
        return self.provider.codec_name

    @property
    def raw_bytes(self) -> int:
        """Total original bytes."""
        return sum(i.raw_bytes for i in self.items)

    @property
    def wire_bytes(self) -> int:
        """Total payload bytes."""
        return sum(i.wire_bytes for i in self.items)

    @property
    def ratio(self) -> float:
        """``raw_bytes / wire_bytes`` (1.0 when empty)."""
        return self.raw_bytes / self.wire_bytes if self.wire_bytes else 1.0

    @property
    def released(self) -> bool:
        """True once :meth:`release` ran."""
        return self._released

    def release(self) -> None:
        """Return the pooled buffers (idempotent)."""
        self._released = True
        self._plan.release_all()

    def decompress(
        self, *, out: Tensors | None = None, timeout: float | None = None
    ) -> torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...] | dict[str, torch.Tensor]:
        """Same as :func:`decompress_tensors` on this object."""
        return decompress_tensors(self, out=out, timeout=timeout)

    def __len__(self) -> int:
        return len(self.items)

    def __enter__(self) -> CompressedTensors:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return (
            f"<CompressedTensors {self.kind} of {len(self.items)} {self.codec_name} "
            f"{self.raw_bytes} -> {self.wire_bytes} bytes>"
        )


def _flatten(
    tensors: Tensors,
) -> tuple[Literal["tensor", "list", "tuple", "dict"], tuple[str, ...] | None, list[torch.Tensor]]:
    if isinstance(tensors, torch.Tensor):
        return "tensor", None, [tensors]
    if isinstance(tensors, Mapping):
        keys = tuple(tensors)
        for k in keys:
            if not isinstance(k, str):
                raise TypeError(f"tensors keys must be strings, got {k!r}")
        return "dict", keys, [tensors[k] for k in keys]
    if isinstance(tensors, (list, tuple)):
        return ("tuple" if isinstance(tensors, tuple) else "list"), None, list(tensors)
    raise TypeError(
        "tensors must be a tensor, a list or tuple of tensors or a dict of tensors, "
        f"got {type(tensors).__name__}"
    )


def _resolve_config(
    codec: CodecChoice | None, provider: TensorCodecProvider | None
) -> TensorCompressionConfig:
    if isinstance(codec, TensorCompressionConfig):
        return codec
    if codec is None:
        choice: CodecConfig = provider.codec_config if provider is not None else Lz4CodecConfig()
    elif isinstance(codec, (Lz4CodecConfig, ZstdCodecConfig, SparseCodecConfig)):
        choice = codec
    elif codec == "lz4":
        choice = Lz4CodecConfig()
    elif codec == "zstd":
        choice = ZstdCodecConfig()
    elif codec == "sparse":
        choice = SparseCodecConfig()
    else:
        raise ValueError(
            "codec must be 'lz4', 'zstd', 'sparse', a codec config or a TensorCompressionConfig, "
            f"got {codec!r}"
        )
    return TensorCompressionConfig(codec=choice, min_bytes=0, excluded_dtypes=())


def compress_tensors(
    tensors: Tensors,
    codec: CodecChoice | None = None,
    *,
    provider: TensorCodecProvider | None = None,
    pool: TensorBufferPool | None = None,
) -> CompressedTensors:
    """Compress a tensor, a list/tuple or a dict of tensors into pooled buffers.

    With a codec name or codec config every CPU tensor is tried and kept compressed when
    that makes it smaller; a :class:`TensorCompressionConfig` applies its ``min_bytes``
    and ``excluded_dtypes`` too. Tensors that stay raw (accelerator tensors, ones that do
    not shrink, no free zstd context, pool budget exhausted) are referenced, not copied;
    ``items[i].reason`` says why.

    Args:
        tensors: a tensor, a list or tuple of tensors, or a dict of str to tensor. CPU
            tensors must be contiguous.
        codec: ``"lz4"``, ``"zstd"``, ``"sparse"``, a codec config, or a full compression
            config.
            Default: the provider's codec, else lz4.
        provider: the codec provider; default: a process-wide one per codec config.
        pool: the buffer pool; default: :func:`default_buffer_pool`.

    Returns:
        The compressed tensors; release them when done.

    Raises:
        TypeError: ``tensors`` is not one of the accepted containers of tensors.
        ValueError: a CPU tensor is not contiguous, ``codec`` is unknown, or it differs
            from ``provider``'s codec.
        CompressionError: the codec library failed.

    Example:
        >>> batch = {"ids": torch.zeros(4096, dtype=torch.int64), "mask": torch.ones(4096) > 0}
        >>> with compress_tensors(batch, "zstd") as packed:
        ...     restored = packed.decompress()
        ...     packed.wire_bytes < packed.raw_bytes
        True
        >>> all(torch.equal(restored[k], batch[k]) for k in batch)
        True
    """
    kind, keys, flat = _flatten(tensors)
    config = _resolve_config(codec, provider)
    if provider is None:
        provider = default_codec_provider(config)
    plan = plan_compression(flat, config, provider, pool or default_buffer_pool())
    items = tuple(
        CompressedTensor(
            t.dtype, tuple(t.shape), e.codec_id, e.raw_bytes, e.wire_bytes, e.payload, e.reason
        )
        for t, e in zip(flat, plan.entries, strict=True)
    )
    return CompressedTensors(kind, keys, items, plan, provider)


def _targets(compressed: CompressedTensors, out: Tensors | None) -> list[torch.Tensor | None]:
    if out is None:
        return [None] * len(compressed.items)
    kind, keys, flat = _flatten(out)
    if kind != compressed.kind and {kind, compressed.kind} != {"list", "tuple"}:
        raise ValueError(
            f"out is a {kind} but the compressed tensors came from a {compressed.kind}"
        )
    if keys != compressed.keys or len(flat) != len(compressed.items):
        raise ValueError(
            f"out holds {keys or len(flat)} but the compressed tensors hold "
            f"{compressed.keys or len(compressed.items)}"
        )
    for i, (t, item) in enumerate(zip(flat, compressed.items, strict=True)):
        if t.dtype != item.dtype or tuple(t.shape) != item.shape:
            raise ValueError(
                f"out[{keys[i] if keys else i}] has dtype {t.dtype} shape {tuple(t.shape)}; "
                f"expected dtype {item.dtype} shape {item.shape}"
            )
    return list(flat)


def decompress_tensors(
    compressed: CompressedTensors, *, out: Tensors | None = None, timeout: float | None = None
) -> torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, ...] | dict[str, torch.Tensor]:
    """Restore the tensors of :func:`compress_tensors`, in their original container.

    Args:
        compressed: the result of :func:`compress_tensors`, not yet released.
        out: optional targets with the same structure, dtypes and shapes (compressed
            entries need contiguous CPU targets); they are filled and returned.
        timeout: seconds to wait for a zstd decoder; None waits without limit.

    Returns:
        New tensors (or ``out``): a tensor, list, tuple or dict like the input. Raw
        entries are copied, so nothing aliases the original tensors or the pool.

    Raises:
        ValueError: ``compressed`` was released, or ``out`` does not match.
        CompressionError: a payload is corrupt.
        CompressionTimeoutError: no decoder became free within ``timeout``.

    Example:
        >>> packed = compress_tensors([torch.zeros(100), torch.arange(10)], "lz4")
        >>> [t.shape[0] for t in decompress_tensors(packed)]
        [100, 10]
        >>> packed.release()
    """
    if not isinstance(compressed, CompressedTensors):
        raise TypeError(f"compressed must be CompressedTensors, got {type(compressed).__name__}")
    if compressed.released:
        raise ValueError("compressed was released; its buffers may already hold other data")
    targets = _targets(compressed, out)
    results: list[torch.Tensor] = []
    for item, target in zip(compressed.items, targets, strict=True):
        if item.codec_id == 0:
            dst = item.payload.clone() if target is None else target.copy_(item.payload)
        else:
            dst = torch.empty(item.shape, dtype=item.dtype) if target is None else target
            decompress_into_tensor(
                item.codec_id, item.payload, dst, compressed.provider, timeout=timeout
            )
        results.append(dst)
    if compressed.kind == "tensor":
        return results[0]
    if compressed.kind == "dict":
        assert compressed.keys is not None
        return dict(zip(compressed.keys, results, strict=True))
    return tuple(results) if compressed.kind == "tuple" else results
