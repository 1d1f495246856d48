"""Group management in Ray's names: initialize, declare, destroy, query, availability."""

from __future__ import annotations

from collections.abc import Sequence

from p2p_worker._raycoll import _registry
from p2p_worker._raycoll._checks import check_gloo_timeout, check_group_name, check_spec
from p2p_worker._raycoll._errors import RayCollectiveError
from p2p_worker._raycoll._group import GroupHandle
from p2p_worker._raycoll._types import Backend, check_backend


def nccl_available() -> bool:
    """Whether the NCCL backend can be used: False until the accelerator transport exists."""
    return False


def gloo_available() -> bool:
    """Whether the gloo backend can be used: always True (it comes with torch)."""
    return True


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` (``"gloo"``, ``"torch_gloo"``, ``"nccl"``, any case) can be used.

    Example:
        >>> is_backend_available("torch_gloo"), is_backend_available("nccl")
        (True, False)
    """
    return isinstance(backend, str) and backend.upper() in ("GLOO", "TORCH_GLOO")


def register_collective_backend(name: str, group_cls: type) -> None:
    """Ray's hook for a custom backend class; not supported here.

    Raises:
        RayCollectiveError: Always (groups here run on p2p-collective's transports).
    """
    raise RayCollectiveError(
        f"register_collective_backend({name!r}, ...): custom backends are not supported;"
        " groups run on p2p-collective (backend 'gloo')"
    )


def init_collective_group(
    world_size: int,
    rank: int,
    backend: str = Backend.NCCL,
    group_name: str = "default",
    gloo_timeout: int = 30000,
) -> None:
    """Join the collective group ``group_name`` of ``world_size`` members as ``rank``.

    Call it in every member (any process connected to Ray: a ``@ray.remote`` actor or
    task, the driver, or a launched p2p ``Worker``). It returns at once: the members
    meet at the first operation, which waits for all of them (so members may initialize
    in any order and groups in any order). A group of one needs neither Ray nor the
    network.

    Args:
        world_size: Number of members (>= 1).
        rank: This member's rank, ``0 <= rank < world_size``.
        backend: ``"gloo"`` or ``"torch_gloo"`` (or ``Backend.GLOO``). The default is
            NCCL, as in Ray, which raises until the accelerator transport exists, so
            pass ``"gloo"``.
        group_name: The group's name, shared by its members; groups of the same name in
            another Ray namespace or job never meet this one.
        gloo_timeout: Milliseconds to wait for the job's rendezvous actor (as in Ray,
            where it bounds the rendezvous); the first operation waits for the other
            members as long as its own ``timeout`` allows.

    Raises:
        GroupExistsError: ``group_name`` is already initialized in this process (a
            ``RuntimeError``, as in Ray).
        GroupSpecError: ``world_size`` or ``rank`` out of range (an ``AssertionError``
            and a ``ValueError``).
        BackendUnavailableError: ``backend`` is NCCL or unknown (a ``ValueError``).
        CollectiveArgumentError: ``group_name`` is empty or ``gloo_timeout`` negative.
        RayCollectiveError: More than one member and no Ray (call ``ray.init()``).

    Example:
        >>> init_collective_group(1, 0, "gloo", "solo")
        >>> get_collective_group_size("solo")
        1
        >>> destroy_collective_group("solo")
    """
    check_group_name(group_name)
    world_size, rank = check_spec(world_size, rank)
    check_backend(backend)
    wait = check_gloo_timeout(gloo_timeout)
    _registry.init(world_size, rank, group_name, wait or None)


def create_collective_group(
    actors: Sequence[object],
    world_size: int,
    ranks: Sequence[int],
    backend: str = Backend.NCCL,
    group_name: str = "default",
    gloo_timeout: int = 30000,
) -> None:
    """Declare ``actors`` as the members of ``group_name`` (call it in the driver).

    The actors then use ``group_name`` in any operation without calling
    :func:`init_collective_group`: their first call finds the declaration through the
    job's rendezvous actor and joins with the rank given here.

    Args:
        actors: Ray actor handles, one per member.
        world_size: Number of members: ``len(actors)``.
        ranks: The rank of each actor, a permutation of ``0..len(actors)-1``.
        backend: ``"gloo"`` / ``"torch_gloo"`` (NCCL, the default as in Ray, raises).
        group_name: The group's name.
        gloo_timeout: As for :func:`init_collective_group`.

    Raises:
        CollectiveArgumentError: Not actor handles, a rank per actor missing, ranks not
            a permutation, or ``world_size`` not the number of actors (``RuntimeError``
            s, as in Ray, and ``ValueError`` s).
        GroupExistsError: ``group_name`` is already declared in this job.
        BackendUnavailableError: ``backend`` is NCCL or unknown.

    Example:
        >>> actors = [Member.remote() for _ in range(2)]  # doctest: +SKIP
        >>> create_collective_group(actors, 2, [0, 1], "gloo", "grads")  # doctest: +SKIP
        >>> ray.get([a.allreduce_grads.remote() for a in actors])  # doctest: +SKIP
    """
    wait = check_gloo_timeout(gloo_timeout)
    _registry.declare(actors, world_size, ranks, backend, group_name, wait or None)


def destroy_collective_group(group_name: str = "default") -> None:
    """Close this process's membership of ``group_name`` and drop its declaration.

    The other members see this one as gone (their pending and later operations fail
    with ``PeerError``), so call it after a final :func:`barrier` or in every member.
    A name that is not initialized here is ignored, as in Ray. The name can then be
    initialized (or declared) again; the new group never meets the old one's state.

    Example:
        >>> destroy_collective_group("never-initialized")
    """
    _registry.destroy(group_name)


def is_group_initialized(group_name: str = "default") -> bool:
    """Whether ``group_name`` is initialized in this process.

    Example:
        >>> is_group_initialized("never-initialized")
        False
    """
    return _registry.find(group_name) is not None


def get_rank(group_name: str = "default") -> int:
    """This process's rank in ``group_name``, or -1 when it is not initialized here.

    Example:
        >>> get_rank("never-initialized")
        -1
    """
    handle = _registry.find(group_name)
    return -1 if handle is None else handle.rank


def get_collective_group_size(group_name: str = "default") -> int:
    """The number of members of ``group_name``, or -1 when it is not initialized here.

    Example:
        >>> get_collective_group_size("never-initialized")
        -1
    """
    handle = _registry.find(group_name)
    return -1 if handle is None else handle.world_size


def get_group_handle(group_name: str = "default") -> GroupHandle:
    """This process's handle of ``group_name``, joining a group declared for this actor.

    Returns:
        The :class:`GroupHandle`: ``rank``, ``world_size``, ``group_name``, ``backend()``
        and ``destroy_group()`` as Ray's; ``group`` (the p2p ``MultiCollectiveGroup``,
        whose methods also run asynchronously) and ``pair_group(peer)``.

    Raises:
        GroupNotInitializedError: Neither initialized here nor declared for this actor
            (a ``RuntimeError``, as in Ray).

    Example:
        >>> init_collective_group(1, 0, "gloo", "solo")
        >>> get_group_handle("solo").world_size
        1
        >>> destroy_collective_group("solo")
    """
    return _registry.get(group_name)
