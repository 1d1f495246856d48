"""Dense bodies: the new values (``full``) or their XOR with the base (``xor``).

When the body is compressed and elements are wider than a byte, it is laid out in byte
planes (every element's byte 0, then every byte 1, ...; the layout of
:func:`~p2p_compress.shuffle_bytes`): the rarely changing sign/exponent bytes of floats
and the zero high bytes of an XOR then sit together. A raw body keeps the elements' own
byte order.
"""

from __future__ import annotations

import numpy as np
import torch


def planar(itemsize: int, codec: str) -> bool:
    """Whether a dense body of this element size and codec is in byte planes."""
    return itemsize > 1 and codec != "raw"


def write_xor(
    new: np.ndarray,
    base: np.ndarray,
    body: torch.Tensor,
    planes: bool,
) -> None:
    """Write ``new ^ base`` into ``body`` (planes or element order)."""
    out = body.numpy()
    s = new.itemsize
    if not planes:
        np.bitwise_xor(new, base, out=out.view(new.dtype))
        return
    np.bitwise_xor(
        new.view(np.uint8).reshape(-1, s).T,
        base.view(np.uint8).reshape(-1, s).T,
        out=out.reshape(s, -1),
    )


def write_full(new: np.ndarray, body: torch.Tensor, planes: bool) -> None:
    """Write the new values into ``body`` (planes or element order)."""
    out = body.numpy()
    if not planes:
        out[...] = new.view(np.uint8)
        return
    s = new.itemsize
    out.reshape(s, -1)[...] = new.view(np.uint8).reshape(-1, s).T


def apply_xor(body: torch.Tensor, target: np.ndarray, planes: bool) -> None:
    """``target ^= body`` (the body in planes or element order)."""
    data = body.numpy()
    if not planes:
        np.bitwise_xor(target, data.view(target.dtype), out=target)
        return
    s = target.itemsize
    t8 = target.view(np.uint8).reshape(-1, s)
    np.bitwise_xor(t8, data.reshape(s, -1).T, out=t8)


def apply_full(body: torch.Tensor, target: np.ndarray, planes: bool) -> None:
    """``target[...] = body`` (the body in planes or element order)."""
    data = body.numpy()
    if not planes:
        target.view(np.uint8)[...] = data
        return
    s = target.itemsize
    target.view(np.uint8).reshape(-1, s)[...] = data.reshape(s, -1).T
