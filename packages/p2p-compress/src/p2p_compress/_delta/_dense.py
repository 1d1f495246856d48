"""Dense bodies: the new values (``full``) or their XOR with the base (``xor``).

When the body is compressed and elements are wider than a byte, it is laid out in byte
planes (every element's byte 0, then every byte 1, ...; the layout of
:func:`~p2p_compress.shuffle_bytes`, both ways by :mod:`~p2p_compress._codecs._planes`):
the rarely changing sign/exponent bytes of floats and the zero high bytes of an XOR then
sit together. A raw body keeps the elements' own byte order.
"""

from __future__ import annotations

import numpy as np
import torch

from p2p_compress._codecs._planes import from_planes, to_planes


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
    if not planes:
        np.bitwise_xor(new, base, out=out.view(new.dtype))
        return
    to_planes(new.view(np.uint8), out.reshape(new.itemsize, -1), base=base.view(np.uint8))


def write_full(new: np.ndarray, body: torch.Tensor, planes: bool) -> None:
    """Write the new values into ``body`` (planes or element order)."""
    out = body.numpy()
    if not planes:
        out[...] = new.view(np.uint8)
        return
    to_planes(new.view(np.uint8), out.reshape(new.itemsize, -1))


def apply_xor(body: torch.Tensor, target: np.ndarray, planes: bool) -> None:
    """``target ^= body`` (the body in planes or element order)."""
    data = body.numpy()
    if not planes:
        np.bitwise_xor(target, data.view(target.dtype), out=target)
        return
    from_planes(data.reshape(target.itemsize, -1), target.view(np.uint8), xor=True)


def apply_full(body: torch.Tensor, target: np.ndarray, planes: bool) -> None:
    """``target[...] = body`` (the body in planes or element order)."""
    data = body.numpy()
    if not planes:
        target.view(np.uint8)[...] = data
        return
    from_planes(data.reshape(target.itemsize, -1), target.view(np.uint8))
