"""Byte shuffle: the bytes of fixed-size elements regrouped by their position in the element.

Numbers whose high bytes are mostly equal (token ids below 65536 stored as int64, small
integers, float exponents) hide that regularity from a byte-oriented compressor: lz4
finds no match of four bytes or more in ``[id_lo, id_hi, 0, 0, 0, 0, 0, 0]`` repeated.
Regrouping the bytes into planes (every element's byte 0, then every byte 1, ...) puts
the zero bytes next to each other, where lz4 takes them as one long match: on uniform
token ids in ``[0, 50257)`` lz4's ratio goes from 1.98x to 3.94x, and lz4 runs faster,
since most of its input is then one run.

It does not pay where whole elements repeat (runs of equal float32: lz4 18x plain, 6x
shuffled), so :func:`shuffle_itemsize` judges a tensor by lz4 on a 16 KiB sample, both
ways.

The transform is its own bookkeeping: only the first ``len // itemsize * itemsize``
bytes are regrouped, a tail shorter than one element is copied as it is, so any byte
range (a chunk that starts or ends inside an element) round-trips exactly.
"""

from __future__ import annotations

import threading
from typing import Final

import torch

from p2p_compress._codecs._lz4 import Lz4Codec
from p2p_compress._codecs._planes import from_planes, to_planes

SHUFFLE_ITEMSIZES: Final = (2, 4, 8)
"""Element sizes (bytes) the shuffle regroups; 1-byte data has nothing to regroup."""
SHUFFLE_SAMPLE_BYTES: Final = 16 * 1024
"""The bytes at a tensor's start that :func:`shuffle_itemsize` compresses both ways."""
SHUFFLE_GAIN: Final = 1.25
"""Shuffled, the sample must shrink this many times more than plain to be shuffled."""

_local = threading.local()


def _check(src: torch.Tensor, dst: torch.Tensor, itemsize: int) -> int:
    for name, t in (("src", src), ("dst", dst)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if (
            t.dtype != torch.uint8
            or t.dim() != 1
            or not t.is_contiguous()
            or t.device.type != "cpu"
        ):
            raise ValueError(f"{name} must be a flat contiguous CPU uint8 tensor, got {t.dtype}")
    if itemsize not in SHUFFLE_ITEMSIZES:
        raise ValueError(f"itemsize must be one of {list(SHUFFLE_ITEMSIZES)}, got {itemsize!r}")
    n = int(src.numel())
    if int(dst.numel()) < n:
        raise ValueError(f"dst holds {int(dst.numel())} bytes, src has {n}")
    return n


def shuffle_bytes(src: torch.Tensor, dst: torch.Tensor, itemsize: int) -> None:
    """Write ``src``'s bytes regrouped by byte position in elements of ``itemsize`` to ``dst``.

    Args:
        src: A flat contiguous CPU ``torch.uint8`` tensor (any length).
        dst: A flat contiguous CPU ``torch.uint8`` tensor of at least ``src``'s length;
            its first ``len(src)`` bytes are written.
        itemsize: The element size in bytes, one of :data:`SHUFFLE_ITEMSIZES`.

    Raises:
        TypeError: ``src`` or ``dst`` is not a tensor.
        ValueError: A tensor is not flat contiguous CPU uint8, ``dst`` is too short, or
            ``itemsize`` is not allowed.

    Example:
        >>> src = torch.tensor([1, 2], dtype=torch.int16).view(torch.uint8)
        >>> dst = torch.empty(4, dtype=torch.uint8)
        >>> shuffle_bytes(src, dst, 2)
        >>> dst.tolist()
        [1, 2, 0, 0]
    """
    n = _check(src, dst, itemsize)
    body = n // itemsize * itemsize
    if body:
        to_planes(src[:body].numpy(), dst[:body].numpy().reshape(itemsize, -1))
    if body < n:
        dst[body:n].copy_(src[body:n])


def unshuffle_bytes(src: torch.Tensor, dst: torch.Tensor, itemsize: int) -> None:
    """Undo :func:`shuffle_bytes`: write ``src``'s planes back as elements into ``dst``.

    Args:
        src: The shuffled bytes (flat contiguous CPU ``torch.uint8``).
        dst: A flat contiguous CPU ``torch.uint8`` tensor of at least ``src``'s length.
        itemsize: The element size ``src`` was shuffled with.

    Raises:
        TypeError: ``src`` or ``dst`` is not a tensor.
        ValueError: As :func:`shuffle_bytes`.

    Example:
        >>> src = torch.tensor([1, 2, 0, 0], dtype=torch.uint8)
        >>> dst = torch.empty(4, dtype=torch.uint8)
        >>> unshuffle_bytes(src, dst, 2)
        >>> dst.view(torch.int16).tolist()
        [1, 2]
    """
    n = _check(src, dst, itemsize)
    body = n // itemsize * itemsize
    if body:
        from_planes(src[:body].numpy().reshape(itemsize, -1), dst[:body].numpy())
    if body < n:
        dst[body:n].copy_(src[body:n])


def _tools() -> tuple[Lz4Codec, torch.Tensor, torch.Tensor]:
    tools: tuple[Lz4Codec, torch.Tensor, torch.Tensor] | None = getattr(_local, "tools", None)
    if tools is None:
        codec = Lz4Codec()
        bound = codec.max_compressed_size(SHUFFLE_SAMPLE_BYTES)
        assert bound is not None
        planes = torch.empty(SHUFFLE_SAMPLE_BYTES, dtype=torch.uint8)
        tools = (codec, planes, torch.empty(bound, dtype=torch.uint8))
        _local.tools = tools
    return tools


def shuffle_itemsize(dtype: torch.dtype, data: torch.Tensor) -> int:
    """The element size to shuffle a tensor's bytes by before compressing, or 0 for none.

    lz4 compresses the first 16 KiB of ``data`` as it is and shuffled; the shuffle is
    advised when it shrinks that sample :data:`SHUFFLE_GAIN` times more. Thread-safe
    (scratch buffers per thread).

    Args:
        dtype: The tensor's dtype: elements of 2, 4 or 8 bytes may be shuffled (complex
            ones not: their halves are two numbers).
        data: The tensor's bytes (flat contiguous CPU ``torch.uint8``).

    Returns:
        ``dtype.itemsize`` when shuffling pays, else 0 (also for a sample under 1 KiB).

    Raises:
        CompressionError: liblz4 failed.

    Example:
        >>> ids = torch.randint(0, 50000, (4096,), generator=torch.Generator().manual_seed(0))
        >>> shuffle_itemsize(torch.int64, ids.view(torch.uint8))
        8
    """
    itemsize = dtype.itemsize
    if itemsize not in SHUFFLE_ITEMSIZES or dtype.is_complex:
        return 0
    n = min(int(data.numel()), SHUFFLE_SAMPLE_BYTES) // itemsize * itemsize
    if n < 1024:
        return 0
    codec, planes, out = _tools()
    head = data[:n]
    plain = codec.compress_into(head, out)
    shuffle_bytes(head, planes[:n], itemsize)
    shuffled = codec.compress_into(planes[:n], out)
    return itemsize if plain >= SHUFFLE_GAIN * shuffled else 0
