"""The sparse body: the changed positions as gaps, and the changes as small integers.

For ``c`` changed elements of ``s`` bytes each, at increasing positions ``p_0 < p_1 <
...``, the body is three streams, each compressing well on its own::

    planes  s * c bytes   byte j of every change's code, plane by plane (j = 0 first)
    gaps    c bytes       g_i = p_i - p_{i-1} - 1 (p_{-1} = -1), or 255 when g_i >= 255
    big     w * (#255)    g_i - 255 for each escaped gap, u32 (u64 when numel > 2**32)

A change's code is the difference of the bit patterns read as unsigned integers,
``new - base`` modulo ``2**(8s)``, zigzag-mapped (``0, -1, 1, -2 ... -> 0, 1, 2, 3``).
A one-ulp step of a float is then a code of 1 or 2 whatever carries it causes, where
the XOR of the bits is 1, 3, 7, 15 ... (measured on bf16 AdamW steps: the low plane
costs 2.7 bits a change as a difference, 3.4 as an XOR). It is bit-exact for any bits:
the arithmetic wraps, NaN payloads and signed zeros are just integers here.
"""

from __future__ import annotations

import numpy as np
import torch

from p2p_compress._codecs._planes import from_planes, to_planes
from p2p_compress._delta._streams import I_TYPES, U_TYPES
from p2p_compress._errors import CompressionError

_ESCAPE = 255


def big_width(numel: int) -> int:
    """Bytes per escaped gap: 4, or 8 for tensors of more than ``2**32`` elements."""
    return 4 if numel <= 1 << 32 else 8


def gaps_of(idx: np.ndarray) -> np.ndarray:
    """``g_i = p_i - p_{i-1} - 1`` for sorted positions (int64)."""
    gaps = np.empty_like(idx)
    if idx.size:
        gaps[0] = idx[0]
        np.subtract(idx[1:], idx[:-1], out=gaps[1:])
        gaps[1:] -= 1
    return gaps


def body_size(itemsize: int, changed: int, nbig: int, numel: int) -> int:
    """The sparse body's length in bytes."""
    return (itemsize + 1) * changed + big_width(numel) * nbig


SCAN_CHUNK = 1 << 18
"""Elements compared per step of :func:`scan` (a cache-sized piece of both tensors)."""


def scan(
    new: np.ndarray, base: np.ndarray, most: int
) -> tuple[int, tuple[np.ndarray, np.ndarray] | None]:
    """Count the changed elements; collect their positions and differences while few.

    Works a cache-sized chunk at a time: subtract (wrapping), find the nonzero
    differences, gather them, so each chunk is read from memory once and no
    tensor-sized mask is made. (Subtracting first gathers one array instead of both
    sides: 10 MB of 2-byte elements at 19% changed took 5.3-5.8 ms instead of 6.5; a
    ``flatnonzero`` of the differences themselves instead of their mask: 17 ms.)

    Args:
        new: the new bits (flat unsigned view).
        base: the base bits, same size and type.
        most: collect while at most this many changed (-1: only count).

    Returns:
        The changed count, and (positions as int64, ``new - base`` at them, wrapping)
        when that count is at most ``most``, else None.
    """
    n = int(new.size)
    mask = np.empty(min(n, SCAN_CHUNK), dtype=np.bool_)
    delta = np.empty(min(n, SCAN_CHUNK), dtype=new.dtype)
    found: list[tuple[np.ndarray, np.ndarray]] | None = [] if most >= 0 else None
    c = 0
    for start in range(0, n, SCAN_CHUNK):
        a = new[start : start + SCAN_CHUNK]
        b = base[start : start + SCAN_CHUNK]
        m = mask[: a.size]
        if found is None:
            np.not_equal(a, b, out=m)
            c += int(np.count_nonzero(m))
            continue
        d = np.subtract(a, b, out=delta[: a.size])  # wraps: unsigned arithmetic
        np.not_equal(d, 0, out=m)  # changed exactly where the difference is not 0
        idx = np.flatnonzero(m)
        c += int(idx.size)
        if c > most:
            found = None
            continue
        diff = d[idx]
        idx += start
        found.append((idx, diff))
    if found is None:
        return c, None
    if len(found) == 1:
        return c, found[0]
    if not found:
        return c, (np.empty(0, dtype=np.int64), np.empty(0, dtype=new.dtype))
    return c, (np.concatenate([i for i, _ in found]), np.concatenate([d for _, d in found]))


def write_body(diff: np.ndarray, gaps: np.ndarray, body: torch.Tensor) -> None:
    """Fill ``body`` (exactly :func:`body_size` bytes) from the changes and their gaps."""
    c = int(diff.size)
    if c == 0:
        return
    s = diff.itemsize
    out = body.numpy()
    signed = diff.view(I_TYPES[s])
    code = np.left_shift(signed, 1)
    code ^= signed >> (8 * s - 1)
    if s == 1:
        out[:c] = code.view(np.uint8)
    else:
        to_planes(code.view(np.uint8), out[: s * c].reshape(s, c))
    np.minimum(gaps, _ESCAPE, out=out[s * c : (s + 1) * c], casting="unsafe")
    wide = gaps >= _ESCAPE
    if wide.any():
        big = gaps[wide]
        big -= _ESCAPE
        width = (out.size - (s + 1) * c) // int(big.size)
        out[(s + 1) * c :].view(np.uint32 if width == 4 else np.uint64)[...] = big


def read_body(
    body: torch.Tensor, changed: int, numel: int, itemsize: int
) -> tuple[np.ndarray, np.ndarray]:
    """Check a sparse body completely and decode it: (positions as int64, changes).

    The changes are unsigned ``itemsize``-byte integers to add (wrapping) at the positions.

    Raises:
        CompressionError: the body is inconsistent (its length, its escapes, a position
            past ``numel``).
    """
    c = changed
    u = U_TYPES[itemsize]
    if c == 0:
        if body.numel():
            raise CompressionError(
                f"corrupt delta payload: {body.numel()} body bytes for no changed element"
            )
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=u)
    n = numel
    s = itemsize
    data = body.numpy()
    width = big_width(n)
    rest = int(data.size) - (s + 1) * c
    if rest < 0 or rest % width:
        raise CompressionError(
            f"corrupt delta payload: a sparse body of {data.size} bytes cannot hold {c} "
            f"changes of {s}-byte elements"
        )
    gap_bytes = data[s * c : (s + 1) * c]
    wide = gap_bytes == _ESCAPE
    nbig = int(np.count_nonzero(wide))
    if nbig * width != rest:
        raise CompressionError(
            f"corrupt delta payload: {nbig} escaped gaps but {rest} bytes of wide gaps"
        )
    pos = gap_bytes.astype(np.int64)
    if nbig:
        big = data[(s + 1) * c :].view(np.uint32 if width == 4 else np.uint64)
        if int(big.max()) >= n:
            raise CompressionError(f"corrupt delta payload: a gap past {n} elements")
        pos[wide] = big.astype(np.int64) + _ESCAPE
    pos += 1
    np.cumsum(pos, out=pos)
    pos -= 1
    if int(pos[-1]) >= n:
        raise CompressionError(
            f"corrupt delta payload: a change at element {int(pos[-1])} of a tensor of {n}"
        )
    if s == 1:
        code = data[:c].copy()
    else:
        code = np.empty(c, dtype=u)
        from_planes(data[: s * c].reshape(s, c), code.view(np.uint8))
    diff = code >> 1
    diff ^= np.negative(code & 1)  # zigzag back: unsigned wrap
    return pos, diff


def add_changes(target: np.ndarray, pos: np.ndarray, diff: np.ndarray) -> None:
    """``target[pos] += diff`` (flat unsigned view; the addition wraps)."""
    if pos.size:
        vals = target[pos]
        vals += diff
        target[pos] = vals
