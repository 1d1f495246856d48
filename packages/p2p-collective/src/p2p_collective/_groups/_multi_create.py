"""Creating (and caching) N-member groups on a :class:`~p2p_collective.Collective`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from p2p_collective._errors import GroupClosedError
from p2p_collective._groups._multi import MultiCollectiveGroup
from p2p_collective._peers._address import address_name

MULTI_PREFIX = "coll:"
"""Cache keys of N-member groups start with this, so they never clash with two-party groups."""


def _names(collective: Any, addresses: Sequence[object]) -> list[str]:
    if isinstance(addresses, (str, bytes)) or not isinstance(addresses, Sequence):
        raise TypeError(
            f"worker_addresses: expected a sequence of addresses, got {type(addresses).__name__}"
        )
    names = [address_name(a, f"worker_addresses[{i}]") for i, a in enumerate(addresses)]
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(
            f"worker_addresses: got {names!r}; allowed: two or more distinct addresses"
        )
    if collective.name not in names:
        raise ValueError(
            f"worker_addresses: got {names!r}; allowed: a list that includes this"
            f" process's own address {collective.name!r}"
        )
    return sorted(names)


def _cached(collective: Any, key: str, make: Any) -> MultiCollectiveGroup:
    with collective._lock:
        if collective._closed:
            raise GroupClosedError(f"Collective {collective.name!r} is closed")
        group = collective._groups.get(key)
        if not isinstance(group, MultiCollectiveGroup) or group.closed:
            group = make(key)
            collective._groups[key] = group
        assert isinstance(group, MultiCollectiveGroup)
        return group


def _forget(collective: Any, group: MultiCollectiveGroup) -> None:
    with collective._lock:
        if collective._groups.get(group.name) is group:
            del collective._groups[group.name]


def _make(
    collective: Any, key: str, rank: int, names: list[str], alias: str | None = None
) -> MultiCollectiveGroup:
    return MultiCollectiveGroup(
        name=key,
        rank=rank,
        member_names=names,
        store=collective._store,
        links=collective._links,
        config=collective.config,
        init_timeout=collective.init_timeout,
        owner=collective,
        on_close=lambda g: _forget(collective, g),
        auth=collective._auth,
        peers=[None if r == rank else collective.peers.get(n) for r, n in enumerate(names)],
        instance=collective.instance,
        announce_as=alias,
    )


def create_multi_group(
    collective: Any, worker_addresses: Sequence[object], group_name: str | None = None
) -> MultiCollectiveGroup:
    """Return the N-member group of these addresses on ``collective`` (N >= 2), cached.

    ``Collective.create_collective_group`` calls this for more than two addresses; call it
    directly to get collectives on a two-member group too (it is a different group from
    the two-party send/recv group of the same pair). Ranks are the indices of the sorted
    member names.

    Args:
        collective: This process's ``Collective``.
        worker_addresses: Two or more distinct addresses (str or ``get_name()``), one of
            them this process's own.
        group_name: Optional key shared by all members, instead of the member names.

    Returns:
        The :class:`MultiCollectiveGroup`.

    Raises:
        TypeError: An address is neither a string nor has ``get_name()``.
        ValueError: Fewer than two distinct addresses, or this process's is missing.
        GroupClosedError: The Collective was closed.

    Example:
        >>> g = create_multi_group(coll, ["a", "b", "c"])  # doctest: +SKIP
        >>> g.allreduce(torch.ones(4))  # doctest: +SKIP
    """
    names = _names(collective, worker_addresses)
    if group_name is not None and (not isinstance(group_name, str) or not group_name):
        raise ValueError(f"group_name: got {group_name!r}; allowed: a non-empty string or None")
    key = MULTI_PREFIX + (group_name if group_name is not None else "+".join(names))
    rank = names.index(collective.name)
    return _cached(collective, key, lambda k: _make(collective, k, rank, names))


def join_ranked_group(
    collective: Any, group_name: str, world_size: int, rank: int
) -> MultiCollectiveGroup:
    """Join the group ``group_name`` of ``world_size`` members as ``rank`` (explicit ranks).

    The members need not know each other's addresses: they meet in the rendezvous store
    under ``group_name``. This is what ``init_collective_group`` of p2p-worker's
    compatibility layer uses.

    Args:
        collective: This process's ``Collective``.
        group_name: Name shared by all members.
        world_size: Number of members (>= 2).
        rank: This member's rank in ``0..world_size-1``.

    Returns:
        The :class:`MultiCollectiveGroup` (cached by name).

    Raises:
        ValueError: Bad name, size or rank.
        GroupClosedError: The Collective was closed.

    Example:
        >>> g = join_ranked_group(coll, "default", 4, rank)  # doctest: +SKIP
    """
    if not isinstance(group_name, str) or not group_name:
        raise ValueError(f"group_name: got {group_name!r}; allowed: a non-empty string")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 2:
        raise ValueError(f"world_size: got {world_size!r}; allowed: an int >= 2")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ValueError(f"rank: got {rank!r}; allowed: 0..{world_size - 1}")
    key = f"{MULTI_PREFIX}ranked/{group_name}/{world_size}"
    names = [f"{group_name}[{r}]" for r in range(world_size)]
    alias = names[rank]  # the name the other members know this one by
    names[rank] = f"{collective.name} ({alias})"
    group = _cached(collective, key, lambda k: _make(collective, k, rank, names, alias))
    if group.rank != rank:
        raise ValueError(
            f"rank: got {rank}, but this process already joined {group_name!r} as rank {group.rank}"
        )
    return group
