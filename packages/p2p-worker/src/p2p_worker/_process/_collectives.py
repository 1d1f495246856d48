"""Worker-level collectives: groups over the members of one or several worker groups."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, overload

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from p2p_asyncwork import AsyncWork
from p2p_collective import Collective, MultiCollectiveGroup, create_multi_group
from p2p_worker._address import WorkerAddress, member_address, parse_group_name
from p2p_worker._errors import WorkerError
from p2p_worker._process._options import CollectiveGroupOptions, check_options

if TYPE_CHECKING:
    from p2p_worker._runtime._state import WorkerRuntime

Ranks: TypeAlias = "int | tuple[int, ...] | list[int] | list[tuple[int, ...]]"
"""RLinf's ranks of one group: one worker (an int or a rank path) or a list of them."""
Member: TypeAlias = "str | WorkerAddress | tuple[str, Ranks]"
"""A whole group by name, a ``(group_name, ranks)`` pair, or one worker's address."""
Members: TypeAlias = "Member | Sequence[Member]"
"""The members of a collective: one :data:`Member` or a list of them."""

SIZE_KEY = "p2p/worker-group-size/{}"
SIZE_TIMEOUT = 60.0


def _members(
    spec: object,
    own: WorkerAddress,
    own_size: int,
    store: TCPStore | None,
    timeout: float | None,
) -> list[WorkerAddress]:
    """Resolve a members spec into addresses (sizes of other groups come from the store)."""
    # spec is checked item by item at run time: anything else raises TypeError below
    items: list[object] = (
        [spec] if isinstance(spec, (str, WorkerAddress, tuple)) else list(spec)  # type: ignore[call-overload]
    )
    if not items:
        raise ValueError(
            "members: got an empty list; allowed: group names, (name, ranks), addresses"
        )
    out: list[WorkerAddress] = []
    for i, item in enumerate(items):
        if isinstance(item, WorkerAddress):
            out.append(item)
        elif isinstance(item, str):
            group = parse_group_name(item, f"members[{i}]")
            if group == own.get_parent_address():
                size = own_size
            elif store is None:
                raise ValueError(
                    f"members[{i}]: {item!r} names a whole other group, whose size is unknown"
                    f" here; give ({item!r}, ranks)"
                )
            else:
                size = _group_size(store, group.get_name(), timeout)
            out += [group.get_child_address(r) for r in range(size)]
        elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str):
            name, ranks = item
            # As in RLinf: an int or a tuple (a rank path) is one worker, a list is several.
            ranks = list(ranks) if isinstance(ranks, list) else [ranks]
            if not ranks:
                raise ValueError(f"members[{i}]: {item!r} lists no rank")
            out += [member_address(name, r, f"members[{i}]", f"members[{i}] ranks") for r in ranks]
        else:
            raise TypeError(
                f"members[{i}]: got {item!r}; allowed: a group name, (group_name, ranks) or a"
                " WorkerAddress"
            )
    if len(set(out)) != len(out):
        raise ValueError(f"members: the same worker appears twice in {[str(a) for a in out]}")
    if own not in out:
        raise ValueError(f"members: {[str(a) for a in out]} does not include this worker ({own})")
    return out


def _group_size(store: TCPStore, group: str, timeout: float | None) -> int:
    key = SIZE_KEY.format(group)
    wait = datetime.timedelta(seconds=SIZE_TIMEOUT if timeout is None else timeout)
    try:
        store.wait([key], wait)
        return int(bytes(store.get(key)).decode())
    except Exception as exc:
        raise WorkerError(
            f"the size of worker group {group!r} is unknown: none of its workers created a"
            f" collective within {wait.total_seconds()} s (or pass ({group!r}, ranks))"
        ) from exc


class CollectivesMixin:
    """Collectives over workers of one or several groups (mixed into :class:`Worker`)."""

    _world_size: int

    if TYPE_CHECKING:  # provided by Worker

        @property
        def collective(self) -> Collective: ...

        @property
        def worker_address(self) -> WorkerAddress: ...

        def _p2p_worker_runtime(self) -> WorkerRuntime: ...

    def create_collective(
        self, members: Members, name: str | None = None, *, timeout: float | None = None
    ) -> MultiCollectiveGroup:
        """The collective group (``p2p_collective.MultiCollectiveGroup``) of ``members``.

        Every member calls this with the same members (and name); ranks in the returned
        group are the members in sorted address order (group name, then rank).

        Args:
            members: A worker group name (all its workers), or a list of group names,
                ``(group_name, ranks)`` pairs and ``WorkerAddress`` es. The sizes of
                other groups named in full are read from the job's store, where every
                worker creating a collective publishes its own group's size.
            name: Optional key shared by all members (else the sorted member names).
            timeout: Seconds to wait for another group's size (None: 60 s).

        Returns:
            The group: ``broadcast``, ``allreduce``, ``reduce``, ``allgather``,
            ``reduce_scatter``, ``barrier`` (sync or ``async_op=True``).

        Raises:
            TypeError, ValueError: Bad members (or this worker is not among them).
            WorkerError: Not launched, or another group's size is unknown.

        Example:
            >>> g = self.create_collective(["trainer", "rollout"])  # doctest: +SKIP
            >>> g.allreduce(grad)  # doctest: +SKIP
        """
        me = self.worker_address
        coll = self.collective
        store = self._p2p_worker_runtime().store()  # the job's store client
        own_group = me.get_parent_address()
        assert own_group is not None  # a worker's address has at least one rank
        store.set(SIZE_KEY.format(own_group.get_name()), str(self._world_size))
        addresses = _members(members, me, self._world_size, store, timeout)
        return create_multi_group(coll, addresses, group_name=name)

    @overload
    def broadcast(
        self,
        object: object = ...,
        groups: Members | None = ...,
        src: tuple[str, int | tuple[int, ...]] | None = ...,
        async_op: Literal[False] = ...,
        options: CollectiveGroupOptions | None = ...,
        *,
        members: Members | None = ...,
        src_group_name: str | None = ...,
        src_rank: int | None = ...,
        timeout: float | None = ...,
    ) -> Any: ...
    @overload
    def broadcast(
        self,
        object: object,
        groups: Members | None,
        src: tuple[str, int | tuple[int, ...]] | None,
        async_op: Literal[True],
        options: CollectiveGroupOptions | None = ...,
        *,
        members: Members | None = ...,
        src_group_name: str | None = ...,
        src_rank: int | None = ...,
        timeout: float | None = ...,
    ) -> AsyncWork[Any]: ...
    @overload
    def broadcast(
        self,
        object: object = ...,
        groups: Members | None = ...,
        src: tuple[str, int | tuple[int, ...]] | None = ...,
        *,
        async_op: Literal[True],
        options: CollectiveGroupOptions | None = ...,
        members: Members | None = ...,
        src_group_name: str | None = ...,
        src_rank: int | None = ...,
        timeout: float | None = ...,
    ) -> AsyncWork[Any]: ...
    @overload
    def broadcast(
        self,
        object: object = ...,
        groups: Members | None = ...,
        src: tuple[str, int | tuple[int, ...]] | None = ...,
        async_op: bool = ...,
        options: CollectiveGroupOptions | None = ...,
        *,
        members: Members | None = ...,
        src_group_name: str | None = ...,
        src_rank: int | None = ...,
        timeout: float | None = ...,
    ) -> Any: ...

    def broadcast(
        self,
        object: object = None,
        groups: Members | None = None,
        src: tuple[str, int | tuple[int, ...]] | None = None,
        async_op: bool = False,
        options: CollectiveGroupOptions | None = None,
        *,
        members: Members | None = None,
        src_group_name: str | None = None,
        src_rank: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Broadcast ``object`` from one worker to every worker of ``groups``.

        Every member calls it with the same ``groups`` (and source). Two forms:

        - RLinf's: ``broadcast(obj, groups=[(group_name, ranks), ...], src=(name, rank))``.
          ``ranks`` is an int (one worker), a list of ints (several), a tuple (one
          worker's rank path) or a list of tuples. Without ``src`` the source is the
          first worker of the expanded list.
        - p2p-worker's: ``broadcast(obj, members=..., src_group_name=..., src_rank=...)``
          with members as for :meth:`create_collective` (group names in full, pairs,
          addresses); the source defaults to rank 0 of this worker's group. Members may
          also come second positionally, as before RLinf's form existed: a list that is
          not all ``(group_name, ranks)`` pairs, with no ``src``, is read as members.

        Like :meth:`send`: tensors and containers of tensors travel as raw bytes, other
        objects pickled; never compressed.

        Args:
            object: The payload on the source worker (ignored elsewhere; pass None).
            groups: RLinf's list of ``(group_name, ranks)`` pairs.
            src: RLinf's ``(group_name, rank)`` of the source.
            async_op: Return an ``AsyncWork`` instead of waiting.
            options: RLinf's :class:`~p2p_worker.CollectiveGroupOptions`, validated.
            members: p2p-worker's members (instead of ``groups``).
            src_group_name: p2p-worker's source group (instead of ``src``).
            src_rank: p2p-worker's source rank (instead of ``src``).
            timeout: Seconds the broadcast may take (None: the job's default).

        Returns:
            The object on every member, or (``async_op=True``) an ``AsyncWork`` whose
            ``wait()`` returns it.

        Raises:
            TypeError: ``groups``, ``src`` or ``options`` has the wrong shape or type.
            ValueError: Neither or both of ``groups`` and ``members``; the source or
                this worker is not a member. Others as :meth:`create_collective`.

        Example:
            >>> w = self.broadcast(weights, groups=[("trainer", 0), ("rollout", [0, 1])],
            ...                    src=("trainer", 0))  # doctest: +SKIP
        """
        check_options(options)
        if groups is not None and members is None and src is None and not _rlinf_groups(groups):
            # p2p-worker's first form, members given positionally (group names,
            # addresses): broadcast(obj, ["trainer", "rollout"], src_group_name=...)
            groups, members = None, groups
        if (groups is None) == (members is None):
            raise ValueError(
                "broadcast: give groups=[(group_name, ranks), ...] (RLinf) or members= "
                "(p2p-worker), exactly one of them"
            )
        if groups is not None:
            if not isinstance(groups, list) or not groups:
                raise TypeError(
                    f"groups must be a non-empty list of (group_name, ranks) tuples, got {groups!r}"
                )
            for entry in groups:
                if not (isinstance(entry, tuple) and len(entry) == 2):
                    raise TypeError(
                        f"groups: each entry must be a (group_name, ranks) tuple, got {entry!r}"
                    )
            members = groups
        if src is not None:
            if src_group_name is not None or src_rank is not None:
                raise ValueError("give src=(group_name, rank) or src_group_name/src_rank")
            if not (isinstance(src, tuple) and len(src) == 2 and isinstance(src[0], str)):
                raise TypeError(
                    f"src must be a (group_name, rank) tuple, got {src!r}; for p2p-worker's "
                    f"form use src_group_name= and src_rank="
                )
            src_addr = member_address(src[0], src[1], "src", "src")
        elif src_group_name is not None or src_rank is not None or groups is None:
            own = self.worker_address.get_parent_address()
            assert own is not None  # a worker's address has at least one rank
            src_addr = member_address(
                src_group_name or own.get_name(),
                0 if src_rank is None else src_rank,
                "src_group_name",
                "src_rank",
            )
        else:
            src_addr = _members(groups, self.worker_address, self._world_size, None, None)[0]
        assert members is not None  # exactly one of groups and members was given
        group = self.create_collective(members)
        if src_addr.get_name() not in group.member_names:
            raise ValueError(f"src: {src_addr} is not among the members {group.member_names}")
        return group.broadcast(
            object,
            src=group.member_names.index(src_addr.get_name()),
            async_op=async_op,
            timeout=timeout,
        )


def _rlinf_groups(groups: object) -> bool:
    """Whether ``groups`` has RLinf's shape: a list of ``(group_name, ranks)`` tuples."""
    return isinstance(groups, list) and all(
        isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[0], str)
        for entry in groups
    )
