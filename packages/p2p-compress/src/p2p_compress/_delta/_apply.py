"""apply_delta: check a patch, decode it, and write it into one tensor or several in place."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from p2p_compress._codecs._memory import tensor_pieces
from p2p_compress._delta import _dense, _sparse
from p2p_compress._delta._patch import (
    FLAG_PLANES,
    KIND_FULL,
    KIND_SPARSE,
    KIND_XOR,
    DeltaPatch,
    read_header,
)
from p2p_compress._delta._streams import as_numpy, open_body, scratch
from p2p_compress._errors import CompressionError
from p2p_compress._pool import TensorBufferPool


def _targets(patch: DeltaPatch, target: object) -> list[torch.Tensor]:
    """The tensors to write, checked against the patch before any is touched."""
    pieces = tensor_pieces(target, "target")
    numel = sum(int(t.numel()) for t, _ in pieces)
    wrong = [(t, label) for t, label in pieces if t.dtype != patch.dtype]
    if wrong or numel != patch.numel:
        what = "target" if isinstance(target, torch.Tensor) else "target's pieces together"
        dtype = wrong[0][0].dtype if wrong else patch.dtype
        raise ValueError(
            f"{what} (dtype {dtype}, numel {numel}) does not match the patch (dtype "
            f"{patch.dtype}, numel {patch.numel})"
            + (f": {wrong[0][1]} has dtype {dtype}" if wrong and len(pieces) > 1 else "")
        )
    return [t for t, _ in pieces]


def _check_body(patch: DeltaPatch, body_len: int, dense: int | None) -> None:
    if dense is not None and body_len != dense:
        raise CompressionError(
            f"corrupt delta payload: a {patch.kind} body of {body_len} bytes for "
            f"{patch.numel} elements of {patch.dtype.itemsize} bytes"
        )
    most = (patch.dtype.itemsize + 1 + _sparse.big_width(patch.numel)) * patch.changed
    if dense is None and body_len > most:
        raise CompressionError(
            f"corrupt delta payload: a sparse body of {body_len} bytes for {patch.changed} changes"
        )


def apply_delta(
    patch: DeltaPatch,
    target: torch.Tensor | Sequence[torch.Tensor],
    *,
    pool: TensorBufferPool | None = None,
) -> None:
    """Apply ``patch`` to ``target`` in place: it holds the base on entry, the new bits on exit.

    ``target`` may also be a list or tuple of tensors, read end to end as one flat run of
    values (the pieces of a bucket that live in several tensors): the patch then writes
    each piece in place, and ``tensor_checksum`` of the same list checks the result, so
    nothing has to be gathered into one buffer and scattered back.

    Args:
        patch: a patch from :func:`encode_delta` (or :meth:`DeltaPatch.from_meta`).
        target: a contiguous CPU tensor of the patch's dtype and numel (any shape),
            holding the base the patch was made against (anything, for a full patch);
            or a list or tuple of contiguous CPU tensors of the patch's dtype whose
            numels add up to the patch's.
        pool: where the scratch buffer for a compressed body comes from; None allocates.

    Raises:
        TypeError: ``patch`` is not a :class:`DeltaPatch` or ``target`` not a tensor (or
            a list of them).
        ValueError: ``target`` (or a piece, named by its index) is not a contiguous dense
            CPU tensor, or its dtype or numel differs from the patch's (the message names
            both); checked before ``target`` is touched.
        CompressionError: the payload is corrupt, truncated, or belongs to other
            metadata. A ``sparse`` or ``xor`` patch is checked and decoded completely
            before ``target`` is written, so it is unchanged then; a ``full`` patch
            with a raw body is also checked first, but a compressed ``full`` body
            that fails while decoding may leave ``target`` partly written. A patch
            applied to the wrong base is not detected here: compare
            :func:`tensor_checksum` values for that.

    Example:
        >>> base = torch.tensor([1.0, -0.0, float("nan")])
        >>> new = torch.tensor([1.0, 0.0, float("nan")])
        >>> target = base.clone()
        >>> apply_delta(encode_delta(new, base), target)
        >>> target.view(torch.int32).tolist() == new.view(torch.int32).tolist()
        True
        >>> a, b = base[:1].clone(), base[1:].clone()  # the same values in two tensors
        >>> apply_delta(encode_delta(new, base), [a, b])
        >>> torch.cat([a, b]).view(torch.int32).tolist() == new.view(torch.int32).tolist()
        True
    """
    if not isinstance(patch, DeltaPatch):
        raise TypeError(f"patch must be a DeltaPatch, got {type(patch).__name__}")
    pieces = _targets(patch, target)
    flags, body_len = read_header(patch)
    itemsize = int(patch.dtype.itemsize)
    views = [as_numpy(t, itemsize) for t in pieces]
    if patch.kind == KIND_SPARSE:
        _check_body(patch, body_len, None)
        with scratch(pool, body_len) as body:
            open_body(patch.payload, patch.codec, body_len, body)
            pos, diff = _sparse.read_body(body, patch.changed, patch.numel, itemsize)
        _add_to_pieces(views, pos, diff)
        return
    _check_body(patch, body_len, patch.numel * itemsize)
    planes = bool(flags & FLAG_PLANES)
    if patch.kind == KIND_FULL and not planes and len(pieces) == 1:
        open_body(patch.payload, patch.codec, body_len, pieces[0].reshape(-1).view(torch.uint8))
        return
    with scratch(pool, body_len) as body:
        open_body(patch.payload, patch.codec, body_len, body)
        start = 0
        for view in views:
            part = _dense_part(body, start, view.size, itemsize, planes)
            if patch.kind == KIND_XOR:
                _dense.apply_xor(part, view, planes)
            else:
                _dense.apply_full(part, view, planes)
            start += view.size


def _add_to_pieces(views: list[np.ndarray], pos: np.ndarray, diff: np.ndarray) -> None:
    """Add the decoded changes into the pieces they fall in (positions are sorted)."""
    start = 0
    for view in views:
        lo, hi = np.searchsorted(pos, [start, start + view.size])
        at = pos[lo:hi]
        _sparse.add_changes(view, at - start if start else at, diff[lo:hi])
        start += view.size


def _dense_part(
    body: torch.Tensor, start: int, count: int, itemsize: int, planes: bool
) -> torch.Tensor:
    """The part of a dense body that holds elements ``start .. start + count``."""
    if not planes:
        return body[start * itemsize : (start + count) * itemsize]
    return body.view(itemsize, -1)[:, start : start + count]
