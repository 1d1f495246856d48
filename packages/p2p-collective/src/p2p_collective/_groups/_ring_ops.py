"""The collectives of a group of three or more members on one node, over shared memory.

Each member holds two of the group's own two-party groups (keys ending in
``/ring/<a>-<b>``): one with its left neighbour (rank - 1) and one with its right
neighbour (rank + 1, both modulo N). Every step of every operation sends to the right
and receives from the left, so each member moves its bytes through the shared-memory
links of one node instead of handing them to gloo's threads and TCP connections.

- ``allgather``: a ring of N - 1 steps; in step k member r passes on the tensor of
  member r - k.
- ``allreduce``: large tensors as a ring reduce-scatter (each of N chunks is reduced
  along the ring, ending at one owner) followed by a ring allgather of the reduced
  chunks; small ones (up to :data:`SMALL_ALLREDUCE`) as an allgather of the whole
  tensors followed by a local reduction in rank order. Either way every member ends
  with the same bits: a chunk is reduced once and then copied, or every member
  reduces the same tensors in the same order.
- ``broadcast``: a chain from the root, right-wards, one message per hop (pieces of
  :data:`CHAIN_CHUNK` beyond that size; the shared-memory link already overlaps the
  sender's and the receiver's copies of each hop, slot by slot).
- ``reduce``: a chain ending at the destination, right-wards, likewise.
- ``reducescatter``: a ring reduce-scatter of the items.
- ``barrier``: N - 1 steps of one byte (member r has then heard, through its left
  neighbour, from every member, each of which had entered the barrier).

Whether to use it is decided at the first collective: each member connects its two
pairs (in the global order of the pairs, so no member waits on one that waits on it),
then the members pass round the ring the minimum of "both my pairs are on shared
memory" (N - 1 steps), so all members decide alike.

A failure inside an operation (a member died, a timeout) closes this member's pairs, so
its neighbours fail too, theirs in turn, and the whole ring fails within moments instead
of waiting for the operation's timeout. The group's collectives then keep failing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from p2p_asyncwork import AsyncResultWork
from p2p_collective._deadline import remaining
from p2p_collective._errors import GroupBrokenError, PeerError, PeerGoneError
from p2p_collective._groups._group import CollectiveGroup
from p2p_collective._groups._pair_ops import SYNC_SEND_MAX, combine  # a step sends alike

SMALL_ALLREDUCE = 64 << 10
"""Bytes up to which ``allreduce`` gathers whole tensors and reduces them locally."""

CHAIN_CHUNK = 64 << 20
"""Bytes per message of the chains (``broadcast``, ``reduce``): up to this, one message.

Measured on 2 busy cores (load 10 to 16, 8 members, the slowest member's median of 5 to
9 rounds, ring pieces of several sizes alternating in the same sitting with Ray's gloo):
a 16 MiB broadcast took 46.5 / 35.7 / 28.4 / 23.1 / 21.2 ms in pieces of 1 / 2 / 4 / 8 /
16 MiB (Ray 42-44 ms, gloo through p2p 39-41 ms); 64 MiB 213 / 205 / 106 / 107 / 60 ms
in pieces of 1 / 4 / 8 / 16 / 64 MiB (Ray 248 ms); with 4 members 16 MiB 16.8 / 13.1 /
10.2 / 9.2 ms in pieces of 1 / 4 / 8 / 16 MiB (Ray 32 ms); a 16 MiB reduce of 8 members
48.5 / 37.4 / 30.3 ms in pieces of 1 / 4 / 16 MiB (Ray 69 ms). Each piece costs a hand-off
to the sending thread and a wake-up per hop, and on two cores the hops cannot run side
by side anyway: within one hop the link already overlaps both copies.
"""


GLOO_FROM_MEMBERS = 8
"""From this many members, some allreduces stay on gloo (see :func:`takes`)."""

GLOO_ALLREDUCE_BELOW = 16 << 20
"""Bytes below which (and above :data:`SMALL_ALLREDUCE`) such an ``allreduce`` stays on gloo."""


def takes(op: str, nbytes: int, size: int) -> bool:
    """Whether the ring runs ``op`` on ``nbytes`` per member in a group of ``size``.

    Measured (2 busy cores, ``bench_collectives.py``, 4 KiB / 1 MiB / 16 MiB, same
    sittings as gloo): the ring won or tied every cell of 4 members, and every cell of
    8 but a 1 MiB ``allreduce`` (0.63x of Ray's against gloo's 0.94x: the ring's
    2 (N - 1) = 14 steps of 128 KiB, each handed to a sending thread, cost more than
    gloo's fewer steps), which stays on gloo, as do sizes between it and the measured
    wins. (A 16 MiB ``broadcast`` of 8 members stayed on gloo too while the chain
    moved 1 MiB pieces; as one message per hop it took 21-23 ms against gloo's 39-41 ms
    and Ray's 42-44 ms, see :data:`CHAIN_CHUNK`.) Every member computes the same answer
    from the same arguments (Ray requires equal sizes), so all take one path.
    """
    if size < GLOO_FROM_MEMBERS:
        return True
    if op == "allreduce":
        return not SMALL_ALLREDUCE < nbytes < GLOO_ALLREDUCE_BELOW
    return True


def _flat(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1)


def _bounds(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` consecutive ranges covering ``range(n)`` (sizes differ by at most one)."""
    cuts = [i * n // parts for i in range(parts + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(parts)]


def _pieces(n: int, itemsize: int, chunk: int) -> Iterator[tuple[int, int]]:
    """Consecutive ranges of ``range(n)`` of at most ``chunk`` bytes (at least one item)."""
    step = max(1, chunk // max(1, itemsize))
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


class RingCollectives:
    """The collectives of an N-member group (N >= 3) over its ring of shared-memory pairs.

    Args:
        left: The two-party group with member ``rank - 1``.
        right: The two-party group with member ``rank + 1``.
        rank: This member's rank.
        size: Number of members.
        chain_bytes: Bytes per message of ``broadcast`` and ``reduce`` (every member must
            pass the same value).
    """

    def __init__(
        self,
        left: CollectiveGroup,
        right: CollectiveGroup,
        rank: int,
        size: int,
        chain_bytes: int = CHAIN_CHUNK,
    ):
        self.left = left
        self.right = right
        self.rank = rank
        self.size = size
        self.chain_bytes = chain_bytes
        self._spare: torch.Tensor | None = None
        self._broken: BaseException | None = None

    # -- connecting ---------------------------------------------------------------------

    def connect(self, timeout: float | None, wanted: bool = True) -> bool:
        """Connect both pairs and agree with every member; True when all are on shm.

        Args:
            timeout: Seconds for the whole exchange (None: no limit).
            wanted: This member's vote for the ring (False: it asks every member to stay
                on gloo; all still decide alike).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        r, n = self.rank, self.size
        edges = sorted(
            [
                (min(r, (r - 1) % n), max(r, (r - 1) % n), self.left),
                (min(r, (r + 1) % n), max(r, (r + 1) % n), self.right),
            ],
            key=lambda e: (e[0], e[1]),
        )
        probe = torch.zeros(1, dtype=torch.uint8)
        for low, _high, pair in edges:
            # the lower rank of a pair sends first, the higher receives first
            if r == low:
                pair.send_tensor(probe, timeout=remaining(deadline))
                pair.recv_tensor(probe, timeout=remaining(deadline))
            else:
                pair.recv_tensor(probe, timeout=remaining(deadline))
                pair.send_tensor(probe, timeout=remaining(deadline))
        mine = wanted and all(
            pair.stats()[side].get("transport") == "shm"
            for pair in (self.left, self.right)
            for side in ("send", "recv")
        )
        verdict = torch.tensor([1 if mine else 0], dtype=torch.uint8)
        got = torch.zeros(1, dtype=torch.uint8)
        for _ in range(n - 1):
            sent = self.right.send_tensor(verdict, async_op=True, timeout=remaining(deadline))
            self.left.recv_tensor(got, timeout=remaining(deadline))
            sent.wait(timeout=remaining(deadline))
            verdict = torch.minimum(verdict, got)
        return bool(verdict.item())

    # -- plumbing -------------------------------------------------------------------------

    def _scratch(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        """A kept flat buffer of ``n`` items (reused: fresh memory costs page faults)."""
        buf = self._spare
        if buf is None or buf.dtype != dtype or buf.numel() < n:
            buf = self._spare = torch.empty(n, dtype=dtype)
        return buf[:n]

    def _step(self, mine: torch.Tensor, theirs: torch.Tensor, deadline: float | None) -> None:
        """Send ``mine`` to the right while receiving the left's tensor into ``theirs``."""
        if mine.numel() * mine.element_size() <= SYNC_SEND_MAX:
            self.right.send_tensor(mine, timeout=remaining(deadline))
            self.left.recv_tensor(theirs, timeout=remaining(deadline))
            return
        sent = self.right.send_tensor(mine, async_op=True, timeout=remaining(deadline))
        try:
            self.left.recv_tensor(theirs, timeout=remaining(deadline))
        finally:
            sent.wait(timeout=remaining(deadline))

    def run(self, fn: Callable[..., None], *args: Any, timeout: float | None) -> None:
        """Run one operation; a failure breaks the ring (closes both pairs) and re-raises.

        Raises:
            PeerGoneError: An earlier operation failed because a member died (its cause).
            GroupBrokenError: An earlier operation failed otherwise (its cause).
        """
        if self._broken is not None:
            # The same errors a pair group gives once its peer is gone: a caller that
            # catches PeerError for a dead member catches the later operations too.
            gone = isinstance(self._broken, PeerError)
            cls = PeerGoneError if gone else GroupBrokenError
            raise cls(f"the group's collectives failed earlier: {self._broken}") from self._broken
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            fn(*args, deadline)
        except BaseException as exc:
            self._broken = exc
            self.close()
            raise

    # -- the collectives (arguments checked by the caller) -------------------------------

    def _allgather(self, out: list[torch.Tensor], t: torch.Tensor, deadline: float | None) -> None:
        """``out[r]`` becomes member ``r``'s ``t`` on every member."""
        r, n = self.rank, self.size
        out[r].copy_(t)
        for k in range(n - 1):
            self._step(out[(r - k) % n], out[(r - k - 1) % n], deadline)

    def _allreduce(self, t: torch.Tensor, op: str, deadline: float | None) -> None:
        """``t`` becomes the reduction of every member's ``t`` (same bits on all)."""
        r, n = self.rank, self.size
        flat = _flat(t)
        count = flat.numel()
        if count * t.element_size() <= SMALL_ALLREDUCE or count < n:
            buf = self._scratch(n * count, t.dtype)
            parts = [buf[i * count : (i + 1) * count] for i in range(n)]
            self._allgather(parts, flat, deadline)
            flat.copy_(parts[0])
            for i in range(1, n):
                combine(flat, parts[i], op)
            return
        bounds = _bounds(count, n)
        chunks = [flat[lo:hi] for lo, hi in bounds]
        widest = max(hi - lo for lo, hi in bounds)
        got = self._scratch(widest, t.dtype)
        # reduce-scatter: after step k, chunk r - k - 1 holds the reduction over
        # members r - k - 1 .. r; after N - 1 steps chunk r + 1 is complete here
        for k in range(n - 1):
            into = chunks[(r - k - 1) % n]
            recv = got[: into.numel()]
            self._step(chunks[(r - k) % n], recv, deadline)
            combine(into, recv, op)
        # allgather of the complete chunks: member r owns chunk r + 1
        for k in range(n - 1):
            self._step(chunks[(r + 1 - k) % n], chunks[(r - k) % n], deadline)

    def _broadcast(self, t: torch.Tensor, src: int, deadline: float | None) -> None:
        """``t`` of ``src`` is copied into ``t`` of every member, along a chain."""
        pos = (self.rank - src) % self.size
        flat = _flat(t)
        sends: list[AsyncResultWork[None]] = []
        try:
            for lo, hi in _pieces(flat.numel(), t.element_size(), self.chain_bytes):
                piece = flat[lo:hi]
                if pos > 0:
                    self.left.recv_tensor(piece, timeout=remaining(deadline))
                if pos < self.size - 1:
                    self._forward(piece, hi == flat.numel(), sends, deadline)
        finally:
            for s in sends:
                s.wait(timeout=remaining(deadline))

    def _reduce(self, t: torch.Tensor, dst: int, op: str, deadline: float | None) -> None:
        """``t`` of ``dst`` becomes the reduction; the other members' ``t`` is unchanged.

        The chain starts at ``dst + 1``; each member adds its ``t`` to what its left
        neighbour sent and passes it right, until ``dst``.
        """
        pos = (self.rank - dst - 1) % self.size  # 0: the chain's start, N - 1: dst
        flat = _flat(t)
        last = self.size - 1
        acc = flat if pos == last else self._scratch(flat.numel(), t.dtype)
        sends: list[AsyncResultWork[None]] = []
        try:
            for lo, hi in _pieces(flat.numel(), t.element_size(), self.chain_bytes):
                if pos == 0:
                    self._forward(flat[lo:hi], hi == flat.numel(), sends, deadline)
                    continue
                if pos == last:
                    got = self._chain_buf(hi - lo, t.dtype)
                    self.left.recv_tensor(got, timeout=remaining(deadline))
                    combine(flat[lo:hi], got, op)
                    continue
                piece = acc[lo:hi]
                self.left.recv_tensor(piece, timeout=remaining(deadline))
                combine(piece, flat[lo:hi], op)
                self._forward(piece, hi == flat.numel(), sends, deadline)
        finally:
            for s in sends:
                s.wait(timeout=remaining(deadline))

    def _forward(
        self,
        piece: torch.Tensor,
        last: bool,
        sends: list[AsyncResultWork[None]],
        deadline: float | None,
    ) -> None:
        """Send a chain's piece to the right: the last one in this thread, others queued.

        An earlier piece's send runs on the pair's sending thread while this thread
        receives the next piece; the last one (the only one, up to :data:`CHAIN_CHUNK`)
        has nothing to overlap with, and a send in the calling thread saves the hand-off
        to the sending thread and the wake-up back (it still goes after the queued ones).
        Measured on 2 busy cores, 8 members, 1 MiB, same sitting (median of 15): broadcast
        6.23 ms with a queued last send, 5.45 ms sent here; reduce 7.80 and 6.30 ms.
        """
        if last:
            self.right.send_tensor(piece, timeout=remaining(deadline))
        else:
            sends.append(self.right.send_tensor(piece, async_op=True, timeout=remaining(deadline)))

    def _chain_buf(self, n: int, dtype: torch.dtype) -> torch.Tensor:
        return self._scratch(n, dtype)

    def _reducescatter(
        self, out: torch.Tensor, items: list[torch.Tensor], op: str, deadline: float | None
    ) -> None:
        """``out`` becomes the reduction of every member's ``items[rank]``.

        In step k member r sends its partial reduction of item r - k - 1 right and
        receives the left's partial reduction of item r - k - 2, to which it adds its
        own; after N - 1 steps the item it received last is item r.
        """
        r, n = self.rank, self.size
        count = out.numel()
        spare = self._scratch(2 * count, out.dtype)
        bufs = [spare[:count], spare[count:]]
        send = _flat(items[(r - 1) % n])
        for k in range(n - 1):
            into = bufs[k % 2]  # never ``out``: it may be one of the items
            self._step(send, into, deadline)
            combine(into, _flat(items[(r - k - 2) % n]), op)
            send = into
        _flat(out).copy_(send)

    def _barrier(self, deadline: float | None) -> None:
        """Return once every member has reached its barrier."""
        token = torch.zeros(1, dtype=torch.uint8)
        got = torch.empty(1, dtype=torch.uint8)
        for _ in range(self.size - 1):
            self._step(token, got, deadline)

    # -- the public forms: PairCollectives' signatures ------------------------------------

    def takes(self, op: str, t: torch.Tensor) -> bool:
        """Whether this ring runs ``op`` on ``t`` (else the group's gloo does)."""
        return takes(op, t.numel() * t.element_size(), self.size)

    def allreduce(self, t: torch.Tensor, op: str, timeout: float | None) -> None:
        """See :meth:`_allreduce`."""
        self.run(self._allreduce, t, op, timeout=timeout)

    def broadcast(self, t: torch.Tensor, src: int, timeout: float | None) -> None:
        """See :meth:`_broadcast`."""
        self.run(self._broadcast, t, src, timeout=timeout)

    def reduce(self, t: torch.Tensor, dst: int, op: str, timeout: float | None) -> None:
        """See :meth:`_reduce`."""
        self.run(self._reduce, t, dst, op, timeout=timeout)

    def allgather(self, out: list[torch.Tensor], t: torch.Tensor, timeout: float | None) -> None:
        """See :meth:`_allgather`."""
        self.run(self._allgather, out, t, timeout=timeout)

    def reducescatter(
        self, out: torch.Tensor, items: list[torch.Tensor], op: str, timeout: float | None
    ) -> None:
        """See :meth:`_reducescatter`."""
        self.run(self._reducescatter, out, items, op, timeout=timeout)

    def barrier(self, timeout: float | None) -> None:
        """See :meth:`_barrier`."""
        self.run(self._barrier, timeout=timeout)

    def close(self) -> None:
        """Close both pairs (the neighbours see them as gone)."""
        self._spare = None
        for pair in (self.left, self.right):
            with contextlib.suppress(Exception):
                pair.close()
