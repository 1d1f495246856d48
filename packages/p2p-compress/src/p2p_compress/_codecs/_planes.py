"""Byte planes: split elements of 2, 4 or 8 bytes into planes of their k-th bytes, and back.

Plane ``k`` holds byte ``k`` of every element (byte 0 first in memory). The plain way to
regroup is a strided copy (``planes[...] = elements.reshape(-1, s).T``); numpy walks
it one byte at a time, and the way back, whose writes are the strided ones, is slow:
22.7 ms per 10 MiB for 2-byte elements on this project's 2-core VM (torch's
``copy_`` of the transposed view: 34 ms).

On a little-endian machine byte ``k`` of an element is ``(x >> 8k) & 0xff`` of the
element read as an unsigned integer, so both directions become whole-array shifts on
the wide integers: a plane is written with one cast-down shift, an element is rebuilt
from its planes with shifts and ors. Done in slices of :data:`SLICE` elements, which
stay in cache between the passes, it measured per 10 MiB (one core, best of 7, three
runs of ``benchmarks/bench_byte_planes.py``, 2026-12-07):

============  =====================  =======================
element size  to planes              from planes
============  =====================  =======================
2 bytes       2.1-2.9 ms (3.2-3.6)   1.7-1.9 ms (18.5-19.0)
4 bytes       2.6-2.9 ms (3.1)       3.0-3.3 ms (11.0-11.2)
============  =====================  =======================

(the strided copy in brackets). 8-byte elements tie both ways (3.1-3.4 and 5.8-6.0
ms), so they keep the strided copy, as does a big-endian machine.
"""

from __future__ import annotations

import sys
from typing import Final

import numpy as np

SLICE: Final = 1 << 16
"""Elements per pass (at most 512 KiB of 8-byte elements: an L2 cache's worth)."""

_WIDE: Final[dict[int, type[np.unsignedinteger]]] = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_FAST: Final = {2: sys.byteorder == "little", 4: sys.byteorder == "little"}
"""Element sizes regrouped by shifts (the others by the strided copy)."""


def _check(planes: np.ndarray, elements: np.ndarray) -> tuple[int, int]:
    if planes.dtype != np.uint8 or planes.ndim != 2 or planes.shape[0] not in _WIDE:
        raise ValueError(
            f"planes must be a (2, 4 or 8, n) uint8 array, got {planes.dtype} {planes.shape}"
        )
    s, n = planes.shape
    if elements.dtype != np.uint8 or elements.shape != (n * s,) or not elements.flags.c_contiguous:
        raise ValueError(
            f"elements must be a contiguous ({n * s},) uint8 array, got"
            f" {elements.dtype} {elements.shape}"
        )
    return s, n


def to_planes(elements: np.ndarray, planes: np.ndarray, *, base: np.ndarray | None = None) -> None:
    """Write ``elements``' bytes into ``planes``: ``planes[k, i]`` = byte ``k`` of element ``i``.

    Args:
        elements: ``n * s`` bytes (contiguous uint8), ``n`` elements of ``s`` bytes.
        planes: An ``(s, n)`` uint8 array (rows may be views into a larger body).
        base: Another ``n * s`` bytes like ``elements``: the planes of ``elements ^ base``
            are written instead.

    Raises:
        ValueError: The shapes or dtypes do not fit.
    """
    s, n = _check(planes, elements)
    if base is not None:
        _check(planes, base)
    if not _FAST.get(s, False):
        if base is None:
            planes[...] = elements.reshape(-1, s).T
        else:
            np.bitwise_xor(elements.reshape(-1, s).T, base.reshape(-1, s).T, out=planes)
        return
    wide = elements.view(_WIDE[s])
    other = None if base is None else base.view(_WIDE[s])
    scratch = None if other is None else np.empty(min(n, SLICE), dtype=_WIDE[s])
    for a in range(0, n, SLICE):
        b = min(n, a + SLICE)
        part = wide[a:b]
        if other is not None and scratch is not None:
            part = np.bitwise_xor(part, other[a:b], out=scratch[: b - a])
        for k in range(s):  # the cast down to uint8 keeps the shifted value's low byte
            np.right_shift(part, 8 * k, out=planes[k, a:b], casting="unsafe")


def from_planes(planes: np.ndarray, elements: np.ndarray, *, xor: bool = False) -> None:
    """Rebuild the elements from ``planes`` into ``elements`` (``xor``: xor them in).

    Args:
        planes: An ``(s, n)`` uint8 array, as :func:`to_planes` writes it.
        elements: ``n * s`` contiguous uint8 bytes, written (or xored into).
        xor: Xor the rebuilt elements into ``elements`` instead of writing them.

    Raises:
        ValueError: The shapes or dtypes do not fit.
    """
    s, n = _check(planes, elements)
    if not _FAST.get(s, False):
        view = elements.reshape(-1, s)
        if xor:
            np.bitwise_xor(view, planes.T, out=view)
        else:
            view[...] = planes.T
        return
    wide = elements.view(_WIDE[s])
    scratch = np.empty(min(n, SLICE), dtype=_WIDE[s]) if xor else None
    for a in range(0, n, SLICE):
        b = min(n, a + SLICE)
        out = wide[a:b] if scratch is None else scratch[: b - a]
        out[...] = planes[s - 1, a:b]
        for k in range(s - 2, -1, -1):
            np.left_shift(out, 8, out=out)
            np.bitwise_or(out, planes[k, a:b], out=out)
        if scratch is not None:
            np.bitwise_xor(wide[a:b], out, out=wide[a:b])
