"""This process's table of named groups, and groups declared from the driver.

``init_collective_group`` puts a :class:`~._group.GroupHandle` here; every operation
looks its group up by name. A name missing here may have been declared from the driver
with ``create_collective_group``: the lookup then asks the job's rendezvous actor for the
declaration, finds this actor's rank in it and initializes the group (as Ray does).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import ray

from p2p_worker._raycoll._checks import check_group_name, check_spec
from p2p_worker._raycoll._errors import (
    CollectiveArgumentError,
    GroupExistsError,
    GroupNotInitializedError,
)
from p2p_worker._raycoll._group import GroupHandle
from p2p_worker._raycoll._service import get_service
from p2p_worker._raycoll._types import check_backend

_lock = threading.Lock()
_init_lock = threading.Lock()
_groups: dict[str, GroupHandle] = {}


def find(group_name: str) -> GroupHandle | None:
    """The group ``group_name`` of this process, or None (no lookup elsewhere)."""
    with _lock:
        return _groups.get(group_name)


def init(world_size: int, rank: int, group_name: str, service_timeout: float | None) -> GroupHandle:
    """Initialize ``group_name`` here (see ``init_collective_group``).

    The arguments are checked by the caller.

    Raises:
        GroupExistsError: The name is already initialized in this process.
        RayCollectiveError: No rendezvous reachable.
    """
    with _init_lock:  # one initialization at a time, so a name is claimed once
        if find(group_name) is not None:
            raise GroupExistsError(
                f"group_name: {group_name!r} is already initialized in this process;"
                " destroy_collective_group it first"
            )
        handle = GroupHandle.join(world_size, rank, group_name, service_timeout)
        with _lock:
            _groups[group_name] = handle
        return handle


def get(group_name: str) -> GroupHandle:
    """The group ``group_name``, initializing a group declared for this actor if needed.

    Raises:
        GroupNotInitializedError: Neither initialized here nor declared for this actor.
    """
    handle = find(group_name)
    if handle is not None:
        return handle
    declared = _declaration(group_name)
    if declared is None:
        raise GroupNotInitializedError(
            f"the collective group {group_name!r} is not initialized in this process:"
            " call init_collective_group in every member, or create_collective_group"
            " from the driver"
        )
    world_size, rank, service_timeout = declared
    try:
        return init(world_size, rank, group_name, service_timeout)
    except GroupExistsError:  # another thread of this actor got there first
        return get(group_name)


def _declaration(group_name: str) -> tuple[int, int, float | None] | None:
    if not ray.is_initialized():
        return None
    actor_id = ray.get_runtime_context().get_actor_id()
    service = get_service(create=False)
    if actor_id is None or service is None:
        return None
    info = ray.get(service.lookup.remote(group_name))
    if info is None:
        return None
    actor_ids, world_size, ranks, _backend, service_timeout = info
    if actor_id not in actor_ids:
        raise GroupNotInitializedError(
            f"the collective group {group_name!r} was declared with create_collective_group,"
            f" but this actor ({actor_id}) is not among its members"
        )
    return world_size, ranks[actor_ids.index(actor_id)], service_timeout


def destroy(group_name: str) -> None:
    """Close ``group_name`` here and drop its declaration, if any (as Ray does)."""
    with _lock:
        handle = _groups.pop(group_name, None)
    if handle is not None:
        handle.destroy_group()
    if ray.is_initialized():
        service = get_service(create=False)
        if service is not None:
            ray.get(service.forget.remote(group_name))


def declare(
    actors: Sequence[object],
    world_size: int,
    ranks: Sequence[int],
    backend: object,
    group_name: str,
    service_timeout: float | None,
) -> None:
    """Record ``actors`` as the members of ``group_name`` (see ``create_collective_group``).

    Raises:
        CollectiveArgumentError: Bad actors, ranks or size (also ``RuntimeError`` s, as
            in Ray).
        GroupExistsError: A group of that name is already declared in this job.
        BackendUnavailableError: The backend is not gloo.
    """
    check_group_name(group_name)
    backend_name = check_backend(backend)
    if isinstance(actors, (str, bytes)) or not isinstance(actors, Sequence):
        raise CollectiveArgumentError(
            f"actors: got {type(actors).__name__}; allowed: a list of Ray actor handles"
        )
    ids = []
    for i, actor in enumerate(actors):
        actor_id = getattr(actor, "_ray_actor_id", None)
        if actor_id is None:
            raise CollectiveArgumentError(
                f"actors[{i}]: got {type(actor).__name__}; allowed: a Ray actor handle"
            )
        ids.append(actor_id.hex())
    if len(set(ids)) != len(ids):
        raise CollectiveArgumentError("actors: the same actor appears twice")
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Sequence):
        raise CollectiveArgumentError(f"ranks: got {ranks!r}; allowed: a list of ints")
    ranks = list(ranks)
    if len(ranks) != len(ids):
        raise CollectiveArgumentError(
            f"ranks: got {len(ranks)} ranks for {len(ids)} actors; allowed: one rank per actor"
        )
    if sorted(ranks) != list(range(len(ranks))):
        raise CollectiveArgumentError(
            f"ranks: got {ranks!r}; allowed: a permutation of 0..{len(ranks) - 1}"
        )
    if world_size != len(ids):
        check_spec(world_size, 0)
        raise CollectiveArgumentError(
            f"world_size: got {world_size!r} for {len(ids)} actors; allowed: {len(ids)}"
        )
    info = (ids, world_size, ranks, backend_name, service_timeout)
    if not ray.get(get_service().declare.remote(group_name, info)):
        raise GroupExistsError(
            f"group_name: {group_name!r} is already declared in this job; destroy it in its"
            " members (destroy_collective_group) before declaring it again"
        )
