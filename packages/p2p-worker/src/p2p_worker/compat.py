"""A thin layer in the style of ``ray.util.collective``, for code moving from Ray.

Call these inside a launched :class:`~p2p_worker.Worker`; the members of a group meet
through the job's rendezvous store under ``group_name``, and every operation runs on
this worker's ``p2p_collective.MultiCollectiveGroup`` for that name (gloo, CPU tensors
and numpy arrays; results are written in place as in Ray).

Example:
    >>> import p2p_worker.compat as col  # doctest: +SKIP
    >>> class W(Worker):  # doctest: +SKIP
    ...     def setup(self, world_size, rank):
    ...         col.init_collective_group(world_size, rank, "gloo", "default")
    ...     def step(self):
    ...         col.allreduce(self.buffer, "default")
    ...         return self.buffer
"""

from __future__ import annotations

import enum
import threading
from typing import Any

from p2p_worker._errors import WorkerError
from p2p_worker._runtime import current_runtime, import_lower

__all__ = [
    "ReduceOp",
    "init_collective_group",
    "destroy_collective_group",
    "is_group_initialized",
    "get_rank",
    "get_collective_group_size",
    "allreduce",
    "broadcast",
    "allgather",
    "reduce",
    "reduce_scatter",
    "barrier",
    "send",
    "recv",
]


class ReduceOp(enum.Enum):
    """Reduction of ``allreduce`` / ``reduce`` / ``reduce_scatter`` (Ray's names)."""

    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"


_lock = threading.Lock()
_groups: dict[str, Any] = {}


def init_collective_group(
    world_size: int, rank: int, backend: str = "gloo", group_name: str = "default"
) -> None:
    """Join the collective group ``group_name`` of ``world_size`` workers as ``rank``.

    Nothing touches the network until the first operation, which waits for all members.

    Args:
        world_size: Number of members (>= 2).
        rank: This worker's rank in the group.
        backend: ``"gloo"`` (CPU). ``"nccl"`` is not available yet.
        group_name: Name shared by the members.

    Raises:
        ValueError: Bad size/rank/backend, or the name is already initialized here.
        WorkerError: Not called inside a launched Worker.

    Example:
        >>> init_collective_group(4, rank, "gloo", "default")  # doctest: +SKIP
    """
    if backend not in ("gloo",):
        raise ValueError(
            f"backend: got {backend!r}; allowed: 'gloo' (the NCCL transport of N-member"
            " groups is not available yet)"
        )
    runtime = current_runtime()
    if runtime is None:
        raise WorkerError(
            "init_collective_group must be called inside a launched p2p_worker.Worker"
        )
    join = import_lower("p2p_collective", "join_ranked_group", "init_collective_group")
    with _lock:
        if group_name in _groups and not _groups[group_name].closed:
            raise ValueError(f"group_name: {group_name!r} is already initialized in this worker")
        _groups[group_name] = join(runtime.collective(), group_name, world_size, rank)


def _group(group_name: str) -> Any:
    with _lock:
        group = _groups.get(group_name)
    if group is None:
        raise ValueError(
            f"group_name: {group_name!r} is not initialized; call init_collective_group first"
        )
    return group


def destroy_collective_group(group_name: str = "default") -> None:
    """Close the group ``group_name`` here (the other members see it as gone)."""
    with _lock:
        group = _groups.pop(group_name, None)
    if group is not None:
        group.close()


def is_group_initialized(group_name: str = "default") -> bool:
    """Whether ``group_name`` is initialized in this worker."""
    with _lock:
        return group_name in _groups


def get_rank(group_name: str = "default") -> int:
    """This worker's rank in ``group_name`` (-1 when not initialized, as in Ray)."""
    with _lock:
        group = _groups.get(group_name)
    return -1 if group is None else int(group.rank)


def get_collective_group_size(group_name: str = "default") -> int:
    """Size of ``group_name`` (-1 when not initialized, as in Ray)."""
    with _lock:
        group = _groups.get(group_name)
    return -1 if group is None else int(group.world_size)


def allreduce(
    tensor: Any,
    group_name: str = "default",
    op: Any = ReduceOp.SUM,
    *,
    timeout: float | None = None,
) -> None:
    """Reduce ``tensor`` over the group, in place on every member."""
    _group(group_name).allreduce(tensor, op=op, timeout=timeout)


def broadcast(
    tensor: Any, src_rank: int = 0, group_name: str = "default", *, timeout: float | None = None
) -> None:
    """Copy ``tensor`` of ``src_rank`` into ``tensor`` of every member."""
    _group(group_name).broadcast_tensor(tensor, src=src_rank, timeout=timeout)


def allgather(
    tensor_list: list[Any],
    tensor: Any,
    group_name: str = "default",
    *,
    timeout: float | None = None,
) -> None:
    """Gather every member's ``tensor`` into ``tensor_list`` (by rank), in place."""
    _group(group_name).allgather(tensor, tensor_list, timeout=timeout)


def reduce(
    tensor: Any,
    dst_rank: int = 0,
    group_name: str = "default",
    op: Any = ReduceOp.SUM,
    *,
    timeout: float | None = None,
) -> None:
    """Reduce ``tensor`` over the group into ``tensor`` of ``dst_rank``."""
    _group(group_name).reduce(tensor, dst=dst_rank, op=op, timeout=timeout)


def reduce_scatter(
    tensor: Any,
    tensor_list: list[Any],
    group_name: str = "default",
    op: Any = ReduceOp.SUM,
    *,
    timeout: float | None = None,
) -> None:
    """Reduce ``tensor_list[r]`` over the group into ``tensor`` of member ``r``."""
    _group(group_name).reduce_scatter(tensor, tensor_list, op=op, timeout=timeout)


def barrier(group_name: str = "default", *, timeout: float | None = None) -> None:
    """Wait until every member reached the barrier."""
    _group(group_name).barrier(timeout=timeout)


def send(
    tensor: Any, dst_rank: int, group_name: str = "default", *, timeout: float | None = None
) -> None:
    """Send ``tensor`` to ``dst_rank``, which calls :func:`recv` with a same-sized tensor."""
    _group(group_name).send_tensor(tensor, dst=dst_rank, timeout=timeout)


def recv(
    tensor: Any, src_rank: int, group_name: str = "default", *, timeout: float | None = None
) -> None:
    """Receive a :func:`send` of ``src_rank`` into ``tensor`` (in place)."""
    _group(group_name).recv_tensor(tensor, src=src_rank, timeout=timeout)
