"""Helpers of N-member groups: reduce ops, dtype checks, output kinds, liveness mesh.

Everything here is package-internal; :mod:`p2p_collective._groups._multi` builds the group on it.
"""

from __future__ import annotations

import enum
import socket
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias, cast

import numpy as np
import torch
import torch.distributed as dist

from p2p_collective._groups._arrays import ArrayT, as_tensor
from p2p_collective._links._liveness import open_watch_socket
from p2p_collective._links._transport import StoreLike

if TYPE_CHECKING:
    from p2p_collective._links._torch_gloo import GlooReduceOp

    ReduceOpLike: TypeAlias = str | enum.Enum | GlooReduceOp
    """A reduction as users name it: ``"sum"``, an enum with such a ``name``, a ReduceOp."""

__all__ = [
    "REDUCE_OPS",
    "as_tensor",
    "check_reducible",
    "like",
    "liveness_mesh",
    "reduce_op",
    "reduce_op_name",
]

_REDUCE_OP = dist.ReduceOp
_BY_NAME: dict[str, GlooReduceOp] = {
    "sum": _REDUCE_OP.SUM,
    "min": _REDUCE_OP.MIN,
    "max": _REDUCE_OP.MAX,
    "prod": _REDUCE_OP.PRODUCT,
    "product": _REDUCE_OP.PRODUCT,
}

REDUCE_OPS = ("sum", "product", "min", "max")
_GLOO_DTYPES = frozenset(
    {
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
    }
)


def reduce_op(op: object, arg: str = "op") -> GlooReduceOp:
    """Map a reduction name (``"sum"``, ``"product"``, ``"min"``, ``"max"``) to a ReduceOp.

    Any case is accepted, as are enums with such a ``name`` and torch ReduceOps.

    Raises:
        ValueError: ``op`` is none of these.
    """
    if isinstance(op, (_REDUCE_OP.RedOpType, _REDUCE_OP)):
        return op
    text = op if isinstance(op, str) else getattr(op, "name", None)
    if isinstance(text, str):
        found = _BY_NAME.get(text.lower())
        if found is not None:
            return found
    raise ValueError(f"{arg}: got {op!r}; allowed: one of {', '.join(REDUCE_OPS)}")


def reduce_op_name(op: object) -> str | None:
    """The name in :data:`REDUCE_OPS` of a ReduceOp (as :func:`reduce_op` returns it).

    None for the reductions outside that set (``BAND`` and the like: gloo only).
    """
    name = getattr(op, "name", None)
    if not isinstance(name, str):
        return None
    name = name.lower()
    return name if name in REDUCE_OPS else None


def check_reducible(tensor: torch.Tensor, where: str, op: str) -> None:
    """Refuse a tensor whose dtype a reduction cannot take (gloo's set, used everywhere).

    Args:
        tensor: The tensor to reduce.
        where: How the caller names it in the message, e.g. ``"tensor"``.
        op: The operation, e.g. ``"allreduce"``.

    Raises:
        ValueError: ``tensor``'s dtype is not one gloo reduces; the message names the
            dtype and the allowed ones.
    """
    if tensor.dtype not in _GLOO_DTYPES:
        allowed = ", ".join(sorted(str(d) for d in _GLOO_DTYPES))
        raise ValueError(f"{op}: {where} has dtype {tensor.dtype}; allowed: {allowed}")


def like(template: ArrayT, tensor: torch.Tensor) -> ArrayT:
    """``tensor`` as the same kind of object as ``template`` (numpy array or tensor)."""
    # the kind is chosen at run time from the template: the checker cannot follow it
    return cast("ArrayT", tensor.numpy() if isinstance(template, np.ndarray) else tensor)


# -- transport ---------------------------------------------------------------------------


def liveness_mesh(
    store: StoreLike,
    prefix: str,
    rank: int,
    names: Sequence[str],
    host: str,
    timeout: float | None,
    wait_key: Callable[[str, float | None], bool],
) -> dict[int, socket.socket]:
    """One idle TCP connection to every other member (the lower rank listens).

    Pairs are connected in a fixed order (by the lower rank, then the higher), so no two
    members ever wait on each other.

    Raises:
        CollectiveTimeoutError: A member did not connect in time.
        CollectiveError: A connection failed.
    """
    socks: dict[int, socket.socket] = {}
    try:
        for peer in range(len(names)):
            if peer == rank:
                continue
            low, high = min(rank, peer), max(rank, peer)
            socks[peer] = open_watch_socket(
                store,
                f"{prefix}/live/{low}-{high}",
                rank == low,
                host,
                names[peer],
                timeout,
                wait_key,
            )
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    return socks
