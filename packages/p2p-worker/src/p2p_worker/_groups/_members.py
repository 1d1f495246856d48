"""The members of a launched group as users see them: ranks, and the methods a group calls.

:class:`WorkerRank` is one entry of ``WorkerGroup.worker_info_list`` (RLinf's shape);
:func:`public_methods` is what a group forwards as ``group.<method>(...)`` to every
worker (or to the ranks of ``execute_on``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from ray.actor import ActorHandle

from p2p_worker._info import WorkerInfo

# Public Worker members that make no sense as a remote call on every worker.
_NOT_REMOTE = frozenset({"create_group", "timer", "worker_timer"})


@dataclass(frozen=True)
class WorkerRank:
    """One worker of a group, as RLinf's ``WorkerGroup.worker_info_list`` lists it.

    Attributes:
        worker: The worker's Ray actor handle.
        rank: Its rank in the group.
        info: Its :class:`WorkerInfo`.
    """

    worker: ActorHandle[object]
    rank: int
    info: WorkerInfo


def public_methods(cls: type) -> dict[str, Callable[..., object]]:
    """Return the public instance methods of a worker class, by name."""
    out: dict[str, Callable[..., object]] = {}
    for name in dir(cls):
        if name.startswith("_") or name in _NOT_REMOTE:
            continue
        attr = inspect.getattr_static(cls, name)
        if inspect.isfunction(attr):
            out[name] = attr
    return out
