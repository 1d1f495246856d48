"""The collective and point-to-point operations, with Ray's names, order and defaults.

Every call blocks until the operation completed on this member, as in Ray, and takes
one more keyword than Ray's: ``timeout``, the seconds it may take, joining the other
members included (None: the job's ``op_timeout``, 1800 s unless configured). Tensors
are CPU ``torch.Tensor`` s or ``numpy.ndarray`` s, written in place.

Failures: bad arguments raise before anything is sent, with the exception bases Ray
uses (see :mod:`p2p_worker._raycoll._errors`), and the group stays usable. A member
that dies or destroys its group fails the pending and later operations of the others
with ``p2p_collective.PeerError`` within seconds; an operation past its ``timeout``
raises ``p2p_collective.CollectiveTimeoutError``. Both are ``RuntimeError`` s.
"""

from __future__ import annotations

import enum

from p2p_worker._raycoll import _registry
from p2p_worker._raycoll._checks import (
    Tensor,
    check_not_self,
    check_rank,
    check_tensor,
    check_tensor_list,
    check_timeout,
)
from p2p_worker._raycoll._errors import CollectiveArgumentError
from p2p_worker._raycoll._types import ReduceOp, ReduceOpLike

_OPS = {"sum": "sum", "product": "product", "prod": "product", "min": "min", "max": "max"}


def _op_name(op: object) -> str:
    """``"sum"`` / ``"product"`` / ``"min"`` / ``"max"`` for a ReduceOp, Ray's, or a string."""
    text = op.name if isinstance(op, enum.Enum) else op
    name = _OPS.get(text.lower()) if isinstance(text, str) else None
    if name is None:
        raise CollectiveArgumentError(
            f"op: got {op!r}; allowed: ReduceOp.SUM, PRODUCT, MIN, MAX (or their names)"
        )
    return name


def allreduce(
    tensor: Tensor,
    group_name: str = "default",
    op: ReduceOpLike = ReduceOp.SUM,
    *,
    timeout: float | None = None,
) -> None:
    """Reduce ``tensor`` over the group with ``op``; every member gets the result in place.

    Args:
        tensor: Same shape and dtype on every member.
        group_name: The group.
        op: A :class:`ReduceOp` (or Ray's, or ``"sum"`` ...).
        timeout: Seconds it may take (None: the job's default).

    Raises:
        TensorTypeError: ``tensor`` is not a tensor or array.
        GroupNotInitializedError: The group is not initialized here (``RuntimeError``).
        CollectiveArgumentError: Bad ``op``/``timeout``, an unsupported dtype, or a
            non-contiguous / accelerator tensor.
        PeerError, CollectiveTimeoutError: See the module doc.

    Example:
        >>> grad = torch.ones(4)  # doctest: +SKIP
        >>> allreduce(grad, "default")  # grad now holds the sum  # doctest: +SKIP
    """
    check_tensor(tensor, "tensor", "allreduce")
    name, wait = _op_name(op), check_timeout(timeout)
    _registry.get(group_name).allreduce(tensor, name, wait)


def barrier(group_name: str = "default", *, timeout: float | None = None) -> None:
    """Block until every member of the group reached its barrier.

    Raises:
        GroupNotInitializedError, PeerError, CollectiveTimeoutError: As for
            :func:`allreduce`.

    Example:
        >>> barrier("default")  # doctest: +SKIP
    """
    wait = check_timeout(timeout)
    _registry.get(group_name).barrier(wait)


def reduce(
    tensor: Tensor,
    dst_rank: int = 0,
    group_name: str = "default",
    op: ReduceOpLike = ReduceOp.SUM,
    *,
    timeout: float | None = None,
) -> None:
    """Reduce ``tensor`` over the group into ``tensor`` of ``dst_rank`` (in place).

    The other members' tensors are left unchanged.

    Raises:
        CollectiveArgumentError: ``dst_rank`` out of range (a ``ValueError``, as in
            Ray). Others as :func:`allreduce`.

    Example:
        >>> reduce(loss, dst_rank=0, group_name="default")  # doctest: +SKIP
    """
    check_tensor(tensor, "tensor", "reduce")
    name, wait = _op_name(op), check_timeout(timeout)
    handle = _registry.get(group_name)
    handle.reduce(tensor, check_rank(dst_rank, handle.world_size, "dst_rank"), name, wait)


def broadcast(
    tensor: Tensor, src_rank: int = 0, group_name: str = "default", *, timeout: float | None = None
) -> None:
    """Copy ``tensor`` of ``src_rank`` into ``tensor`` of every member.

    Raises:
        CollectiveArgumentError: ``src_rank`` out of range (a ``ValueError``). Others
            as :func:`allreduce`.

    Example:
        >>> broadcast(weights, src_rank=0, group_name="default")  # doctest: +SKIP
    """
    check_tensor(tensor, "tensor", "broadcast")
    wait = check_timeout(timeout)
    handle = _registry.get(group_name)
    handle.broadcast(tensor, check_rank(src_rank, handle.world_size, "src_rank"), wait)


def allgather(
    tensor_list: list[Tensor],
    tensor: Tensor,
    group_name: str = "default",
    *,
    timeout: float | None = None,
) -> None:
    """Gather every member's ``tensor`` into ``tensor_list`` (by rank), on every member.

    Args:
        tensor_list: ``world_size`` tensors shaped like ``tensor``, filled in place.
        tensor: This member's contribution.
        group_name: The group.
        timeout: Seconds it may take (None: the job's default).

    Raises:
        TensorTypeError: ``tensor_list`` is not a list of tensors.
        CollectiveArgumentError: ``tensor_list`` does not hold exactly ``world_size``
            tensors (a ``RuntimeError``, as in Ray). Others as :func:`allreduce`.

    Example:
        >>> out = [torch.empty(4) for _ in range(get_collective_group_size())]  # doctest: +SKIP
        >>> allgather(out, torch.ones(4))  # doctest: +SKIP
    """
    check_tensor(tensor, "tensor", "allgather")
    check_tensor_list(tensor_list, "tensor_list", "allgather", None)
    wait = check_timeout(timeout)
    handle = _registry.get(group_name)
    check_tensor_list(tensor_list, "tensor_list", "allgather", handle.world_size)
    handle.allgather(tensor_list, tensor, wait)


def reducescatter(
    tensor: Tensor,
    tensor_list: list[Tensor],
    group_name: str = "default",
    op: ReduceOpLike = ReduceOp.SUM,
    *,
    timeout: float | None = None,
) -> None:
    """Reduce ``tensor_list[r]`` over the group into ``tensor`` of member ``r``.

    ``tensor_list`` is left unchanged (Ray's torch-gloo backend overwrites every item
    with its full reduction; its NCCL backend does not).

    Args:
        tensor: This member's result, shaped like each item of ``tensor_list``.
        tensor_list: ``world_size`` tensors.
        group_name: The group.
        op: The reduction.
        timeout: Seconds it may take (None: the job's default).

    Raises:
        CollectiveArgumentError: ``tensor_list`` does not hold ``world_size`` tensors,
            or an item's shape or dtype differs from ``tensor``'s. Others as
            :func:`allreduce`.

    Example:
        >>> mine = torch.empty(4)  # doctest: +SKIP
        >>> reducescatter(mine, [torch.ones(4) for _ in range(world_size)])  # doctest: +SKIP
    """
    check_tensor(tensor, "tensor", "reducescatter")
    check_tensor_list(tensor_list, "tensor_list", "reducescatter", None)
    name, wait = _op_name(op), check_timeout(timeout)
    handle = _registry.get(group_name)
    check_tensor_list(tensor_list, "tensor_list", "reducescatter", handle.world_size)
    handle.reducescatter(tensor, tensor_list, name, wait)


reduce_scatter = reducescatter
"""The earlier spelling of :func:`reducescatter`, kept as an alias."""


def send(
    tensor: Tensor, dst_rank: int, group_name: str = "default", *, timeout: float | None = None
) -> None:
    """Send ``tensor`` to ``dst_rank``, which calls :func:`recv` with as many bytes.

    Sends between two members are delivered in order. Between members on one node the
    bytes travel through shared memory; otherwise over gloo (TCP).

    Raises:
        CollectiveArgumentError: ``dst_rank`` out of range (a ``ValueError``) or this
            member's own rank (a ``RuntimeError``, as in Ray). Others as
            :func:`allreduce`.

    Example:
        >>> send(torch.arange(4.0), dst_rank=1)  # doctest: +SKIP
    """
    check_tensor(tensor, "tensor", "send")
    wait = check_timeout(timeout)
    handle = _registry.get(group_name)
    dst = check_rank(dst_rank, handle.world_size, "dst_rank")
    check_not_self(dst, handle.rank, "dst_rank")
    handle.send(tensor, dst, wait)


def recv(
    tensor: Tensor, src_rank: int, group_name: str = "default", *, timeout: float | None = None
) -> None:
    """Receive a :func:`send` of ``src_rank`` into ``tensor`` (in place).

    Raises:
        CollectiveArgumentError: As for :func:`send`.
        FramingError: The sender sent another number of bytes (the pair's receiving
            direction is broken afterwards: destroy and re-create the group).
        PeerError, CollectiveTimeoutError: See the module doc.

    Example:
        >>> buf = torch.empty(4)  # doctest: +SKIP
        >>> recv(buf, src_rank=0)  # doctest: +SKIP
    """
    check_tensor(tensor, "tensor", "recv")
    wait = check_timeout(timeout)
    handle = _registry.get(group_name)
    src = check_rank(src_rank, handle.world_size, "src_rank")
    check_not_self(src, handle.rank, "src_rank")
    handle.recv(tensor, src, wait)
