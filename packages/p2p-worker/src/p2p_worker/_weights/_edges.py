"""The links of a weight sync: a dedicated pair group per edge, and an outbox per child.

Weight sync never shares a pair group with a worker's own ``send``/``recv``: each edge
uses the group keyed ``weights.<sync>.<source>.<a>+<b>``, so neither user messages
between the same two workers nor the relay of another source (a shard) can interleave
with a source's buckets. A group that a failure broke is closed and made
again at its next use (both sides do so: the peer sees the close and breaks its side).

An outbox to a child that the plan marks lent first names the parent's arena to it
(``lend``, answered by ``borrow``); from then on a full bucket whose buffer lies in the
arena travels as a ``lent`` header only, and its slot is freed when the child has read
it (:class:`~p2p_worker._weights._arena.Lender`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import TypeAlias

import torch

from p2p_collective import Collective, CollectiveGroup, CollectiveTimeoutError
from p2p_worker._weights import _messages as m
from p2p_worker._weights._arena import Lender


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (never negative); None for no deadline."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def deadline_after(timeout: float | None) -> float | None:
    """The monotonic deadline ``timeout`` seconds from now (None: none)."""
    return None if timeout is None else time.monotonic() + timeout


class Edges:
    """The pair groups of one sync from this worker, one per peer, made on first use."""

    def __init__(self, collective: Collective, me: str, sync: str, source: str) -> None:
        self._coll = collective
        self._me = me
        self._prefix = f"weights.{sync}.{source}."

    def group(self, peer: str) -> CollectiveGroup:
        """The usable group toward ``peer`` (a broken or closed one is made again)."""
        key = self._prefix + "+".join(sorted((self._me, peer)))
        group = self._coll.create_pair_group([self._me, peer], group_name=key)
        if not group.peer_gone:
            stats = group.stats()
            if stats["send"]["broken"] or stats["recv"]["broken"]:
                group.close(timeout=0.0)
                group = self._coll.create_pair_group([self._me, peer], group_name=key)
        return group

    def drop(self, peer: str) -> None:
        """Close the group toward ``peer`` after a failure (the next use makes a new one)."""
        key = self._prefix + "+".join(sorted((self._me, peer)))
        group = self._coll.groups.get(key)
        if group is not None and not group.peer_gone:
            group.close(timeout=0.0)


Payload = Callable[[], "torch.Tensor | None"]
_Job: TypeAlias = tuple[object, "Payload | None", Callable[[], None]]
"""An outbox job: a message for the wire, the payload if any, and what frees its slot."""


def ready(tensor: torch.Tensor | None) -> Payload | None:
    """The payload function of a tensor at hand (None: no payload)."""
    if tensor is None:
        return None

    def give() -> torch.Tensor:
        return tensor

    return give


class Outbox:
    """Sends to one child in bucket order on a thread of its own.

    Each job is a message (``_messages``) and a function giving the payload (it may
    wait, for instance for the bucket to be applied here first); ``release`` runs once
    the job is sent or dropped, or, for a lent bucket, once the child has read it.
    After the first failure every later job is dropped.

    Args:
        lent: The plan says this child reads full buckets from this worker's arena: the
            outbox names it first (``lender`` None: there is none, the child is told so
            and gets every bucket by value).
        lender: This run's :class:`~p2p_worker._weights._arena.Lender`.
    """

    def __init__(
        self,
        group: CollectiveGroup,
        child: str,
        deadline: float | None,
        on_fail: Callable[[str, BaseException], None],
        *,
        lent: bool = False,
        lender: Lender | None = None,
    ) -> None:
        self.child = child
        self.error: BaseException | None = None
        self.sent_bytes = 0
        self.refused: str | None = None
        """Why a lent child gets its buckets by value after all (None: it reads the arena)."""
        self._group = group
        self._deadline = deadline
        self._on_fail = on_fail
        self._lent = lent
        self._lender = lender
        self._lending = False
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(
            target=self._run, name=f"p2p-weights-to-{child}", daemon=True
        )
        self._thread.start()

    def put(self, msg: object, payload: Payload | None, release: Callable[[], None]) -> None:
        """Queue one message (then the payload if any)."""
        self._jobs.put((msg, payload, release))

    def finish(self) -> None:
        """Wait until every queued job is sent or dropped (the deadline bounds the sends)."""
        self._jobs.put(None)
        left = remaining(self._deadline)
        self._thread.join(None if left is None else left + 5.0)
        if self._thread.is_alive() and self.error is None:
            self.error = CollectiveTimeoutError(
                f"weight sync: sending to {self.child} did not finish in time"
            )

    def _run(self) -> None:
        if self._lent:
            try:
                self._lend()
            except BaseException as exc:  # every failure is reported once
                self.error = exc
                self._on_fail(self.child, exc)
        while True:
            job = self._jobs.get()
            if job is None:
                return
            msg, payload, release = job
            kept = False
            try:
                if self.error is None:
                    kept = self._send(msg, payload, release)
            except BaseException as exc:  # every failure is reported once
                self.error = exc
                self._on_fail(self.child, exc)
            finally:
                if not kept:
                    release()

    def _lend(self) -> None:
        """Name the arena to the child and learn whether it mapped it."""
        lender = self._lender
        line = None if lender is None else lender.line(self.child, self._group)
        if lender is None or line is None:
            why = "no shared arena" if lender is None else "the arena has no line left"
            self.refused = why
            self._group.send(m.to_wire(m.Lend(0, -1, 0, "", 0, why)), timeout=self._left())
            return
        a = lender.arena
        offer = m.Lend(a.pid, a.fd, a.nbytes, a.id, line)
        self._group.send(m.to_wire(offer), timeout=self._left())
        got = m.from_wire(self._group.recv(timeout=self._left()), (m.Borrow,), self.child, "borrow")
        self._lending = got.ok
        self.refused = None if got.ok else got.why or "refused"

    def _left(self) -> float | None:
        return remaining(self._deadline)

    def _send(self, msg: object, payload: Payload | None, release: Callable[[], None]) -> bool:
        """Send one job; True when a lender now holds ``release`` (a lent bucket)."""
        tensor = None if payload is None else payload()
        if self._lending and tensor is not None and isinstance(msg, m.Header):
            assert self._lender is not None
            offset = self._lender.arena.offset_of(tensor) if msg.mode == m.FULL else None
            if offset is not None:
                lent = m.Header(msg.index, m.LENT, msg.crc, {"offset": offset}, msg.nbytes)
                self._group.send(m.to_wire(lent), timeout=self._left())
                self._lender.lend(self.child, msg.index, msg.nbytes, release)
                return True
        self._group.send(m.to_wire(msg), timeout=self._left())
        if tensor is not None:
            self._group.send_tensor(tensor, timeout=self._left())
            self.sent_bytes += tensor.numel() * tensor.element_size()
        return False
