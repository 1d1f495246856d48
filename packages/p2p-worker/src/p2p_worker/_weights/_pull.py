"""One pull's buckets on a target: receive, forward, apply and check.

:class:`TargetState` is what a target keeps from one pull to the next (its pair groups,
the generation each bucket holds, its bucket buffers and arenas); :class:`PullRun` moves
one version's buckets through it. :class:`~p2p_worker._weights._target.WeightReceiver`
is the user-facing side that plans a pull and runs one.

A target that the plan marks lent reads full buckets from its parent's shared arena
(the parent is on its node: the source, or the node's first target) instead of
receiving them, and counts each one it has finished in the arena so that the parent
can reuse its slot. A target whose children are lent keeps its own buckets in flight in
an arena of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import TypedDict

import torch

from p2p_collective import CollectiveGroup, PeerError
from p2p_worker._weights import _messages as m
from p2p_worker._weights._arena import Arena, Borrowed, Lender, fit_arena, lending_off
from p2p_worker._weights._codec import apply_delta, checksum
from p2p_worker._weights._edges import Edges, Outbox, ready, remaining
from p2p_worker._weights._layout import Layout, gather, pieces, scatter
from p2p_worker._weights._pipeline import BucketPools, Slot, Slots
from p2p_worker._weights._topology import Tree

INFLIGHT = 3  # buckets a target holds beyond its model (received, applying, forwarding)


class PullStats(TypedDict, total=False):
    """What one pull saw (``WeightReceiver.last_stats``)."""

    received_bytes: int
    modes: dict[str, int]  # how many buckets came in each mode
    lost: dict[str, str]  # child -> why forwarding to it failed
    resumed_at: int  # the bucket a resume from the source started at
    unshared: str  # why this lent target got its buckets by value after all


@dataclass
class TargetState:
    """What one target keeps from one pull of a sync to the next."""

    me: str
    source: str
    sync: str
    edges: Edges
    gens: list[str | None] = field(default_factory=list)
    """The generation each bucket holds bit-exactly (None: none it can prove)."""
    progress: tuple[int, int] = (0, 0)
    """Buckets checked and applied by the running (or last) pull, and its bucket count."""
    pools: BucketPools = field(default_factory=lambda: BucketPools(INFLIGHT))
    arena: Arena | None = None
    """What this worker lends its same-node children."""
    borrowed: Borrowed | None = None
    """The parent's arena, mapped."""

    def borrow(self, lend: m.Lend) -> Borrowed:
        """The parent's arena named by ``lend``, mapped (kept for the next pull).

        Raises:
            OSError, ValueError: It cannot be mapped from here.
        """
        key = (lend.pid, lend.fd, lend.nbytes, lend.arena)
        if self.borrowed is not None and self.borrowed.key == key:
            return self.borrowed
        if self.borrowed is not None:
            self.borrowed.close()
            self.borrowed = None
        self.borrowed = Borrowed(lend.pid, lend.fd, lend.nbytes, lend.arena)
        return self.borrowed


class PullRun:
    """One pull's buckets: receive, forward, apply and check."""

    def __init__(
        self,
        st: TargetState,
        plan: m.Plan,
        layout: Layout,
        own: list[torch.Tensor],
        deadline: float | None,
    ) -> None:
        self.st = st
        self.plan = plan
        self.layout = layout
        self.own = own
        self.deadline = deadline
        self.tree = Tree(st.source, plan.order, plan.parent, plan.lent)
        self.errors: list[str] = []
        self.cause: BaseException | None = None
        self.stats: PullStats = {"received_bytes": 0, "modes": {}}
        self.await_lend = st.me in plan.lent  # the parent names its arena first
        self.borrowed: Borrowed | None = None
        self.line = 0
        self.read = 0  # lent buckets finished (counted in the parent's arena)
        self.stale: dict[str, set[int]] = {}  # child -> buckets whose base it lacks

    def _fail(self, child: str, exc: BaseException) -> None:
        self.st.edges.drop(child)

    def go(self) -> list[str]:
        st, plan = self.st, self.plan
        me = st.me
        parent = plan.parent[me]
        children = self.tree.children(me)
        self.stale = {c: set(plan.stale.get(c, ())) for c in children}
        lender = self._lender(children)
        boxes = [
            Outbox(
                st.edges.group(c),
                c,
                self.deadline,
                self._fail,
                lent=c in plan.lent,
                lender=lender,
            )
            for c in children
        ]
        arena = None if lender is None else lender.arena
        slots = Slots(INFLIGHT, st.pools.get(self.layout), arena)
        applier = ThreadPoolExecutor(1, thread_name_prefix=f"p2p-weights-apply-{st.sync}")
        pgroup = st.edges.group(parent)
        try:
            for index in range(len(self.layout.buckets)):
                users = 1 + len(boxes)  # the applier and each child's outbox
                try:  # a slot first: at most INFLIGHT buckets are held at once
                    release = slots.take(users, self.deadline, f"bucket {index}")
                except Exception as exc:
                    self.cause = exc
                    self.errors.append(str(exc))
                    self._abort_children(boxes, exc)
                    break
                try:
                    head, payload, lent = self._receive(pgroup, parent, index, release)
                except PeerError as exc:
                    if parent == st.source or not self._resume(index, exc):
                        _release_all(release, users)
                        self._abort_children(boxes, exc)
                        break
                    parent, pgroup = st.source, st.edges.group(st.source)
                    try:
                        head, payload, lent = self._receive(pgroup, parent, index, release)
                    except Exception as again:
                        _release_all(release, users)
                        self._abort_children(boxes, again)
                        break
                except Exception as exc:
                    _release_all(release, users)
                    self._abort_children(boxes, exc)
                    break
                # Children that take the bucket as it came get it before it is applied:
                # the last bucket's hop down the tree does not wait for this one's apply.
                # (Not a lent bucket: its bytes are the parent's until they are read.)
                early: list[Outbox] = []
                later: list[Outbox] = []
                for box in boxes:
                    as_is = not lent and self._takes_as_received(box, head)
                    (early if as_is else later).append(box)
                for box in early:
                    box.put(head, ready(payload), release)
                copy = bool(later) and not lent  # a child needs this target's own copy
                applied = applier.submit(self._apply, index, head, payload, release, copy, lent)
                applied.add_done_callback(_releaser(release))
                if lent:  # in bucket order: one applier thread
                    applied.add_done_callback(self._finished_reading)
                for box in later:
                    self._forward(box, head, payload, applied, release, lent)
        finally:
            applier.shutdown(wait=True)
            for box in boxes:
                box.finish()
                if box.error is not None:  # the source hears of it from the child itself
                    self.stats.setdefault("lost", {})[box.child] = repr(box.error)
            if lender is not None:
                lender.finish(self.deadline)
        return self.errors

    def _lender(self, children: list[str]) -> Lender | None:
        """This run's lender when some child is lent, on a fitting arena (None: none)."""
        if not any(c in self.plan.lent for c in children):
            return None
        largest = max((b.nbytes for b in self.layout.buckets), default=1)
        try:
            self.st.arena = fit_arena(self.st.arena, INFLIGHT, largest)
        except OSError:  # the lent children are told, and get their buckets by value
            return None
        return Lender(self.st.arena)

    def _finished_reading(self, _: Future[torch.Tensor | None]) -> None:
        self.read += 1
        if self.borrowed is not None:
            self.borrowed.finish(self.line, self.read)

    def _take_lend(self, group: CollectiveGroup, parent: str) -> None:
        """The parent's first message to a lent target: its arena; map it and answer.

        Raises:
            Exception: The message did not come (recorded in ``errors`` first).
        """
        self.await_lend = False
        got = self._receive_message(group, parent, (m.Lend,), "the arena")
        assert isinstance(got, m.Lend)
        if got.fd < 0:
            self.stats["unshared"] = f"{parent}: {got.why}"
            return
        off = lending_off()
        try:
            if off is not None:
                raise ValueError(off)
            self.borrowed = self.st.borrow(got)
            self.line = got.line
            answer = m.Borrow(True)
        except (OSError, ValueError) as exc:  # by value, and the parent is told why
            self.stats["unshared"] = f"{parent}'s arena is not mapped here: {exc}"
            answer = m.Borrow(False, self.stats["unshared"])
        try:
            group.send(m.to_wire(answer), timeout=remaining(self.deadline))
        except Exception as exc:
            self.st.edges.drop(parent)
            self.cause = exc
            self.errors.append(f"answering {parent}'s arena failed: {exc}")
            raise

    def _receive(
        self, group: CollectiveGroup, parent: str, index: int, slot: Slot
    ) -> tuple[m.Header, torch.Tensor | None, bool]:
        """Bucket ``index``'s header and payload from ``parent``, and whether it was lent.

        A lent bucket comes back as a full one whose payload is a view of the parent's
        arena.

        Raises:
            PeerError: The parent died (or aborted because its own parent died).
            Exception: Another failure; it is recorded in ``errors`` first.
        """
        if self.await_lend:
            self._take_lend(group, parent)
        head = self._receive_header(group, parent, index)
        bucket = self.layout.buckets[index]
        modes = self.stats["modes"]
        if head.mode == m.LENT:
            modes[m.LENT] = modes.get(m.LENT, 0) + 1
            offset = (head.meta or {}).get("offset")
            try:
                if self.borrowed is None or not isinstance(offset, int):
                    raise RuntimeError("it was lent, but no arena is mapped here")
                if head.nbytes != bucket.nbytes:
                    raise RuntimeError(f"it was lent with {head.nbytes} bytes, {bucket.nbytes} due")
                view = self.borrowed.view(offset, bucket.numel, bucket.dtype)
            except (RuntimeError, ValueError) as exc:
                self.cause = exc
                self.errors.append(f"bucket {index} from {parent}: {exc}")
                raise
            return m.Header(index, m.FULL, head.crc, None, head.nbytes), view, True
        if head.mode == m.SAME:
            payload = None
        else:
            if head.mode == m.FULL:
                if head.nbytes != bucket.nbytes:
                    err = RuntimeError(
                        f"bucket {index} arrived with {head.nbytes} bytes, {bucket.nbytes} due"
                    )
                    self.cause = err
                    self.errors.append(str(err))
                    raise err
                payload = slot.buffer(bucket.numel, bucket.dtype)
            else:
                payload = torch.empty(head.nbytes, dtype=torch.uint8)
            try:
                group.recv_tensor(payload, timeout=remaining(self.deadline))
            except Exception as exc:
                self.st.edges.drop(parent)
                self.cause = exc
                self.errors.append(f"receiving bucket {index} from {parent} failed: {exc}")
                raise
            self.stats["received_bytes"] += head.nbytes
        modes[head.mode] = modes.get(head.mode, 0) + 1
        return head, payload, False

    def _resume(self, index: int, exc: BaseException) -> bool:
        """The parent died: ask the source for the buckets from ``index`` on.

        Returns:
            Whether the source took the request (else the pull fails).
        """
        st = self.st
        self.stats["resumed_at"] = index
        self.await_lend = False  # the source resends by value
        try:
            st.edges.group(st.source).send(
                m.to_wire(m.Resume(st.me, index)), timeout=remaining(self.deadline)
            )
        except Exception as err:
            self.errors.append(f"asking the source {st.source} to resume failed: {err}")
            return False
        self.errors.pop()  # the parent's death is routed around, not this target's failure
        self.cause = None
        return True

    def _receive_message(
        self, group: CollectiveGroup, parent: str, kinds: tuple[type, ...], what: str
    ) -> object:
        """The next message from ``parent``, one of ``kinds``; an abort is raised.

        Raises:
            PeerError: The parent died, or aborted because its own parent died.
            Exception: Another failure; it is recorded in ``errors`` first.
        """
        try:
            obj = group.recv(timeout=remaining(self.deadline))
            got = m.from_wire(obj, (*kinds, m.Abort), parent, what)
        except Exception as exc:
            self.st.edges.drop(parent)
            self.cause = exc
            self.errors.append(f"receiving {what} from {parent} failed: {exc}")
            raise
        if isinstance(got, m.Abort):
            cause: BaseException = (
                PeerError(got.reason) if got.peer_died else RuntimeError(got.reason)
            )
            self.cause = cause
            self.errors.append(f"the sync was aborted upstream: {got.reason}")
            raise cause
        return got

    def _receive_header(self, group: CollectiveGroup, parent: str, index: int) -> m.Header:
        got = self._receive_message(group, parent, (m.Header,), f"bucket {index}")
        assert isinstance(got, m.Header)
        if got.index != index:
            err = RuntimeError(f"bucket {got.index} arrived where bucket {index} was due")
            self.cause = err
            self.errors.append(str(err))
            raise err
        head: m.Header = got
        return head

    def _abort_children(self, boxes: list[Outbox], exc: BaseException) -> None:
        died = isinstance(exc, PeerError) or (
            isinstance(self.cause, PeerError) and self.cause is exc
        )
        reason = f"{self.st.me}: {self.errors[-1] if self.errors else exc}"
        for box in boxes:
            box.put(m.Abort(reason, died), None, lambda: None)

    def _takes_as_received(self, box: Outbox, head: m.Header) -> bool:
        """Whether ``box``'s child takes bucket ``head`` as this target received it."""
        child = box.child
        return _as_received(head, head.index in self.stale[child], child in self.plan.lent)

    def _forward(
        self,
        box: Outbox,
        head: m.Header,
        payload: torch.Tensor | None,
        applied: Future[torch.Tensor | None],
        release: Callable[[], None],
        as_received: bool,
    ) -> None:
        """Forward one bucket to a child that did not get it before the apply.

        As received when ``as_received`` (a lent bucket), else the full bucket from this
        worker's own copy once applied.
        """
        if as_received:
            box.put(head, ready(payload), release)
            return
        bucket = self.layout.buckets[head.index]
        full = m.Header(head.index, m.FULL, head.crc, None, bucket.nbytes)

        def own_copy() -> torch.Tensor:
            try:
                bits = applied.result(timeout=remaining(self.deadline))
            except FutureTimeout as exc:
                raise TimeoutError(f"bucket {head.index} was not applied in time") from exc
            if bits is None:  # it failed its check: the error is recorded, nothing to send
                raise RuntimeError(f"bucket {head.index} failed its check here")
            return bits

        box.put(full, own_copy, release)

    def _apply(
        self,
        index: int,
        head: m.Header,
        payload: torch.Tensor | None,
        slot: Slot,
        copy: bool,
        lent: bool = False,
    ) -> torch.Tensor | None:
        """Apply one bucket to the own tensors and check it.

        Returns:
            The bucket's new bits in one buffer when ``copy`` (a stale child gets them in
            full) or when it came full; else None.

        Raises:
            Exception: The bucket could not be applied (recorded in ``errors`` first).
        """
        try:
            return self._apply_checked(index, head, payload, slot, copy, lent)
        except Exception as exc:
            self.cause = exc
            self.errors.append(f"bucket {index} ({head.mode}) could not be applied: {exc}")
            raise

    def _apply_checked(
        self,
        index: int,
        head: m.Header,
        payload: torch.Tensor | None,
        slot: Slot,
        copy: bool,
        lent: bool,
    ) -> torch.Tensor | None:
        bucket = self.layout.buckets[index]
        gens = self.st.gens
        if head.mode == m.FULL and not lent:  # checked in its buffer, written only when right
            assert payload is not None
            got = checksum(payload)
            if got != head.crc:
                self._mismatch(index, head, got, "the bucket keeps its old values")
                return payload
            gens[index] = None  # while it is written
            scatter(bucket, payload, self.own)
        else:  # a delta or a lent bucket is written over the own tensors, checked there
            own = pieces(bucket, self.own)
            if lent:  # the check reads what this worker holds, not the parent's arena
                assert payload is not None
                gens[index] = None  # from here until the check passes
                scatter(bucket, payload, self.own)
            elif head.mode in (m.DELTA, m.PACKED):
                assert payload is not None
                assert head.meta is not None
                gens[index] = None  # from here until the check passes
                apply_delta(head.meta, payload, own)
            got = checksum(own)
            if got != head.crc:
                gens[index] = None
                self._mismatch(index, head, got, "the bucket holds no version it can prove")
                return None
            payload = (
                gather(bucket, self.own, slot.buffer(bucket.numel, bucket.dtype)) if copy else None
            )
        gens[index] = self.plan.gen
        done, total = self.st.progress
        self.st.progress = (done + 1, total)
        return payload

    def _mismatch(self, index: int, head: m.Header, got: int, then: str) -> None:
        self.errors.append(
            f"bucket {index} ({head.mode}) failed its check: checksum {got:#010x}, the"
            f" source's {head.crc:#010x}; {then}"
        )


def _as_received(head: m.Header, child_stale: bool, child_lent: bool) -> bool:
    """Whether a child takes bucket ``head`` as it was received.

    So it does when the bucket came in full; when it came packed and the child is not
    lent (a lent child reads this target's plain bits from its arena instead of
    unpacking them); or when it came as a delta (or unchanged) and the child holds its
    base (``child_stale`` False). Else the child needs this target's own copy, once
    applied.
    """
    if head.mode == m.FULL:
        return True
    if head.mode == m.PACKED:
        return not child_lent
    return not child_stale


def _release_all(release: Callable[[], None], users: int) -> None:
    for _ in range(users):
        release()


def _releaser(release: Callable[[], None]) -> Callable[[Future[torch.Tensor | None]], None]:
    def done(_: Future[torch.Tensor | None]) -> None:
        release()

    return done
