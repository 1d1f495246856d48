"""MultiCollectiveGroup: collectives (broadcast, allreduce, ...) over a group of N members."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from p2p_asyncwork import AsyncResultWork
from p2p_asyncwork.internal import CONFIGURED, check_timeout
from p2p_collective._deadline import deadline_after
from p2p_collective._errors import (
    CleanFailure,
    CollectiveError,
    ObjectRefusedError,
    PeerError,
    PeerGoneError,
)
from p2p_collective._groups._arrays import as_tensor
from p2p_collective._groups._direction import Direction
from p2p_collective._groups._multi_connect import MultiConnection
from p2p_collective._groups._multi_frames import OBJ_HEADER, Incoming, encode_object, read_head
from p2p_collective._groups._multi_ops import check_reducible, like, reduce_op
from p2p_collective._groups._ring import ring_op, ring_reduce_scatter
from p2p_collective._links._transport import StoreLike
from p2p_collective._links._waiter import Waiter
from p2p_collective._peers._auth import JobAuth
from p2p_collective._peers._peer import Life, Peer, new_instance

_P2P_TAG = 1 << 28  # far from the tags gloo numbers its collectives with (0, 1, ...)
RING_MIN_BYTES = 256 << 10
"""``reduce_scatter`` outputs from this size on run as a ring (see :mod:`._ring`)."""


class MultiCollectiveGroup(MultiConnection):
    """A group of N >= 2 members running collectives over one gloo process group of N ranks.

    Create it with ``Collective.create_collective_group`` given more than two addresses
    (ranks are the indices of the sorted member names), or with :func:`join_ranked_group`
    (explicit ranks). Every operation must be called by every member, in the same order.
    Operations of one group run strictly one at a time in submission order (one FIFO and
    one executor thread per group). The process group and an idle TCP connection to
    every other member (liveness) are set up at the first operation, which waits up to
    ``init_timeout`` for all members.

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
        links: Any,
        config: Any,
        init_timeout: float | None,
        owner: object = None,
        on_close: Callable[[Any], None] | None = None,
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
        self._pg: Any = None
        self._socks: dict[int, Any] = {}
        self._gone: PeerError | None = None
        self._joined = False
        self._prefix: str | None = None
        self._private: StoreLike | None = None
        self._direction = Direction(f"coll[{name}]")
        self._waiter = Waiter("p2p-coll-wait")  # send_tensor / recv_tensor works
        self._options: dict[tuple[Any, ...], Any] = {}  # see _opts
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

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<MultiCollectiveGroup {self.name!r} rank={self.rank}/{self.world_size} {state}>"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # -- the members' fate, connection and waiting: see MultiConnection -----------------

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

    def _submit(
        self,
        label: str,
        run: Callable[[Any, float | None], Any],
        timeout: float | None,
        async_op: bool,
    ) -> Any:
        seconds = check_timeout(timeout, none=CONFIGURED)
        deadline = deadline_after(self.config.op_timeout if seconds is None else seconds)
        gone = self._gone
        if gone is not None:  # a member is gone: fail at once, never queue
            err = PeerGoneError(f"coll[{self.name}]: {label} refused: {gone}")
            err.__cause__ = gone
            if not async_op:
                raise err
            work: AsyncResultWork[Any] = AsyncResultWork()
            work.set_exception(err)
            return work
        return self._direction.submit(
            lambda dl: run(self._connect(dl), dl), label=label, deadline=deadline, async_op=async_op
        )

    def _next_object_seq(self) -> int:
        """The sequence number of this object broadcast (run in order by the executor)."""
        seq = self._object_seq
        self._object_seq += 1
        return seq

    def _check_rank(self, rank: object, arg: str) -> int:
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < self.world_size:
            raise ValueError(f"{arg}: got {rank!r}; allowed: a rank in 0..{self.world_size - 1}")
        return rank

    # -- collectives ---------------------------------------------------------------------

    def broadcast(
        self, obj: Any = None, src: int = 0, async_op: bool = False, *, timeout: float | None = None
    ) -> Any:
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

            def run(pg: Any, dl: float | None) -> Any:
                msgs = encoded.messages(self._next_object_seq())
                self._bcast(pg, msgs, src, dl, "broadcast(obj)")
                return obj

        else:

            def run(pg: Any, dl: float | None) -> Any:
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
        self, pg: Any, tensors: list[torch.Tensor], src: int, dl: float | None, what: str
    ) -> None:
        works = [pg.broadcast([t], self._opts("BroadcastOptions", dl, root=src)) for t in tensors]
        self._wait(works, what, dl)

    def broadcast_tensor(
        self, tensor: Any, src: int = 0, async_op: bool = False, *, timeout: float | None = None
    ) -> Any:
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

        def run(pg: Any, dl: float | None) -> Any:
            self._bcast(pg, [t], src, dl, "broadcast_tensor")
            return tensor

        return self._submit(f"broadcast_tensor(src={src})", run, timeout, async_op)

    def allreduce(
        self, tensor: Any, op: Any = "sum", async_op: bool = False, *, timeout: float | None = None
    ) -> Any:
        """Reduce ``tensor`` over all members with ``op``; every member gets the result in place.

        Args:
            tensor: CPU tensor or numpy array, same shape and dtype on every member.
            op: ``"sum"``, ``"product"``, ``"min"`` or ``"max"``.
            async_op: Return an AsyncWork (result: ``tensor``) instead of waiting.
            timeout: Seconds until done (None: the configured ``op_timeout``).

        Returns:
            ``tensor`` (holding the result), or an AsyncWork.

        Raises:
            TypeError, ValueError: Bad arguments. CollectiveError: As for :meth:`broadcast`.

        Example:
            >>> group.allreduce(grad, op="sum")  # doctest: +SKIP
        """
        red = reduce_op(op)
        t = as_tensor(tensor, "tensor", "allreduce", writable=True)
        check_reducible(t, "tensor", "allreduce")

        def run(pg: Any, dl: float | None) -> Any:
            self._wait(
                [pg.allreduce([t], self._opts("AllreduceOptions", dl, red))],
                "allreduce",
                dl,
            )
            return tensor

        return self._submit("allreduce", run, timeout, async_op)

    def reduce(
        self,
        tensor: Any,
        dst: int = 0,
        op: Any = "sum",
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Reduce ``tensor`` over all members into ``tensor`` of member ``dst`` (in place).

        The other members' tensors are left unchanged.

        Returns:
            ``tensor``, or an AsyncWork. Raises as :meth:`allreduce`.
        """
        dst = self._check_rank(dst, "dst")
        red = reduce_op(op)
        t = as_tensor(tensor, "tensor", "reduce", writable=self.rank == dst)
        check_reducible(t, "tensor", "reduce")

        def run(pg: Any, dl: float | None) -> Any:
            if self.rank == dst:
                buf = t
            else:  # gloo overwrites a non-root input: reduce a copy in a kept buffer
                buf = self._scratch(t.dtype, t.numel()).view(t.shape)
                buf.copy_(t)
            opts = self._opts("ReduceOptions", dl, red, dst)
            self._wait([pg.reduce([buf], opts)], "reduce", dl)
            return tensor

        return self._submit(f"reduce(dst={dst})", run, timeout, async_op)

    def allgather(
        self,
        tensor: Any,
        output: list[Any] | None = None,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> Any:
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
            result: list[Any] = [like(tensor, o) for o in outs]
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

        def run(pg: Any, dl: float | None) -> Any:
            self._wait(
                [pg.allgather([outs], [t], self._opts("AllgatherOptions", dl))], "allgather", dl
            )
            return result

        return self._submit("allgather", run, timeout, async_op)

    def reduce_scatter(
        self,
        output: Any,
        inputs: Sequence[Any],
        op: Any = "sum",
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Reduce ``inputs[r]`` over all members into ``output`` of member ``r``.

        Args:
            output: This member's result tensor/array (written in place).
            inputs: ``world_size`` tensors/arrays shaped like ``output``.
            op: ``"sum"``, ``"product"``, ``"min"`` or ``"max"``.
            async_op: Return an AsyncWork (result: ``output``) instead of waiting.
            timeout: Seconds until done (None: the configured ``op_timeout``).

        Returns:
            ``output``, or an AsyncWork.

        Raises:
            TypeError, ValueError: Bad arguments. CollectiveError: As for :meth:`broadcast`.
        """
        red = reduce_op(op)
        out = as_tensor(output, "output", "reduce_scatter", writable=True)
        check_reducible(out, "output", "reduce_scatter")
        if isinstance(inputs, (str, bytes)) or len(inputs) != self.world_size:
            raise ValueError(f"inputs: expected {self.world_size} tensors, got {len(inputs)}")
        ins = [as_tensor(x, f"inputs[{i}]", "reduce_scatter") for i, x in enumerate(inputs)]
        for i, x in enumerate(ins):
            if x.shape != out.shape or x.dtype != out.dtype:
                raise ValueError(
                    f"reduce_scatter: inputs[{i}] is {x.dtype}{tuple(x.shape)}, output is"
                    f" {out.dtype}{tuple(out.shape)}; they must match"
                )

        def run(pg: Any, dl: float | None) -> Any:
            # gloo's own reduce_scatter hangs on torch 2.13 (measured). Large: a ring over
            # point-to-point messages (half the bytes of an allreduce); small: one
            # allreduce of the inputs laid end to end (one gloo operation, lowest latency).
            n = out.numel()
            if n * out.element_size() >= RING_MIN_BYTES and ring_op(red):
                ring_reduce_scatter(
                    pg,
                    self.rank,
                    self.world_size,
                    out,
                    ins,
                    red,
                    self._scratch(out.dtype, 2 * n),
                    lambda works: self._wait(works, "reduce_scatter", dl, p2p=True),
                )
                return output
            flat = self._scratch(out.dtype, n * self.world_size)
            torch.cat([x.reshape(-1) for x in ins], out=flat)
            opts = self._opts("AllreduceOptions", dl, red)
            self._wait([pg.allreduce([flat], opts)], "reduce_scatter", dl)
            out.copy_(flat[self.rank * n : (self.rank + 1) * n].view(out.shape))
            return output

        return self._submit("reduce_scatter", run, timeout, async_op)

    def barrier(self, async_op: bool = False, *, timeout: float | None = None) -> Any:
        """Wait until every member reached its barrier (and finished earlier operations).

        Returns:
            None, or an AsyncWork. Raises as :meth:`broadcast`.
        """

        def run(pg: Any, dl: float | None) -> None:
            self._wait([pg.barrier(self._opts("BarrierOptions", dl))], "barrier", dl)

        return self._submit("barrier", run, timeout, async_op)

    def send_tensor(
        self, tensor: Any, dst: int, async_op: bool = False, *, timeout: float | None = None
    ) -> Any:
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

        def run(pg: Any, dl: float | None) -> None:
            self._wait(
                [pg.send([t.reshape(-1).view(torch.uint8)], dst, _P2P_TAG)],
                "send_tensor",
                dl,
                p2p=True,
            )

        return self._submit(f"send_tensor(dst={dst})", run, timeout, async_op)

    def recv_tensor(
        self, tensor: Any, src: int, async_op: bool = False, *, timeout: float | None = None
    ) -> Any:
        """Receive a :meth:`send_tensor` of member ``src`` into ``tensor`` (same size).

        Returns:
            ``tensor``, or an AsyncWork. Raises as :meth:`send_tensor`.
        """
        src = self._check_rank(src, "src")
        if src == self.rank:
            raise ValueError(f"src: got {src}, this member's own rank")
        t = as_tensor(tensor, "tensor", "recv_tensor", writable=True)

        def run(pg: Any, dl: float | None) -> Any:
            self._wait(
                [pg.recv([t.reshape(-1).view(torch.uint8)], src, _P2P_TAG)],
                "recv_tensor",
                dl,
                p2p=True,
            )
            return tensor

        return self._submit(f"recv_tensor(src={src})", run, timeout, async_op)

    # -- state ---------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
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
