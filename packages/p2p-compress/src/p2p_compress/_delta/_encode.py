"""encode_delta: choose a patch's kind and build it (``_apply`` applies it)."""

from __future__ import annotations

from typing import Final

import numpy as np
import torch

from p2p_compress._codecs._memory import tensor_bytes
from p2p_compress._config import ZSTD_MAX_LEVEL
from p2p_compress._delta import _dense, _sparse
from p2p_compress._delta._patch import (
    DELTA_CODECS,
    FLAG_PLANES,
    HEADER_SIZE,
    KIND_FULL,
    KIND_SPARSE,
    KIND_XOR,
    DeltaPatch,
    check_itemsize,
)
from p2p_compress._delta._streams import as_numpy, scratch, seal
from p2p_compress._pool import TensorBufferPool

DELTA_PREFERENCES: Final = ("smallest", "fast", "full")
"""The values of ``encode_delta(prefer=...)``."""

# The changed fractions that steer the choice (see encode_delta's docstring).
SPARSE_MAX: Final = 0.5
FAST_SPARSE_MAX: Final = 0.3


def _check_new_base(new: object, base: object) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    tensor_bytes(new, "new")
    assert isinstance(new, torch.Tensor)
    itemsize = check_itemsize(new.dtype, "new")
    if base is None:
        return new, None, itemsize
    tensor_bytes(base, "base")
    assert isinstance(base, torch.Tensor)
    if base.dtype != new.dtype or base.numel() != new.numel():
        raise ValueError(
            f"base (dtype {base.dtype}, numel {base.numel()}) must match new (dtype "
            f"{new.dtype}, numel {new.numel()})"
        )
    return new, base, itemsize


def _check_options(codec: object, level: object, prefer: object) -> None:
    if codec not in DELTA_CODECS:
        raise ValueError(f"codec must be one of {list(DELTA_CODECS)}, got {codec!r}")
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= ZSTD_MAX_LEVEL:
        raise ValueError(f"level must be an integer from 1 to {ZSTD_MAX_LEVEL}, got {level!r}")
    if prefer not in DELTA_PREFERENCES:
        raise ValueError(f"prefer must be one of {list(DELTA_PREFERENCES)}, got {prefer!r}")


class _Encoder:
    """One encode_delta call: the inputs as numpy views, and the candidates it builds."""

    def __init__(
        self,
        new: torch.Tensor,
        itemsize: int,
        codec: str,
        level: int,
        pool: TensorBufferPool | None,
    ) -> None:
        self.dtype = new.dtype
        self.numel = int(new.numel())
        self.itemsize = itemsize
        self.new = as_numpy(new, itemsize)
        self.codec = codec
        self.level = level
        self.pool = pool

    def _seal(self, kind: str, changed: int, body: torch.Tensor, planes: bool) -> DeltaPatch:
        flags = FLAG_PLANES if planes else 0
        used, payload = seal(
            kind,
            self.codec,
            self.level,
            self.itemsize,
            flags,
            self.numel,
            changed,
            body,
            self.pool,
        )
        return DeltaPatch(kind, self.dtype, self.numel, changed, used, payload)

    def full(self, changed: int) -> DeltaPatch:
        planes = _dense.planar(self.itemsize, self.codec)
        with scratch(self.pool, self.numel * self.itemsize) as body:
            _dense.write_full(self.new, body, planes)
            return self._seal(KIND_FULL, changed, body, planes)

    def xor(self, base: np.ndarray, changed: int) -> DeltaPatch:
        planes = _dense.planar(self.itemsize, self.codec)
        with scratch(self.pool, self.numel * self.itemsize) as body:
            _dense.write_xor(self.new, base, body, planes)
            return self._seal(KIND_XOR, changed, body, planes)

    def sparse(self, idx: np.ndarray, diff: np.ndarray, gaps: np.ndarray) -> DeltaPatch:
        nbig = int(np.count_nonzero(gaps >= 255))
        size = _sparse.body_size(self.itemsize, int(idx.size), nbig, self.numel)
        with scratch(self.pool, size) as body:
            _sparse.write_body(diff, gaps, body)
            return self._seal(KIND_SPARSE, int(idx.size), body, False)


def encode_delta(
    new: torch.Tensor,
    base: torch.Tensor | None,
    *,
    codec: str = "zstd",
    level: int = 1,
    prefer: str = "smallest",
    pool: TensorBufferPool | None = None,
) -> DeltaPatch:
    """Encode the patch that turns ``base`` into ``new``, bit for bit.

    Both tensors are read as flat arrays of ``dtype.itemsize``-byte integers, so every
    dtype of 1, 2, 4 or 8 bytes works and NaN payloads, signed zeros and infinities
    travel exactly. Neither input is modified or aliased by the patch.

    The kind is chosen per call from ``c``, the number of changed elements, of ``n``:

    * ``base`` None, or ``prefer="full"``: ``full``.
    * ``c == 0``: ``sparse`` with an empty body (a 40-byte payload).
    * ``codec="raw"``: ``sparse`` when at most half changed and its exact size,
      ``(itemsize + 1) * c`` bytes plus 4 per gap of 255 elements or more, is below the
      full ``n * itemsize``; else ``full``.
    * ``prefer="smallest"``: with ``f = c / n`` changed, ``sparse`` when ``f <= 1/2``
      (one encode); above, both ``xor`` and ``full`` are built and the smaller kept
      (xor on a tie). Measured on bf16 and fp32 tensors whose changed values moved by
      one or two ulps or to random values, sparse was the smallest form up to 60-80%
      changed, 1.3-2.2 times smaller than xor at 5-50%; above 1/2 it is not tried
      because its position list would take 8 bytes per change while encoding.
    * ``prefer="fast"``: one encode, from ``f`` alone: ``sparse`` when ``f <= 0.3``,
      else ``xor``. Sparse coding costs grow with the changes and pass those of the
      dense xor near 0.3 changed (bf16, one core: at 1/2 changed xor encodes 1.5 times
      and decodes 1.6 times faster, for a payload 1.45 times larger); below 0.3 sparse
      is both smaller and cheaper.

    A payload that does not shrink under ``codec`` is stored raw (``patch.codec ==
    "raw"``), and no patch is larger than the full raw bytes plus the 40-byte header.

    Args:
        new: the new values: a contiguous CPU tensor of any shape (read flat).
        base: what the receiver holds now (same dtype and numel as ``new``), or None
            for a full patch.
        codec: what compresses the body: ``"zstd"`` (default), ``"lz4"`` or ``"raw"``.
        level: the zstd level, 1 to 22 (checked for every codec, used by zstd).
        prefer: ``"smallest"`` (default), ``"fast"`` or ``"full"``, as above.
        pool: where scratch buffers come from (returned before the call ends); None
            allocates them. The payload is always a fresh tensor of its exact size.

    Returns:
        The patch.

    Raises:
        TypeError: ``new`` or ``base`` is not a tensor.
        ValueError: a tensor is not a contiguous dense CPU tensor, its elements are not
            1, 2, 4 or 8 bytes, ``base`` differs from ``new`` in dtype or numel, or
            ``codec``, ``level`` or ``prefer`` is not allowed; each message names the
            argument.
        CompressionError: the codec library failed.

    Example:
        >>> base = torch.zeros(4096, dtype=torch.bfloat16)
        >>> new = base.clone()
        >>> new[::100] = 1.0
        >>> patch = encode_delta(new, base)
        >>> patch.kind, patch.changed, patch.wire_nbytes < new.nbytes // 20
        ('sparse', 41, True)
        >>> apply_delta(patch, base)
        >>> bool(torch.equal(base, new))
        True
    """
    new, base, itemsize = _check_new_base(new, base)
    _check_options(codec, level, prefer)
    enc = _Encoder(new, itemsize, codec, level, pool)
    n = enc.numel
    if base is None:
        return enc.full(n)
    old = as_numpy(base, itemsize)
    if prefer == "full":
        return enc.full(_sparse.scan(enc.new, old, -1)[0])
    if codec == "raw":  # sparse must also be smaller than the full bytes: checked below
        most = min(SPARSE_MAX, itemsize / (itemsize + 1))
    else:
        most = FAST_SPARSE_MAX if prefer == "fast" else SPARSE_MAX
    c, found = _sparse.scan(enc.new, old, int(most * n))
    if found is not None:
        idx, diff = found
        gaps = _sparse.gaps_of(idx)
        if codec != "raw":
            return _no_larger(enc.sparse(idx, diff, gaps), enc, c)
        nbig = int(np.count_nonzero(gaps >= 255))
        if _sparse.body_size(itemsize, c, nbig, n) < n * itemsize:
            return enc.sparse(idx, diff, gaps)
    if codec == "raw":
        return enc.full(c)
    best = enc.xor(old, c)
    if prefer == "smallest":
        full = enc.full(c)
        if full.wire_nbytes < best.wire_nbytes:
            best = full
    return _no_larger(best, enc, c)


def _no_larger(patch: DeltaPatch, enc: _Encoder, changed: int) -> DeltaPatch:
    """The patch, or a raw full one when that is smaller."""
    if patch.wire_nbytes <= HEADER_SIZE + enc.numel * enc.itemsize:
        return patch
    enc.codec = "raw"
    return enc.full(changed)
