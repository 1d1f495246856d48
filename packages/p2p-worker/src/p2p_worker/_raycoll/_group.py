"""One member's handle on a named group: what ``get_group_handle`` returns.

A group of N >= 2 members runs its collectives on one ``p2p_collective``
``MultiCollectiveGroup`` (gloo, N ranks) and its ``send`` / ``recv`` on two-party
groups, one per pair of members that exchange tensors, so two members on one node move
the bytes through shared memory. A group of two members on one node runs its
collectives over shared memory too, on a pair of its own, and a group of three or more
on one node on a ring of such pairs (p2p-collective's ``PairCollectives`` and
``RingCollectives``, from ``p2p_collective.internal``). All of
them belong to a ``Collective`` of this group alone, named after the group, its
incarnation and the member's rank; nothing touches the network before the first
operation, which waits for the other members.

Incarnations: every member counts in the rendezvous store how often it initialized a
group of this name and size; the k-th initialization of one member meets the k-th of
the others, so a destroyed and re-created group never meets its predecessor's keys.

A group of one needs neither Ray nor the network: the collectives leave the tensor as
it is (the result over one member) or copy it where the operation says.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import ray
import torch

from p2p_collective import Collective, CollectiveGroup, MultiCollectiveGroup
from p2p_collective.internal import PairCollectives, RingCollectives, check_like, check_reducible
from p2p_worker._raycoll._checks import Tensor, as_torch, check_not_self, check_rank
from p2p_worker._raycoll._env import Meeting, meeting
from p2p_worker._raycoll._errors import CollectiveArgumentError, TensorTypeError
from p2p_worker._raycoll._types import Backend
from p2p_worker._runtime._oracle import actor_id_alive

INCARNATION_KEY = "p2p-raycoll/{name}/{size}/incarnation/{rank}"
RING_ENV = "P2P_RAYCOLL_RING"
"""Set to ``"0"`` in every member to keep groups of three or more on gloo (for
benchmarks: all members must see the same value, or they deadlock)."""
ACTOR_KEY = "p2p-raycoll/{name}/{size}/{incarnation}/actor/{rank}"
"""The Ray actor id of a member ('' for a driver or task), for the liveness oracle."""


@contextlib.contextmanager
def _arguments() -> Iterator[None]:
    """Re-raise the lower layer's ``ValueError`` / ``TypeError`` as this layer's types."""
    try:
        yield
    except TypeError as exc:
        raise TensorTypeError(str(exc)) from exc
    except ValueError as exc:
        if isinstance(exc, CollectiveArgumentError):
            raise
        raise CollectiveArgumentError(str(exc)) from exc


class GroupHandle:
    """This process's membership of one named collective group.

    Use the module functions of :mod:`p2p_worker.compat` (they check arguments in Ray's
    terms first); the handle adds what Ray's handle has (``rank``, ``world_size``,
    ``group_name``, ``backend()``, ``destroy_group()``) and the p2p groups underneath.

    Args:
        world_size: Number of members.
        rank: This member's rank.
        group_name: The group's name.
        incarnation: This member's count of initializations of the group (0 for one).
        where: Where the members meet (None for a group of one).
        init_timeout: Seconds the first operation of each group waits for the others
            (None: the operation's own timeout).
        service_timeout: Seconds :meth:`join` waited at most for the job's rendezvous
            actor: ``init_collective_group``'s ``gloo_timeout`` (None: no limit).
    """

    def __init__(
        self,
        *,
        world_size: int,
        rank: int,
        group_name: str,
        incarnation: int,
        where: Meeting | None,
        init_timeout: float | None = None,
        service_timeout: float | None = None,
    ) -> None:
        self._world_size = world_size
        self._rank = rank
        self._group_name = group_name
        self._incarnation = incarnation
        self._where = where
        self._init_timeout = init_timeout
        self._service_timeout = service_timeout
        self._lock = threading.Lock()
        self._collective: Collective | None = None
        self._multi: MultiCollectiveGroup | None = None
        self._two: PairCollectives | RingCollectives | None = None  # see _pair_collectives
        self._two_decided = False
        self._destroyed = False

    @classmethod
    def join(
        cls, world_size: int, rank: int, group_name: str, service_timeout: float | None
    ) -> GroupHandle:
        """Join ``group_name`` as ``rank``: claim this member's next incarnation of it.

        Raises:
            RayCollectiveError: No rendezvous reachable (see :func:`._env.meeting`).
        """
        if world_size == 1:
            return cls(
                world_size=1,
                rank=0,
                group_name=group_name,
                incarnation=0,
                where=None,
                service_timeout=service_timeout,
            )
        where = meeting(service_timeout)
        key = INCARNATION_KEY.format(name=group_name, size=world_size, rank=rank)
        incarnation = int(where.store.add(key, 1))
        actor = (ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None) or ""
        where.store.set(
            ACTOR_KEY.format(name=group_name, size=world_size, incarnation=incarnation, rank=rank),
            actor,
        )
        return cls(
            world_size=world_size,
            rank=rank,
            group_name=group_name,
            incarnation=incarnation,
            where=where,
            service_timeout=service_timeout,
        )

    def __repr__(self) -> str:
        state = "destroyed" if self._destroyed else "open"
        return (
            f"<GroupHandle {self._group_name!r} rank={self._rank}/{self._world_size}"
            f" incarnation={self._incarnation} {state}>"
        )

    @property
    def rank(self) -> int:
        """This member's rank."""
        return self._rank

    @property
    def world_size(self) -> int:
        """Number of members."""
        return self._world_size

    @property
    def group_name(self) -> str:
        """The group's name."""
        return self._group_name

    @property
    def gloo_timeout(self) -> int | None:
        """The ``gloo_timeout`` this member initialized the group with (milliseconds).

        None when it was 0 (no limit). Where Ray's gloo group answers
        ``_gloo_context.getTimeout()``, this is the public way to read it back.

        Example:
            >>> init_collective_group(1, 0, "gloo", "t", gloo_timeout=40000)  # doctest: +SKIP
            >>> get_group_handle("t").gloo_timeout  # doctest: +SKIP
            40000
        """
        s = self._service_timeout
        return None if s is None else round(s * 1000)

    @classmethod
    def backend(cls) -> str:
        """The backend: always ``Backend.GLOO`` in this version."""
        return Backend.GLOO

    # -- the p2p groups underneath --------------------------------------------------------

    def member_name(self, rank: int) -> str:
        """The p2p address name of member ``rank`` in this incarnation."""
        return f"raycoll:{self._group_name}#{self._incarnation}[{rank}]"

    def _member_alive(self, name: str) -> bool:
        """The liveness oracle of this group's ``Collective``: Ray's word on a member.

        A member that recorded a Ray actor id at :meth:`join` is dead when Ray's actor
        table says so; anything else (a driver or task member, an id not recorded yet,
        a name of another group) counts as alive, and waiting goes on.
        """
        where = self._where
        # pair groups name members "raycoll:<group>#<incarnation>[r]", the N-member
        # group "<group>#<incarnation>[r]"
        core = f"{self._group_name}#{self._incarnation}["
        name = name.removeprefix("raycoll:")
        if where is None or not name.startswith(core) or not name.endswith("]"):
            return True
        rank = name[len(core) : -1]
        key = ACTOR_KEY.format(
            name=self._group_name, size=self._world_size, incarnation=self._incarnation, rank=rank
        )
        try:
            if not where.store.check([key]):
                return True
            actor = where.store.get(key).decode()
        except Exception:
            return True
        return not actor or actor_id_alive(actor)

    def _own_collective(self) -> Collective:
        with self._lock:
            if self._destroyed:
                raise CollectiveArgumentError(
                    f"group_name: {self._group_name!r} was destroyed in this process"
                )
            if self._collective is None:
                where = self._where
                assert where is not None  # a group of one never gets here
                self._collective = Collective(
                    self.member_name(self._rank),
                    where.store,
                    host=where.host,
                    config=where.config,
                    timeout=self._init_timeout,
                    job_token=where.job_token,
                    is_alive=self._member_alive,
                )
            return self._collective

    @property
    def group(self) -> MultiCollectiveGroup | None:
        """The ``p2p_collective.MultiCollectiveGroup`` (None for a group of one).

        Its methods take ``async_op=True`` for an ``AsyncWork`` instead of blocking.
        """
        return None if self._world_size == 1 else self._members_group()

    def _members_group(self) -> MultiCollectiveGroup:
        """The N-member group (joined on first use); never called for a group of one."""
        if self._multi is None or self._multi.closed:
            name = f"{self._group_name}#{self._incarnation}"
            self._multi = self._own_collective().join_ranked_group(
                name, self._world_size, self._rank
            )
        return self._multi

    @property
    def collectives_transport(self) -> str | None:
        """How this group's collectives travel: ``"shm"`` or ``"gloo"``.

        ``"shm"`` for a group whose members are all on one node (two members: see
        ``p2p_collective.internal.PairCollectives``; more:
        ``RingCollectives``), ``"gloo"`` otherwise; None for a group
        of one, or before the group's first collective decided it.
        """
        if self._world_size == 1:
            return None
        if not self._two_decided:
            return None
        return "gloo" if self._two is None else "shm"

    def _pair_collectives(self, timeout: float | None) -> PairCollectives | RingCollectives | None:
        """A group on one node: its shared-memory collectives (None: gloo's).

        Decided at the first collective, by exchanges on the group's own pairs (keys
        ``.../coll`` for two members, ``.../ring/<a>-<b>`` between ring neighbours for
        more; apart from the pairs of ``send`` / ``recv``): shared memory when every
        pair runs on it. All members see the same transports, so all decide alike.
        """
        if self._two_decided or self._world_size == 1:
            return self._two
        coll = self._own_collective()
        base = f"raycoll:{self._group_name}#{self._incarnation}"
        if self._world_size == 2:
            names = [self.member_name(0), self.member_name(1)]
            two = PairCollectives(
                coll.create_pair_group(names, group_name=f"{base}/coll"), self._rank
            )
            if two.connect(timeout):
                self._two = two
        else:
            # P2P_RAYCOLL_RING=0 is a vote: one member that sets it keeps every member on
            # gloo (all still take part in the exchange, so members that differ agree).
            r, n = self._rank, self._world_size

            def pair(peer: int) -> CollectiveGroup:
                a, b = min(r, peer), max(r, peer)
                names = [self.member_name(r), self.member_name(peer)]
                return coll.create_pair_group(names, group_name=f"{base}/ring/{a}-{b}")

            ring = RingCollectives(pair((r - 1) % n), pair((r + 1) % n), r, n)
            if ring.connect(timeout, wanted=os.environ.get(RING_ENV, "1") != "0"):
                self._two = ring
        self._two_decided = True
        return self._two

    def pair_group(self, peer: int) -> CollectiveGroup:
        """The two-party ``p2p_collective.CollectiveGroup`` with member ``peer``.

        ``send`` / ``recv`` run on it; its ``stats()`` tell the transport (``"shm"``
        between members on one node).

        Raises:
            CollectiveArgumentError: ``peer`` is out of range or this member's own rank.
        """
        peer = check_rank(peer, self._world_size, "peer")
        check_not_self(peer, self._rank, "peer")
        coll = self._own_collective()
        return coll.create_pair_group([self.member_name(self._rank), self.member_name(peer)])

    # -- operations (arguments already checked in Ray's terms) ----------------------------

    def allreduce(self, tensor: Tensor, op: str, timeout: float | None) -> None:
        """Reduce ``tensor`` over the members, in place on every member."""
        with _arguments():
            if self._world_size == 1:
                as_torch(tensor, "tensor", "allreduce")  # the result is the tensor as it is
                return
            two = self._pair_collectives(timeout)
            t = as_torch(tensor, "tensor", "allreduce", writable=True)
            if two is not None and two.takes("allreduce", t):
                check_reducible(t, "tensor", "allreduce")
                two.allreduce(t, op, timeout)
                return
            self._members_group().allreduce(t, op=op, timeout=timeout)

    def broadcast(self, tensor: Tensor, src_rank: int, timeout: float | None) -> None:
        """Copy ``tensor`` of ``src_rank`` into ``tensor`` of every member."""
        with _arguments():
            if self._world_size == 1:
                as_torch(tensor, "tensor", "broadcast")
                return
            two = self._pair_collectives(timeout)
            t = as_torch(tensor, "tensor", "broadcast", writable=self._rank != src_rank)
            if two is not None and two.takes("broadcast", t):
                two.broadcast(t, src_rank, timeout)
                return
            self._members_group().broadcast_tensor(t, src=src_rank, timeout=timeout)

    def reduce(self, tensor: Tensor, dst_rank: int, op: str, timeout: float | None) -> None:
        """Reduce ``tensor`` over the members into ``tensor`` of ``dst_rank``."""
        with _arguments():
            if self._world_size == 1:
                as_torch(tensor, "tensor", "reduce")  # the result is the tensor as it is
                return
            two = self._pair_collectives(timeout)
            t = as_torch(tensor, "tensor", "reduce", writable=self._rank == dst_rank)
            if two is not None:
                check_reducible(t, "tensor", "reduce")
                two.reduce(t, dst_rank, op, timeout)
                return
            self._members_group().reduce(t, dst=dst_rank, op=op, timeout=timeout)

    def allgather(self, tensor_list: list[Tensor], tensor: Tensor, timeout: float | None) -> None:
        """Gather every member's ``tensor`` into ``tensor_list`` by rank."""
        with _arguments():
            if self._world_size == 1:
                src = as_torch(tensor, "tensor", "allgather")
                out = as_torch(tensor_list[0], "tensor_list[0]", "allgather", writable=True)
                _copy(out, src, "allgather", "tensor_list[0]")
                return
            two = self._pair_collectives(timeout)
            t = as_torch(tensor, "tensor", "allgather")
            outs = [
                as_torch(x, f"tensor_list[{i}]", "allgather", writable=True)
                for i, x in enumerate(tensor_list)
            ]
            if two is not None:
                check_like(outs, t, "tensor_list", "allgather")
                two.allgather(outs, t, timeout)
                return
            self._members_group().allgather(t, outs, timeout=timeout)

    def reducescatter(
        self, tensor: Tensor, tensor_list: list[Tensor], op: str, timeout: float | None
    ) -> None:
        """Reduce ``tensor_list[r]`` over the members into ``tensor`` of member ``r``.

        The N-member group's ``reduce_scatter``: large tensors go round a ring (each
        member sends its ``(N - 1) / N`` once: half the bytes of Ray's one allreduce per
        item), small ones as one allreduce of the list laid end to end.
        ``tensor_list`` is left unchanged.
        """
        with _arguments():
            out = as_torch(tensor, "tensor", "reducescatter", writable=True)
            items = [
                as_torch(x, f"tensor_list[{i}]", "reducescatter") for i, x in enumerate(tensor_list)
            ]
            for i, x in enumerate(items):
                if x.shape != out.shape or x.dtype != out.dtype:
                    raise CollectiveArgumentError(
                        f"reducescatter: tensor_list[{i}] is {x.dtype}{tuple(x.shape)}, tensor"
                        f" is {out.dtype}{tuple(out.shape)}; they must match"
                    )
            if self._world_size == 1:
                out.copy_(items[0])
                return
            two = self._pair_collectives(timeout)
            if two is not None:
                check_reducible(out, "tensor", "reducescatter")
                two.reducescatter(out, items, op, timeout)
                return
            self._members_group().reduce_scatter(out, items, op=op, timeout=timeout)

    def barrier(self, timeout: float | None) -> None:
        """Wait until every member reached the barrier."""
        if self._world_size > 1:
            two = self._pair_collectives(timeout)
            if two is not None:
                two.barrier(timeout)
                return
            self._members_group().barrier(timeout=timeout)

    def send(self, tensor: Tensor, dst_rank: int, timeout: float | None) -> None:
        """Send ``tensor``'s bytes to ``dst_rank``."""
        with _arguments():
            t = as_torch(tensor, "tensor", "send")
            self.pair_group(dst_rank).send_tensor(t, timeout=timeout)

    def recv(self, tensor: Tensor, src_rank: int, timeout: float | None) -> None:
        """Receive a ``send`` of ``src_rank`` into ``tensor`` (same number of bytes)."""
        with _arguments():
            t = as_torch(tensor, "tensor", "recv", writable=True)
            self.pair_group(src_rank).recv_tensor(t, timeout=timeout)

    def destroy_group(self) -> None:
        """Close this member's groups (the other members then see it as gone). Idempotent."""
        with self._lock:
            self._destroyed = True
            coll, self._collective = self._collective, None
            self._multi = None
            self._two, self._two_decided = None, True
        if coll is not None:
            coll.close()


def _copy(out: torch.Tensor, src: torch.Tensor, op: str, where: str) -> None:
    if out.shape != src.shape or out.dtype != src.dtype:
        raise CollectiveArgumentError(
            f"{op}: {where} is {out.dtype}{tuple(out.shape)}, the tensor it receives is"
            f" {src.dtype}{tuple(src.shape)}; they must match"
        )
    out.copy_(src)
