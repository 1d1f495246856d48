"""The members and the connection of a :class:`MultiCollectiveGroup` (a mixin).

:class:`MultiConnection` is the part of
:class:`~p2p_collective._groups._multi.MultiCollectiveGroup` that connects the group and
watches its members, apart from the collectives themselves (``_multi.py``): each member
bound to one life of its process (the members' fate); the first operation's rendezvous
(join keys, job token, liveness connections, the gloo process group of N ranks); what
happens when a member dies or closes; waiting for gloo works with the time left; and
handing an operation to the group's queue (with its checks and scratch buffer).
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import torch

from p2p_asyncwork import AsyncResultWork
from p2p_asyncwork.internal import CONFIGURED, check_timeout
from p2p_collective._config import CollectiveConfig
from p2p_collective._deadline import deadline_after, min_timeout, remaining, to_timedelta
from p2p_collective._errors import (
    CleanFailure,
    CollectiveError,
    CollectiveTimeoutError,
    GroupClosedError,
    PeerError,
    PeerGoneError,
)
from p2p_collective._groups._direction import Direction
from p2p_collective._groups._multi_ops import liveness_mesh
from p2p_collective._groups._multi_shm import SharedMemoryRoute
from p2p_collective._links._torch_gloo import GlooGroup, op_options
from p2p_collective._links._transport import LinkFactory, StoreLike
from p2p_collective._links._waiter import Waiter, gloo_failure, wait_sliced
from p2p_collective._peers._auth import JobAuth
from p2p_collective._peers._peer import Life, Peer, announce
from p2p_collective._peers._rendezvous import claim_incarnation, private_client, wait_key

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Work

    from p2p_collective._links._torch_gloo import GlooReduceOp, OpOptions

T = TypeVar("T")


class MultiConnection:
    """Members' fate, connection and waiting of a :class:`MultiCollectiveGroup`.

    A mixin without state of its own: :class:`MultiCollectiveGroup`'s ``__init__`` sets
    every attribute declared here.
    """

    name: str
    rank: int
    member_names: list[str]
    world_size: int
    store: StoreLike
    links: LinkFactory
    config: CollectiveConfig
    init_timeout: float | None
    auth: JobAuth | None
    instance: str
    _closed: bool
    _lock: threading.Lock
    _pg: GlooGroup | None
    _socks: dict[int, socket.socket]
    _gone: PeerError | None
    _joined: bool
    _prefix: str | None
    _private: StoreLike | None
    _direction: Direction
    _waiter: Waiter
    _options: dict[tuple[str, GlooReduceOp | None, int], OpOptions]
    _spare: torch.Tensor | None
    _peers: list[Peer | None]
    _lives: dict[int, tuple[Life, int]]
    _announce_as: str
    _shm: SharedMemoryRoute

    @property
    def collectives_transport(self) -> str | None:
        """How this group's tensor collectives travel: ``"shm"`` or ``"gloo"``.

        ``"shm"`` for a group created by address whose members are all on one node (its
        own pairs or ring of pairs, see :mod:`p2p_collective._groups._multi_shm`;
        ``P2P_COLLECTIVE_RING=0`` in any member keeps all on gloo), ``"gloo"`` otherwise
        (always for groups joined by rank); None before the group's first tensor
        collective decided it.
        """
        return self._shm.transport

    # -- the members' fate ----------------------------------------------------------------

    def _bind(self, rank: int, life: Life) -> None:
        """Bind member ``rank`` to ``life`` (the first met); raise PeerError if it ended."""
        what = f"coll[{self.name}]"
        with self._lock:
            bound = self._lives.get(rank)
            if bound is None:
                token = life.subscribe(functools.partial(self._member_gone, rank))
                self._lives[rank] = (life, token)
            elif bound[0] is not life:
                raise PeerError(
                    f"{what}: member {self.member_names[rank]!r} restarted (a new"
                    " incarnation) since this group met it; create the group again"
                )
        life.check(what)

    def _check_members(self) -> bool:
        """The ``cancelled`` check of rendezvous waits: closed (True), or raise PeerError."""
        what = f"coll[{self.name}]"
        for r, peer in enumerate(self._peers):
            if peer is None:
                continue
            bound = self._lives.get(r)
            if bound is not None:
                bound[0].check(what)
                peer.ask_oracle(what)
            else:
                peer.check_unbound(self.store, what)
        return self._closed

    # -- submission ----------------------------------------------------------------------

    def _submit(
        self,
        label: str,
        run: Callable[[GlooGroup, float | None], T],
        timeout: float | None,
        async_op: bool,
    ) -> T | AsyncResultWork[T]:
        """Queue ``run(process group, deadline)`` (connecting first); see Direction.submit."""
        seconds = check_timeout(timeout, none=CONFIGURED)
        deadline = deadline_after(self.config.op_timeout if seconds is None else seconds)
        gone = self._gone
        if gone is not None:  # a member is gone: fail at once, never queue
            err = PeerGoneError(f"coll[{self.name}]: {label} refused: {gone}")
            err.__cause__ = gone
            if not async_op:
                raise err
            work: AsyncResultWork[T] = AsyncResultWork()
            work.set_exception(err)
            return work
        return self._direction.submit(
            lambda dl: run(self._connect(dl), dl), label=label, deadline=deadline, async_op=async_op
        )

    def _check_rank(self, rank: object, arg: str) -> int:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ValueError(f"{arg}: got {rank!r}; allowed: a rank in 0..{self.world_size - 1}")
        return rank

    def _scratch(self, dtype: torch.dtype, numel: int) -> torch.Tensor:
        """A flat buffer of ``numel`` items of ``dtype``, kept for the next operation.

        For the inputs gloo overwrites on members whose result is not kept (``reduce``
        away from ``dst``): a fresh buffer per call costs page faults on every call
        (measured on loopback: receiving into fresh memory runs at under half the rate
        of a reused buffer). Only the executing operation uses it.
        """
        buf = self._spare
        if buf is None or buf.dtype != dtype or buf.numel() < numel:
            buf = self._spare = torch.empty(numel, dtype=dtype)
        return buf[:numel]

    # -- connection ----------------------------------------------------------------------

    def _connect(self, deadline: float | None) -> GlooGroup:
        if self._pg is not None:
            if self._gone is not None:
                raise self._gone
            return self._pg
        if self._closed:
            raise CleanFailure(GroupClosedError(f"coll[{self.name}]: the group was closed"))
        wait = min_timeout(self.init_timeout, remaining(deadline))
        cancelled = self._check_members
        try:
            cancelled()  # a member known dead fails here, not at the timeout
            if self._private is None:
                self._private = private_client(self.store, wait)
            store = self._private
            if self._prefix is None:
                inc = claim_incarnation(store, self.name, self.rank)
                self._prefix = f"p2p/{self.name}/{inc}/coll{self.world_size}"
            prefix = self._prefix
            if not self._joined:
                announce(store, self._announce_as, self.instance)
                if self.auth is not None:  # the nonce goes before the announcement
                    self.auth.publish(store, prefix, str(self.rank))
                store.set(f"{prefix}/join/{self.rank}", self.instance.encode())
                self._joined = True
            end = deadline_after(wait)
            missing = [
                self.member_names[r]
                for r in range(self.world_size)
                if not wait_key(store, f"{prefix}/join/{r}", remaining(end), cancelled)
            ]
            if not missing and self.auth is not None:
                others = {str(r): n for r, n in enumerate(self.member_names) if r != self.rank}
                self.auth.verify(
                    store,
                    prefix,
                    str(self.rank),
                    others,
                    f"coll[{self.name}]",
                    wait,
                    lambda key, t: wait_key(store, key, t, cancelled),
                )
            if not missing:
                for r, peer in enumerate(self._peers):
                    if peer is not None:
                        theirs = bytes(store.get(f"{prefix}/join/{r}")).decode(errors="replace")
                        self._bind(r, peer.bind(theirs))
        except CollectiveError as exc:
            raise CleanFailure(exc) from exc
        except Exception as exc:
            err = CollectiveError(f"coll[{self.name}]: rendezvous store failed: {exc}")
            raise CleanFailure(err) from exc
        if missing:
            raise CleanFailure(
                CollectiveTimeoutError(
                    f"coll[{self.name}]: members {missing} did not join within {wait} s;"
                    " are they running and creating the same group?"
                )
            )
        socks = liveness_mesh(
            store,
            prefix,
            self.rank,
            self.member_names,
            self.links.host,
            self.init_timeout,
            lambda key, t: wait_key(store, key, t, cancelled),
        )
        try:
            pg = self.links.gloo_group(
                store, prefix, self.rank, self.world_size, self.init_timeout, "the members"
            )
        except BaseException:
            for sock in socks.values():
                sock.close()
            raise
        with self._lock:
            self._socks = socks
            self._pg = pg
        for member, sock in socks.items():
            self.links.watcher.watch(sock, functools.partial(self._sock_gone, member))
        return pg

    def _sock_gone(self, rank: int, reason: str, died: bool) -> None:
        """A member's liveness connection ended: it died (its life ends) or closed."""
        exc = PeerError(
            f"coll[{self.name}]: member {self.member_names[rank]!r} (rank {rank}) {reason}"
        )
        bound = self._lives.get(rank)
        if died and bound is not None:
            bound[0].end(exc)  # every group bound to that life hears it, this one included
        else:
            self._member_gone(rank, exc)

    def _member_gone(self, rank: int, exc: PeerError) -> None:
        if self._gone is not None or self._closed:
            return
        self._gone = exc
        self._direction.abort(exc)
        self._waiter.wake()
        self._shm.close()  # an operation blocked on a shared-memory pair fails at once

    def _gone_now(self) -> PeerError | None:
        return self._gone

    def _wait(
        self, works: list[Work], what: str, deadline: float | None, p2p: bool = False
    ) -> None:
        """Wait for gloo works (see :mod:`p2p_collective._links._waiter`); map failures to ours.

        Collectives are waited for in slices on this thread; gloo's send/recv works never
        report ``is_completed()``, so the group's waiter thread waits for them.
        """
        label = f"coll[{self.name}]: {what}"
        try:
            if p2p:  # one hand-off to the waiter thread for all of them
                self._waiter.wait(works, deadline, self._gone_now, poll=0.1)
            for work in [] if p2p else works:
                wait_sliced(work, deadline, self._gone_now, label)
        except (PeerError, CollectiveTimeoutError):
            raise
        except Exception as exc:
            if self._gone is not None:
                raise self._gone from exc
            raise gloo_failure(exc, label, f"{label} did not complete in time") from exc

    def _opts(
        self, cls: str, deadline: float | None, op: GlooReduceOp | None = None, root: int = -1
    ) -> OpOptions:
        """The options object of a collective, with the time left as its timeout.

        One object per kind, reduce op and root is kept and reused (gloo copies what it
        reads at the call), so an operation builds no options object on the hot path.

        Args:
            cls: ``"AllreduceOptions"``, ``"BroadcastOptions"``, ...
            deadline: The operation's deadline.
            op: The ``reduceOp`` field (None: the class has none).
            root: The ``rootRank`` field (-1: the class has none).
        """
        key = (cls, op, root)
        opts = self._options.get(key)
        if opts is None:
            fields: dict[str, int | GlooReduceOp] = {}
            if op is not None:
                fields["reduceOp"] = op
            if root >= 0:
                fields["rootRank"] = root
            opts = self._options[key] = op_options(cls, to_timedelta(None), **fields)
        opts.timeout = to_timedelta(None if deadline is None else deadline - time.monotonic())
        return opts
