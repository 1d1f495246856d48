"""MultiCollectiveGroup: collectives (broadcast, allreduce, ...) over a group of N members."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, overload

import numpy as np
import numpy.typing as npt
import torch

from p2p_asyncwork import AsyncResultWork
from p2p_collective._config import CollectiveConfig
from p2p_collective._errors import (
    CleanFailure,
    CollectiveError,
    ObjectRefusedError,
    PeerError,
)
from p2p_collective._groups._arrays import ArrayT, as_tensor
from p2p_collective._groups._direction import Direction
from p2p_collective._groups._multi_frames import OBJ_HEADER, Incoming, encode_object, read_head
from p2p_collective._groups._multi_ops import like
from p2p_collective._groups._multi_reduce import MultiReductions
from p2p_collective._groups._multi_shm import PairMaker, SharedMemoryRoute
from p2p_collective._links._transport import LinkFactory, StoreLike
from p2p_collective._links._waiter import Waiter
from p2p_collective._peers._auth import JobAuth
from p2p_collective._peers._peer import Life, Peer, new_instance

if TYPE_CHECKING:
    from p2p_collective._links._torch_gloo import GlooGroup, GlooReduceOp, OpOptions

_P2P_TAG = 1 << 28  # far from the tags gloo numbers its collectives with (0, 1, ...)


class MultiCollectiveGroup(MultiReductions):
    """A group of N >= 2 members running collectives over one gloo process group of N ranks.

    Create it with ``Collective.create_collective_group`` given more than two addresses
    (ranks are the indices of the sorted member names), or with :func:`join_ranked_group`
    (explicit ranks). Every operation must be called by every member, in the same order.
    Operations of one group run strictly one at a time in submission order (one FIFO and
    one executor thread per group). The process group and an idle TCP connection to
    every other member (liveness) are set up at the first operation, which waits up to
    ``init_timeout`` for all members.

    On one node, a group created by address runs its tensor collectives over shared
    memory instead (its own pair, or a ring of pairs; decided at its first tensor
    collective, see :mod:`._multi_shm` and :attr:`collectives_transport`;
    ``P2P_COLLECTIVE_RING=0`` in any member keeps all on gloo).

    Timeouts, errors and breaking follow the two-party rules: every call takes
    ``timeout`` (None: the configured ``op_timeout``); bad arguments raise
    ``ValueError``/``TypeError`` before anything is queued; a failure after the group
    connected breaks it, and later calls raise ``GroupBrokenError`` whose ``__cause__``
    is the first error. A member that dies (or closes the group) is seen by the others
    within about ``GONE_GRACE`` (2 s) through its liveness connection: their pending
    operation fails with ``PeerError`` and the group is broken.

    Tensors: CPU torch tensors and numpy arrays (viewed without a copy through
    ``torch.from_numpy``; in-place results land in the given array). Accelerator tensors
    raise ``ValueError``: the NCCL transport of N-member groups is not available yet.

    Attributes:
        name: The group's key. rank: This member's rank. world_size: N.
        member_names: Member names by rank.
    """

    def __init__(
        self,
        *,
        name: str,
        rank: int,
        member_names: Sequence[str],
        store: StoreLike,
        links: LinkFactory,
        config: CollectiveConfig,
        init_timeout: float | None,
        owner: object = None,
        on_close: Callable[[MultiCollectiveGroup], None] | None = None,
        auth: JobAuth | None = None,
        peers: Sequence[Peer | None] | None = None,
        instance: str | None = None,
        announce_as: str | None = None,
    ) -> None:
        self.auth = auth  # the job token check at rendezvous (None: none)
        self._owner = owner
        self._on_close = on_close
        self.name = name
        self.rank = rank
        self.member_names = list(member_names)
        self.world_size = len(self.member_names)
        self.self_name = self.member_names[rank]
        self.store = store
        self.links = links
        self.config = config
        self.init_timeout = init_timeout
        self._closed = False
        self._lock = threading.Lock()
        self._pg: GlooGroup | None = None
        self._socks: dict[int, socket.socket] = {}
        self._gone: PeerError | None = None
        self._joined = False
        self._prefix: str | None = None
        self._private: StoreLike | None = None
        self._direction = Direction(f"coll[{name}]")
        self._waiter = Waiter("p2p-coll-wait")  # send_tensor / recv_tensor works
        self._options: dict[tuple[str, GlooReduceOp | None, int], OpOptions] = {}  # see _opts
        self._spare: torch.Tensor | None = None  # see _scratch
        self._object_seq = 0  # object broadcasts so far: every member counts alike
        # The members' fate (see _peers/_peer.py): one Peer per other member, bound to its life.
        self.instance = instance if instance is not None else new_instance()
        self._peers: list[Peer | None] = (
            list(peers)
            if peers is not None
            else [None if r == rank else Peer(n) for r, n in enumerate(self.member_names)]
        )
        self._lives: dict[int, tuple[Life, int]] = {}  # rank -> (life, listener token)
        # the name the other members know this one by (a ranked group's is "name[rank]")
        self._announce_as = announce_as if announce_as is not None else self.self_name
        # tensor collectives over shared memory (groups by address only: ranked groups'
        # member names are aliases, the owner cannot pair them)
        maker = owner if announce_as is None and isinstance(owner, PairMaker) else None
        self._shm = SharedMemoryRoute(name, rank, self.member_names, maker, self._gone_now)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<MultiCollectiveGroup {self.name!r} rank={self.rank}/{self.world_size} {state}>"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # -- the members' fate, connection and waiting: see MultiConnection -----------------

    def _next_object_seq(self) -> int:
        """The sequence number of this object broadcast (run in order by the executor)."""
        seq = self._object_seq
        self._object_seq += 1
        return seq

    # -- collectives ---------------------------------------------------------------------

    @overload
    def broadcast(
        self,
        obj: object = ...,
        src: int = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
    ) -> object: ...
    @overload
    def broadcast(
        self,
        obj: object = ...,
        src: int = ...,
        *,
        async_op: Literal[True],
        timeout: float | None = ...,
    ) -> AsyncResultWork[object]: ...
    @overload
    def broadcast(
        self,
        obj: object = ...,
        src: int = ...,
        async_op: bool = ...,
        *,
        timeout: float | None = ...,
    ) -> object | AsyncResultWork[object]: ...

    def broadcast(
        self,
        obj: object = None,
        src: int = 0,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> object | AsyncResultWork[object]:
        """Send ``obj`` from member ``src`` to every member; return it on every member.

        Like ``send``/``recv``: tensors, lists/tuples/dicts of tensors travel as raw bytes
        (never compressed) into freshly allocated tensors; any other object is pickled.

        Args:
            obj: The object on ``src``; ignored on the other members (pass None).
            src: Rank of the sending member.
            async_op: Return an AsyncWork (result: the object) instead of waiting.
            timeout: Seconds until done (None: the configured ``op_timeout``).

        Returns:
            The object (on ``src``: ``obj`` itself), or an AsyncWork.

        Raises:
            ValueError: Bad ``src``/``timeout``, or (on ``src``) an unusable payload.
            CollectiveTimeoutError, PeerError, GroupBrokenError, GroupClosedError: As for
                the two-party ``send``.

        Example:
            >>> state = group.broadcast(state if group.rank == 0 else None)  # doctest: +SKIP
        """
        src = self._check_rank(src, "src")
        if self.rank == src:
            encoded = encode_object(obj, "broadcast(obj)")

            def run(pg: GlooGroup, dl: float | None) -> object:
                msgs = encoded.messages(self._next_object_seq())
                self._bcast(pg, msgs, src, dl, "broadcast(obj)")
                return obj

        else:

            def run(pg: GlooGroup, dl: float | None) -> object:
                seq = self._next_object_seq()
                head = torch.empty(OBJ_HEADER, dtype=torch.uint8)
                self._bcast(pg, [head], src, dl, "broadcast(obj) header")
                what = f"coll[{self.name}]: broadcast(obj) from {self.member_names[src]!r}"
                hdr, rest_len = read_head(head, seq, what)
                rest = None
                if rest_len:
                    rest = torch.empty(rest_len, dtype=torch.uint8)
                    self._bcast(pg, [rest], src, dl, "broadcast(obj) metadata")
                incoming = Incoming(hdr, head, rest, what)
                self._bcast(pg, incoming.views, src, dl, "broadcast(obj) tensors")
                # every message of this broadcast is taken: a refusal leaves the group fine
                cfg = self.config
                try:
                    return incoming.rebuild(cfg.object_policy, cfg.object_allowlist)
                except ObjectRefusedError as exc:
                    raise CleanFailure(
                        ObjectRefusedError(
                            f"coll[{self.name}]: refused the object broadcast by"
                            f" {self.member_names[src]!r}: {exc}"
                        )
                    ) from exc
                except Exception as exc:
                    raise CleanFailure(
                        CollectiveError(f"{what}: the object part could not be unpickled: {exc}")
                    ) from exc

        return self._submit(f"broadcast(src={src})", run, timeout, async_op)

    def _bcast(
        self, pg: GlooGroup, tensors: list[torch.Tensor], src: int, dl: float | None, what: str
    ) -> None:
        works = [pg.broadcast([t], self._opts("BroadcastOptions", dl, root=src)) for t in tensors]
        self._wait(works, what, dl)

    @overload
    def broadcast_tensor(
        self,
        tensor: ArrayT,
        src: int = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT: ...
    @overload
    def broadcast_tensor(
        self,
        tensor: ArrayT,
        src: int = ...,
        *,
        async_op: Literal[True],
        timeout: float | None = ...,
    ) -> AsyncResultWork[ArrayT]: ...
    @overload
    def broadcast_tensor(
        self,
        tensor: ArrayT,
        src: int = ...,
        async_op: bool = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT | AsyncResultWork[ArrayT]: ...

    def broadcast_tensor(
        self,
        tensor: ArrayT,
        src: int = 0,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> ArrayT | AsyncResultWork[ArrayT]:
        """Broadcast ``tensor`` of ``src`` into ``tensor`` of every member (in place).

        Args:
            tensor: A CPU tensor or numpy array of the same shape and dtype on every member.
            src: Rank of the sending member.
            async_op: Return an AsyncWork (result: ``tensor``) instead of waiting.
            timeout: Seconds until done (None: the configured ``op_timeout``).

        Returns:
            ``tensor``, or an AsyncWork.

        Raises:
            TypeError, ValueError: Bad arguments. CollectiveError: As for :meth:`broadcast`.
        """
        src = self._check_rank(src, "src")
        t = as_tensor(tensor, "tensor", "broadcast_tensor", writable=self.rank != src)

        def run(pg: GlooGroup, dl: float | None) -> ArrayT:
            if not self._shm.broadcast(t, src, dl):
                self._bcast(pg, [t], src, dl, "broadcast_tensor")
            return tensor

        return self._submit(f"broadcast_tensor(src={src})", run, timeout, async_op)

    @overload
    def allgather(
        self,
        tensor: ArrayT,
        output: list[ArrayT] | None = ...,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
    ) -> list[ArrayT]: ...
    @overload
    def allgather(
        self,
        tensor: ArrayT,
        output: list[ArrayT] | None = ...,
        *,
        async_op: Literal[True],
        timeout: float | None = ...,
    ) -> AsyncResultWork[list[ArrayT]]: ...
    @overload
    def allgather(
        self,
        tensor: ArrayT,
        output: list[ArrayT] | None = ...,
        async_op: bool = ...,
        *,
        timeout: float | None = ...,
    ) -> list[ArrayT] | AsyncResultWork[list[ArrayT]]: ...

    def allgather(
        self,
        tensor: ArrayT,
        output: list[ArrayT] | None = None,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> list[ArrayT] | AsyncResultWork[list[ArrayT]]:
        """Gather ``tensor`` of every member; return the list, by rank, on every member.

        Args:
            tensor: CPU tensor or numpy array, same shape and dtype on every member.
            output: Optional list of ``world_size`` tensors/arrays to fill in place.
            async_op: Return an AsyncWork (result: the list) instead of waiting.
            timeout: Seconds until done (None: the configured ``op_timeout``).

        Returns:
            The list (``output`` when given; else new tensors, numpy arrays for numpy
            input), or an AsyncWork.

        Raises:
            TypeError, ValueError: Bad arguments. CollectiveError: As for :meth:`broadcast`.
        """
        t = as_tensor(tensor, "tensor", "allgather")
        if output is None:
            outs = [torch.empty_like(t) for _ in range(self.world_size)]
            result: list[ArrayT] = [like(tensor, o) for o in outs]
        else:
            if not isinstance(output, list) or len(output) != self.world_size:
                raise ValueError(
                    f"output: expected a list of {self.world_size} tensors, got {output!r:.80}"
                )
            outs = [
                as_tensor(o, f"output[{i}]", "allgather", writable=True)
                for i, o in enumerate(output)
            ]
            result = output

        def run(pg: GlooGroup, dl: float | None) -> list[ArrayT]:
            if not self._shm.allgather(outs, t, dl):
                opts = self._opts("AllgatherOptions", dl)
                self._wait([pg.allgather([outs], [t], opts)], "allgather", dl)
            return result

        return self._submit("allgather", run, timeout, async_op)

    @overload
    def barrier(self, async_op: Literal[False] = ..., *, timeout: float | None = ...) -> None: ...
    @overload
    def barrier(
        self, async_op: Literal[True], *, timeout: float | None = ...
    ) -> AsyncResultWork[None]: ...
    @overload
    def barrier(
        self, async_op: bool = ..., *, timeout: float | None = ...
    ) -> AsyncResultWork[None] | None: ...

    def barrier(
        self, async_op: bool = False, *, timeout: float | None = None
    ) -> AsyncResultWork[None] | None:
        """Wait until every member reached its barrier (and finished earlier operations).

        Returns:
            None, or an AsyncWork. Raises as :meth:`broadcast`.
        """

        def run(pg: GlooGroup, dl: float | None) -> None:
            if not self._shm.barrier(dl):
                self._wait([pg.barrier(self._opts("BarrierOptions", dl))], "barrier", dl)

        return self._submit("barrier", run, timeout, async_op)

    @overload
    def send_tensor(
        self,
        tensor: torch.Tensor | npt.NDArray[np.generic],
        dst: int,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
    ) -> None: ...
    @overload
    def send_tensor(
        self,
        tensor: torch.Tensor | npt.NDArray[np.generic],
        dst: int,
        *,
        async_op: Literal[True],
        timeout: float | None = ...,
    ) -> AsyncResultWork[None]: ...
    @overload
    def send_tensor(
        self,
        tensor: torch.Tensor | npt.NDArray[np.generic],
        dst: int,
        async_op: bool = ...,
        *,
        timeout: float | None = ...,
    ) -> AsyncResultWork[None] | None: ...

    def send_tensor(
        self,
        tensor: torch.Tensor | npt.NDArray[np.generic],
        dst: int,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> AsyncResultWork[None] | None:
        """Send ``tensor``'s bytes to member ``dst``, which calls :meth:`recv_tensor`.

        Returns:
            None, or an AsyncWork.

        Raises:
            TypeError, ValueError: Bad arguments. CollectiveError: As for :meth:`broadcast`.
        """
        dst = self._check_rank(dst, "dst")
        if dst == self.rank:
            raise ValueError(f"dst: got {dst}, this member's own rank")
        t = as_tensor(tensor, "tensor", "send_tensor")

        def run(pg: GlooGroup, dl: float | None) -> None:
            self._wait(
                [pg.send([t.reshape(-1).view(torch.uint8)], dst, _P2P_TAG)],
                "send_tensor",
                dl,
                p2p=True,
            )

        return self._submit(f"send_tensor(dst={dst})", run, timeout, async_op)

    @overload
    def recv_tensor(
        self,
        tensor: ArrayT,
        src: int,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT: ...
    @overload
    def recv_tensor(
        self,
        tensor: ArrayT,
        src: int,
        *,
        async_op: Literal[True],
        timeout: float | None = ...,
    ) -> AsyncResultWork[ArrayT]: ...
    @overload
    def recv_tensor(
        self,
        tensor: ArrayT,
        src: int,
        async_op: bool = ...,
        *,
        timeout: float | None = ...,
    ) -> ArrayT | AsyncResultWork[ArrayT]: ...

    def recv_tensor(
        self,
        tensor: ArrayT,
        src: int,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> ArrayT | AsyncResultWork[ArrayT]:
        """Receive a :meth:`send_tensor` of member ``src`` into ``tensor`` (same size).

        Returns:
            ``tensor``, or an AsyncWork. Raises as :meth:`send_tensor`.
        """
        src = self._check_rank(src, "src")
        if src == self.rank:
            raise ValueError(f"src: got {src}, this member's own rank")
        t = as_tensor(tensor, "tensor", "recv_tensor", writable=True)

        def run(pg: GlooGroup, dl: float | None) -> ArrayT:
            self._wait(
                [pg.recv([t.reshape(-1).view(torch.uint8)], src, _P2P_TAG)],
                "recv_tensor",
                dl,
                p2p=True,
            )
            return tensor

        return self._submit(f"recv_tensor(src={src})", run, timeout, async_op)

    # -- state ---------------------------------------------------------------------------

    def stats(self) -> dict[str, int | float]:
        """Counters of the group's executor (operations, failures, queue, broken)."""
        return self._direction.snapshot()

    def close(self, timeout: float | None = 5.0) -> None:
        """Close the group: queued operations fail; the other members see it as gone.

        Idempotent. An operation already running ends at completion, failure or deadline.
        """
        self._begin_close()
        self._finish_close(None if timeout is None else time.monotonic() + timeout)

    def _begin_close(self) -> bool:
        """Signal the close (never blocks); False if it was already closed."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            socks, self._socks = self._socks, {}
            self._pg = None
            self._spare = None
            lives, self._lives = self._lives, {}
        for life, token in lives.values():
            life.unsubscribe(token)
        self._direction.begin_close()
        self._shm.close()  # the shared-memory pairs, if any (never blocks)
        for sock in socks.values():
            self.links.watcher.forget(sock)
        if self._on_close is not None:
            self._on_close(self)
        return True

    def _finish_close(self, deadline: float | None) -> None:
        self._direction.finish_close(deadline)
        self._waiter.close()

    def __enter__(self) -> MultiCollectiveGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
