"""The shared-memory route of an N-member group whose members are all on one node.

A :class:`~p2p_collective._groups._multi.MultiCollectiveGroup` created by address (its
owner ``Collective`` knows every member by its real name) runs its tensor collectives
(``allreduce``, ``broadcast_tensor``, ``reduce``, ``allgather``, ``reduce_scatter``,
``barrier``) on two-party groups of its own when they all run on shared memory:

- two members: one pair (key ``<group>/pairs``), see
  :class:`~p2p_collective._groups._pair_ops.PairCollectives`;
- three or more: a ring of pairs with the left and right neighbours (keys
  ``<group>/ring/<a>-<b>``), see :class:`~p2p_collective._groups._ring_ops.RingCollectives`.

These pairs are never the send/recv pair of the same members, so a tensor sent and not
yet received is never mistaken for a collective's message. Whether to use them is
decided once per group, at its first tensor collective (inside that operation, on the
group's executor, within its deadline): every member connects its pairs and votes; one
member that is not on shared memory with its neighbours (another node, shared memory
off), or whose environment sets :data:`RING_ENV` to ``"0"``, keeps every member on gloo.
All members take part in the exchange, so all decide alike.

Groups joined by rank (``join_ranked_group``, whose member names are aliases) stay on
gloo: p2p-worker's ``ray.util.collective`` layer builds its own ring for them.

The gloo process group and the liveness connections stay: object broadcasts,
``send_tensor`` / ``recv_tensor``, the operations the ring leaves to gloo (see
:func:`~p2p_collective._groups._ring_ops.takes`) and arguments it does not take (empty
tensors, reduce ops other than sum / product / min / max) travel there as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch

from p2p_collective._deadline import remaining
from p2p_collective._errors import CollectiveTimeoutError, PeerError
from p2p_collective._groups._group import CollectiveGroup
from p2p_collective._groups._multi_ops import reduce_op_name
from p2p_collective._groups._pair_ops import PairCollectives
from p2p_collective._groups._ring_ops import RingCollectives
from p2p_collective._links._waiter import Gone

RING_ENV = "P2P_COLLECTIVE_RING"
"""Set to ``"0"`` in a member's environment to keep its N-member groups on gloo.

A vote: one member that sets it keeps every member of the group on gloo (the others
still take part in the decision, so members that differ never deadlock).
"""


@runtime_checkable
class PairMaker(Protocol):
    """What builds the pairs: the owner ``Collective``'s ``create_pair_group``."""

    def create_pair_group(
        self, worker_addresses: Sequence[object], group_name: str | None = None
    ) -> CollectiveGroup: ...


class SharedMemoryRoute:
    """One N-member group's collectives over shared memory, decided at the first one.

    Each operation method returns False when the group runs that call on gloo (decided
    against shared memory, or the ring leaves it to gloo), True when it ran it here.
    Called only by the group's executing operation, one at a time.

    Args:
        name: The group's key. rank: This member's rank.
        member_names: Member names by rank (real addresses).
        maker: Builds the pairs; None keeps the group on gloo (ranked groups).
        gone: The group's "a member is gone" check (its error, or None).
    """

    def __init__(
        self,
        name: str,
        rank: int,
        member_names: Sequence[str],
        maker: PairMaker | None,
        gone: Gone,
    ) -> None:
        self._name = name
        self._rank = rank
        self._names = list(member_names)
        self._maker = maker
        self._gone = gone
        self._lock = threading.Lock()
        self._pairs: list[CollectiveGroup] = []
        self._shm: PairCollectives | RingCollectives | None = None
        self._decided = maker is None
        self._closed = False

    @property
    def transport(self) -> str | None:
        """``"shm"``, ``"gloo"``, or None before the first tensor collective decided it."""
        if not self._decided:
            return None
        return "gloo" if self._shm is None else "shm"

    # -- deciding -------------------------------------------------------------------------

    def _pair(self, peer: int, key: str) -> CollectiveGroup:
        assert self._maker is not None
        pair = self._maker.create_pair_group(
            [self._names[self._rank], self._names[peer]], group_name=key
        )
        with self._lock:
            self._pairs.append(pair)
            closed = self._closed
        if closed:  # closed meanwhile: the pair must not outlive the group
            pair.close(timeout=0.0)
        return pair

    def _decide(self, deadline: float | None) -> PairCollectives | RingCollectives | None:
        if self._decided:
            return self._shm
        wanted = os.environ.get(RING_ENV, "1") != "0"
        r, n = self._rank, len(self._names)

        def key(peer: int) -> str:
            if n == 2:
                return f"{self._name}/pairs"
            return f"{self._name}/ring/{min(r, peer)}-{max(r, peer)}"

        def build() -> bool:
            if n == 2:
                shm: PairCollectives | RingCollectives = PairCollectives(
                    self._pair(1 - r, key(1 - r)), r
                )
            else:
                left, right = (r - 1) % n, (r + 1) % n
                shm = RingCollectives(
                    self._pair(left, key(left)), self._pair(right, key(right)), r, n
                )
            if not shm.connect(remaining(deadline), wanted):
                return False
            with self._lock:
                if not self._closed:
                    self._shm = shm
            return True

        try:
            on = self._call("connecting shared memory", build)
        except BaseException:
            self._close_pairs()
            raise
        finally:
            self._decided = True  # a failure above breaks the group: never try again
        if not on:
            self._close_pairs()  # gloo it is: the pairs are not needed
        return self._shm

    def _take(
        self, op: str, t: torch.Tensor | None, deadline: float | None
    ) -> PairCollectives | RingCollectives | None:
        shm = self._decide(deadline)
        if shm is None or (t is not None and (t.numel() == 0 or not shm.takes(op, t))):
            return None
        return shm

    def _call(self, label: str, fn: Callable[[], bool | None]) -> bool:
        """Run ``fn``; map a failure to the group's errors (as a gloo failure maps)."""
        try:
            return bool(fn())
        except Exception as exc:
            gone = self._gone()
            if gone is not None:
                raise gone from exc
            what = f"coll[{self._name}]: {label}"
            if isinstance(exc, CollectiveTimeoutError):
                raise CollectiveTimeoutError(f"{what} did not complete in time ({exc})") from exc
            raise PeerError(f"{what} failed on shared memory: {exc}") from exc

    # -- the operations (arguments checked by the group) ----------------------------------

    def allreduce(self, t: torch.Tensor, op: object, deadline: float | None) -> bool:
        """``t`` becomes the reduction of every member's ``t``."""
        shm, name = self._take("allreduce", t, deadline), reduce_op_name(op)
        if shm is None or name is None:
            return False
        self._call("allreduce", lambda: shm.allreduce(t, name, remaining(deadline)))
        return True

    def broadcast(self, t: torch.Tensor, src: int, deadline: float | None) -> bool:
        """``t`` of ``src`` is copied into ``t`` of every member."""
        shm = self._take("broadcast", t, deadline)
        if shm is None:
            return False
        self._call("broadcast_tensor", lambda: shm.broadcast(t, src, remaining(deadline)))
        return True

    def reduce(self, t: torch.Tensor, dst: int, op: object, deadline: float | None) -> bool:
        """``t`` of ``dst`` becomes the reduction; the others' ``t`` is unchanged."""
        shm, name = self._take("reduce", t, deadline), reduce_op_name(op)
        if shm is None or name is None:
            return False
        self._call("reduce", lambda: shm.reduce(t, dst, name, remaining(deadline)))
        return True

    def allgather(self, outs: list[torch.Tensor], t: torch.Tensor, deadline: float | None) -> bool:
        """``outs[r]`` becomes member ``r``'s ``t`` (outputs unlike ``t``: gloo, as before)."""
        shm = self._take("allgather", t, deadline)
        if shm is None or any(o.shape != t.shape or o.dtype != t.dtype for o in outs):
            return False
        self._call("allgather", lambda: shm.allgather(outs, t, remaining(deadline)))
        return True

    def reduce_scatter(
        self, out: torch.Tensor, ins: list[torch.Tensor], op: object, deadline: float | None
    ) -> bool:
        """``out`` becomes the reduction of every member's ``ins[rank]``."""
        shm, name = self._take("reducescatter", out, deadline), reduce_op_name(op)
        if shm is None or name is None:
            return False
        self._call("reduce_scatter", lambda: shm.reducescatter(out, ins, name, remaining(deadline)))
        return True

    def barrier(self, deadline: float | None) -> bool:
        """Return once every member has reached the barrier."""
        shm = self._take("barrier", None, deadline)
        if shm is None:
            return False
        self._call("barrier", lambda: shm.barrier(remaining(deadline)))
        return True

    # -- closing --------------------------------------------------------------------------

    def _close_pairs(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:  # never blocks: a running operation fails, the peers see it
            with contextlib.suppress(Exception):
                pair.close(timeout=0.0)

    def close(self) -> None:
        """Close the pairs (never blocks); later calls run nothing. Idempotent.

        Called when the group closes and when a member is gone: an operation blocked on
        a pair then fails at once, and the neighbours' pairs see this side close.
        """
        with self._lock:
            self._closed = True
        self._close_pairs()
