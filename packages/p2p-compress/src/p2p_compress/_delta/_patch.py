"""DeltaPatch: what travels for one tensor, its small metadata, and the payload header.

A payload starts with a fixed 40-byte header that repeats the patch's kind, codec,
element size, element count and changed count, so a payload paired with the wrong
metadata is refused (:class:`CompressionError`) instead of being applied. All integers
little-endian::

    magic    4s  b"P2DL"
    version  u8  1
    kind     u8  0 full, 1 sparse, 2 xor
    codec    u8  0 raw, 1 lz4, 2 zstd (what compressed the body)
    itemsize u8  bytes per element: 1, 2, 4 or 8
    flags    u8  bit 0: a dense body is in byte planes; other bits 0
    pad      7x
    numel    u64 elements of the patched tensor
    changed  u64 elements whose bits differ from the base
    body     u64 the body's length before compression

then the body, compressed by ``codec`` (stored as it is for ``raw``).
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import torch

from p2p_compress._dtypes import dtype_from_name, dtype_name
from p2p_compress._errors import CompressionError

KIND_FULL: Final = "full"
KIND_SPARSE: Final = "sparse"
KIND_XOR: Final = "xor"
DELTA_KINDS: Final = (KIND_FULL, KIND_SPARSE, KIND_XOR)
"""The patch kinds, in the order their wire ids count (0, 1, 2)."""
DELTA_CODECS: Final = ("raw", "lz4", "zstd")
"""What may compress a patch's body, in the order their wire ids count (0, 1, 2)."""
DELTA_ITEMSIZES: Final = (1, 2, 4, 8)
"""Element sizes (bytes) a patch works on; the dtype only names how to read the bits."""

MAGIC: Final = b"P2DL"
VERSION: Final = 1
HEADER: Final = struct.Struct("<4sBBBBB7xQQQ")
HEADER_SIZE: Final = HEADER.size  # 40
FLAG_PLANES: Final = 1

_META_KEYS: Final = ("kind", "dtype", "numel", "changed", "codec", "wire_nbytes")


def check_itemsize(dtype: torch.dtype, name: str) -> int:
    """Return ``dtype``'s element size, refusing one a patch cannot carry.

    Raises:
        ValueError: the element size is not 1, 2, 4 or 8 bytes (complex128 is 16).
    """
    size = int(dtype.itemsize)
    if size not in DELTA_ITEMSIZES:
        raise ValueError(
            f"{name} has dtype {dtype} of {size}-byte elements; weight deltas take elements "
            f"of {', '.join(map(str, DELTA_ITEMSIZES))} bytes"
        )
    return size


@dataclass(frozen=True)
class DeltaPatch:
    """The bytes that turn a base tensor into a new one, bit for bit.

    Made by :func:`encode_delta`, applied by :func:`apply_delta`. The payload is a flat
    ``torch.uint8`` tensor that owns its memory (it aliases no input and no pooled
    buffer); :meth:`meta` is everything else, small and picklable, for sending beside it.

    Attributes:
        kind: ``"full"`` (the payload holds the new values), ``"sparse"`` (positions of the
            changed values and their bit differences) or ``"xor"`` (the dense bitwise XOR
            of new and base).
        dtype: the dtype of the tensor the patch applies to.
        numel: its element count.
        changed: elements whose bits differ from the base (``numel`` for a full patch made
            without a base).
        codec: what compressed the payload's body: ``"zstd"``, ``"lz4"`` or ``"raw"``.
        payload: a 1-D contiguous CPU ``torch.uint8`` tensor: the bytes that travel.

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field's value is not allowed (the message names the field).

    Example:
        >>> new = torch.arange(8, dtype=torch.float32)
        >>> patch = encode_delta(new, None)
        >>> patch.kind, patch.numel, patch.changed
        ('full', 8, 8)
        >>> again = DeltaPatch.from_meta(patch.meta(), patch.payload)
        >>> again == patch
        True
    """

    kind: str
    dtype: torch.dtype
    numel: int
    changed: int
    codec: str
    payload: torch.Tensor

    def __post_init__(self) -> None:
        if self.kind not in DELTA_KINDS:
            raise ValueError(f"kind must be one of {list(DELTA_KINDS)}, got {self.kind!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise TypeError(f"dtype must be a torch.dtype, got {type(self.dtype).__name__}")
        check_itemsize(self.dtype, "the patch")
        for name in ("numel", "changed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.changed > self.numel:
            raise ValueError(f"changed ({self.changed}) must not exceed numel ({self.numel})")
        if self.codec not in DELTA_CODECS:
            raise ValueError(f"codec must be one of {list(DELTA_CODECS)}, got {self.codec!r}")
        p = self.payload
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"payload must be a torch.Tensor, got {type(p).__name__}")
        if p.dtype != torch.uint8 or p.dim() != 1 or not p.is_contiguous() or not p.is_cpu:
            raise ValueError(
                f"payload must be a 1-D contiguous CPU torch.uint8 tensor, got dtype {p.dtype}, "
                f"shape {tuple(p.shape)}, device {p.device}"
            )

    @property
    def wire_nbytes(self) -> int:
        """The payload's length in bytes (header included)."""
        return int(self.payload.numel())

    def meta(self) -> dict[str, int | str]:
        """Everything but the payload, as a small picklable dict.

        Returns:
            ``kind``, ``dtype`` (its name, e.g. ``"bfloat16"``), ``numel``, ``changed``,
            ``codec`` and ``wire_nbytes`` (the payload's length, so a receiver can size
            its buffer before the payload arrives).

        Example:
            >>> patch = encode_delta(torch.zeros(4, dtype=torch.bfloat16), None, codec="raw")
            >>> patch.meta()["dtype"], patch.meta()["wire_nbytes"]
            ('bfloat16', 48)
        """
        return {
            "kind": self.kind,
            "dtype": dtype_name(self.dtype),
            "numel": self.numel,
            "changed": self.changed,
            "codec": self.codec,
            "wire_nbytes": self.wire_nbytes,
        }

    @classmethod
    def from_meta(cls, meta: Mapping[str, object], payload: torch.Tensor) -> DeltaPatch:
        """Rebuild a patch from :meth:`meta` and the received payload.

        Args:
            meta: the dict :meth:`meta` returned (``wire_nbytes`` may be left out).
            payload: the received bytes: a 1-D contiguous CPU ``torch.uint8`` tensor.

        Returns:
            The patch; its payload is ``payload`` itself (not copied).

        Raises:
            TypeError: ``meta`` is not a mapping, or ``payload`` is not a tensor.
            ValueError: a key is missing, unknown or has a value that is not allowed (the
                message names the key), or the payload's length differs from
                ``meta["wire_nbytes"]``.
        """
        if not isinstance(meta, Mapping):
            raise TypeError(f"meta must be a mapping, got {type(meta).__name__}")
        unknown = sorted(str(k) for k in meta if k not in _META_KEYS)
        if unknown:
            raise ValueError(f"meta has unknown keys {unknown}; allowed: {list(_META_KEYS)}")
        for key in _META_KEYS[:-1]:
            if key not in meta:
                raise ValueError(f"meta lacks the key {key!r}")
        ints: dict[str, int] = {}
        for key in ("numel", "changed", "wire_nbytes"):
            if key not in meta:
                continue
            value = meta[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"meta[{key!r}] must be an integer >= 0, got {value!r}")
            ints[key] = value
        for key, allowed in (("kind", DELTA_KINDS), ("codec", DELTA_CODECS)):
            if meta[key] not in allowed:
                raise ValueError(f"meta[{key!r}] must be one of {list(allowed)}, got {meta[key]!r}")
        dtype = dtype_from_name(meta["dtype"])
        if dtype is None:
            raise ValueError(f"meta['dtype'] names no torch dtype: {meta['dtype']!r}")
        if int(dtype.itemsize) not in DELTA_ITEMSIZES:
            raise ValueError(
                f"meta['dtype'] is {dtype}, of {dtype.itemsize}-byte elements; allowed: "
                f"{list(DELTA_ITEMSIZES)}"
            )
        if ints["changed"] > ints["numel"]:
            raise ValueError(
                f"meta['changed'] ({ints['changed']}) exceeds meta['numel'] ({ints['numel']})"
            )
        if not isinstance(payload, torch.Tensor):
            raise TypeError(f"payload must be a torch.Tensor, got {type(payload).__name__}")
        if "wire_nbytes" in ints and ints["wire_nbytes"] != payload.numel():
            raise ValueError(
                f"payload holds {payload.numel()} bytes, meta['wire_nbytes'] says "
                f"{ints['wire_nbytes']}"
            )
        return cls(
            kind=str(meta["kind"]),
            dtype=dtype,
            numel=ints["numel"],
            changed=ints["changed"],
            codec=str(meta["codec"]),
            payload=payload,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeltaPatch):
            return NotImplemented
        return self.meta() == other.meta() and bool(torch.equal(self.payload, other.payload))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"DeltaPatch(kind={self.kind!r}, dtype={self.dtype}, numel={self.numel}, "
            f"changed={self.changed}, codec={self.codec!r}, wire_nbytes={self.wire_nbytes})"
        )


def pack_header(
    kind: str, codec: str, itemsize: int, flags: int, numel: int, changed: int, body: int
) -> bytes:
    """The 40-byte payload header."""
    return HEADER.pack(
        MAGIC,
        VERSION,
        DELTA_KINDS.index(kind),
        DELTA_CODECS.index(codec),
        itemsize,
        flags,
        numel,
        changed,
        body,
    )


def read_header(patch: DeltaPatch) -> tuple[int, int]:
    """Check the payload's header against the patch; return its flags and the body's length.

    Raises:
        CompressionError: the payload is shorter than a header, its magic or version is
            wrong, or it describes another patch than the metadata does.
    """
    p = patch.payload
    size = int(p.numel())
    if size < HEADER_SIZE:
        raise CompressionError(
            f"corrupt delta payload: {size} bytes, shorter than the {HEADER_SIZE}-byte header"
        )
    head = bytes(p[:HEADER_SIZE].numpy())
    magic, version, kind, codec, itemsize, flags, numel, changed, body = HEADER.unpack(head)
    if magic != MAGIC or version != VERSION:
        raise CompressionError(
            f"corrupt delta payload: header starts {head[:5].hex()}, expected magic {MAGIC!r} "
            f"version {VERSION}"
        )
    got = (kind, codec, itemsize, numel, changed)
    want = (
        DELTA_KINDS.index(patch.kind),
        DELTA_CODECS.index(patch.codec),
        int(patch.dtype.itemsize),
        patch.numel,
        patch.changed,
    )
    if got != want:
        raise CompressionError(
            "delta payload does not match its metadata: header (kind, codec, itemsize, numel, "
            f"changed) = {got}, metadata {want}"
        )
    if flags & ~FLAG_PLANES or (flags and (kind == 1 or itemsize == 1)):
        raise CompressionError(f"corrupt delta payload: flags {flags:#x} for this kind")
    return int(flags), int(body)
