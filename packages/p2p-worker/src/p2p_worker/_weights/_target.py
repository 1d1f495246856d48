"""The target side of a weight sync: pull a version into one's own tensors, in place.

One :class:`WeightReceiver` per worker and sync. Each :meth:`~WeightReceiver.pull` says
hello to the source (what this worker holds), learns the plan, then receives bucket after
bucket from its parent in the relay, forwards each to its children as soon as it has it,
and applies it on a second thread while the next one arrives. Every bucket is checked
against the source's checksum after it is applied; only then does this worker count the
bucket as holding the new version.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypedDict

import torch

from p2p_asyncwork import AsyncWork
from p2p_asyncwork.internal import check_timeout
from p2p_collective import Collective, CollectiveGroup, PeerError
from p2p_worker._weights import _messages as m
from p2p_worker._weights._codec import apply_delta, checksum
from p2p_worker._weights._edges import (
    Edges,
    Outbox,
    deadline_after,
    ready,
    remaining,
)
from p2p_worker._weights._errors import WeightSyncError
from p2p_worker._weights._layout import (
    Entry,
    Layout,
    gather,
    named_tensors,
    pieces,
    scatter,
    target_entries,
)
from p2p_worker._weights._pipeline import BucketPools, Slot, Slots, run_async
from p2p_worker._weights._topology import Tree

DEFAULT_PULL_TIMEOUT = 600.0
INFLIGHT = 3  # buckets a target holds beyond its model (received, applying, forwarding)


class PullStats(TypedDict, total=False):
    """What one pull saw (``WeightReceiver.last_stats``)."""

    received_bytes: int
    modes: dict[str, int]  # how many buckets came in each mode
    lost: dict[str, str]  # child -> why forwarding to it failed
    resumed_at: int  # the bucket a resume from the source started at


class WeightReceiver:
    """Pulls versions of a model from a :class:`WeightSender` into this worker's tensors.

    Made by :meth:`p2p_worker.Worker.pull_weights` (one per sync name), or directly.

    :attr:`version` is the version held bit-exactly (None: nothing yet, or torn by a
    failed pull, see :attr:`torn`); the next push repairs a torn worker.

    Args:
        collective: This worker's ``p2p_collective.Collective``.
        me: This worker's address name (``"rollout:0"``).
        node: This worker's node index (the relay orders targets by node).
        source: The source's address name (``"trainer:0"``).
        sync: The sync's name, the same on both sides.

    Example:
        >>> version = self.pull_weights(model, "trainer", 0)  # doctest: +SKIP
        >>> self.weight_receiver().version == version  # doctest: +SKIP
        True
    """

    def __init__(self, collective: Collective, me: str, node: int, source: str, sync: str) -> None:
        self.source = source
        self.sync = sync
        self._me = me
        self._node = node
        self._edges = Edges(collective, me, sync, source)
        self._digest: str | None = None
        self._gens: list[str | None] = []
        self._versions: dict[str, int] = {}  # generation -> version (the last two)
        self.last_stats: PullStats = {}
        self.keys: tuple[str, ...] = ()
        """The keys the source filled in the last pull (all, unless it is one shard)."""
        self.progress = (0, 0)
        """Buckets checked and applied by the running (or last) pull, and its bucket count."""
        self._pools = BucketPools(INFLIGHT)

    @property
    def version(self) -> int | None:
        """The version held bit-exactly in every bucket, or None."""
        gens = set(self._gens)
        if len(gens) != 1:
            return None
        (gen,) = gens
        return None if gen is None else self._versions.get(gen)

    @property
    def torn(self) -> bool:
        """Whether the buckets hold different versions (a pull failed half way)."""
        return len(set(self._gens)) > 1

    def pull(
        self, model: object, *, async_op: bool = False, timeout: float | None = DEFAULT_PULL_TIMEOUT
    ) -> int | AsyncWork[int]:
        """Receive the source's next push into ``model``'s tensors, in place.

        Args:
            model: An ``nn.Module`` (parameters and persistent buffers) or a dict of
                tensors; its dtypes and key order decide how the values arrive.
            async_op: Return an ``AsyncWork[int]`` at once.
            timeout: Seconds for the whole pull, waiting for the push included.

        Returns:
            The version now held (or a handle to it).

        Raises:
            TypeError, ValueError: ``model`` or ``timeout`` is unusable (nothing sent).
            WeightSyncError: The pull failed; it names this target and the version, and
                says whether this worker is now torn.

        Example:
            >>> receiver.pull(model, timeout=60)  # doctest: +SKIP
            7
        """
        tensors, _ = named_tensors(model, "model")
        entries, keys = target_entries(tensors, "model")
        limit = check_timeout(timeout, "timeout")
        own = [tensors[k] for k in keys]
        if async_op:
            return run_async(
                lambda: self._pull(entries, own, deadline_after(limit)),
                f"p2p-weights-pull-{self.sync}",
            )
        return self._pull(entries, own, deadline_after(limit))

    # -- one pull ------------------------------------------------------------------------

    def _pull(self, entries: list[Entry], own: list[torch.Tensor], deadline: float | None) -> int:
        self.progress = (0, 0)
        hello = m.Hello(
            self._me,
            self._node,
            tuple((e.key, e.shape, e.dtype) for e in entries),
            self._digest,
            tuple(self._gens),
            self.version,
        )
        try:
            src = self._edges.group(self.source)
            src.send(m.to_wire(hello), timeout=remaining(deadline))
            got = m.from_wire(
                src.recv(timeout=remaining(deadline)), (m.Plan, m.Abort), self.source, "plan"
            )
        except Exception as exc:
            self._edges.drop(self.source)
            raise self._error(None, f"no plan from the source {self.source}: {exc}", exc) from exc
        if isinstance(got, m.Abort):
            raise self._error(None, f"the source refused the sync: {got.reason}", None)
        plan: m.Plan = got
        if not plan.keys or any(not 0 <= i < len(entries) for i in plan.keys):
            raise self._error(plan.version, f"the plan fills entries {plan.keys!r:.80}", None)
        self.keys = tuple(entries[i].key for i in plan.keys)
        own = [own[i] for i in plan.keys]
        entries = [entries[i] for i in plan.keys]
        layout = Layout.build(entries, plan.bucket_bytes, plan.frozen)
        if layout.digest != self._digest:
            self._digest = layout.digest
            self._gens = [None] * len(layout.buckets)
        old = {g: v for g, v in self._versions.items() if g in self._gens}
        self._versions = {**old, plan.gen: plan.version}
        self.progress = (0, len(layout.buckets))
        run = _Run(self, plan, layout, own, deadline)
        errors = run.go()
        result = m.Result(self._me, self.version, "; ".join(errors) or None, self.torn)
        try:
            src = self._edges.group(self.source)
            src.send(m.to_wire(result), timeout=remaining(deadline))
        except Exception as exc:  # the source is gone: the version held stands
            errors.append(f"the result did not reach the source: {exc}")
        self.last_stats = run.stats
        if errors:
            raise self._error(plan.version, "; ".join(errors), run.cause)
        if self.version != plan.version:  # a bucket was not applied and said nothing
            raise self._error(plan.version, "not every bucket was applied", run.cause)
        return plan.version

    def _error(self, version: int | None, why: str, cause: BaseException | None) -> Exception:
        held = self.version
        state = "torn (a mix of versions)" if self.torn else f"holds version {held}"
        err = WeightSyncError(
            f"weight sync {self.sync!r}: target {self._me} did not take"
            f" {'the next version' if version is None else f'version {version}'}: {why}; it"
            f" {state}",
            version=version,
            failed={self._me: why},
            torn=self.torn,
        )
        err.__cause__ = cause
        return err


class _Run:
    """One pull's buckets: receive, forward, apply and check."""

    def __init__(
        self,
        rx: WeightReceiver,
        plan: m.Plan,
        layout: Layout,
        own: list[torch.Tensor],
        deadline: float | None,
    ) -> None:
        self.rx = rx
        self.plan = plan
        self.layout = layout
        self.own = own
        self.deadline = deadline
        self.tree = Tree(rx.source, plan.order, plan.parent)
        self.errors: list[str] = []
        self.cause: BaseException | None = None
        self.stats: PullStats = {"received_bytes": 0, "modes": {}}

    def _fail(self, child: str, exc: BaseException) -> None:
        self.rx._edges.drop(child)

    def go(self) -> list[str]:
        rx, plan = self.rx, self.plan
        me = rx._me
        parent = plan.parent[me]
        children = self.tree.children(me)
        stale = {c: set(plan.stale.get(c, ())) for c in children}
        boxes = [Outbox(rx._edges.group(c), c, self.deadline, self._fail) for c in children]
        slots = Slots(INFLIGHT, rx._pools.get(self.layout))
        applier = ThreadPoolExecutor(1, thread_name_prefix=f"p2p-weights-apply-{rx.sync}")
        pgroup = rx._edges.group(parent)
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
                    head, payload = self._receive(pgroup, parent, index, release)
                except PeerError as exc:
                    if parent == rx.source or not self._resume(index, exc):
                        _release_all(release, users)
                        self._abort_children(boxes, exc)
                        break
                    parent, pgroup = rx.source, rx._edges.group(rx.source)
                    try:
                        head, payload = self._receive(pgroup, parent, index, release)
                    except Exception as again:
                        _release_all(release, users)
                        self._abort_children(boxes, again)
                        break
                except Exception as exc:
                    _release_all(release, users)
                    self._abort_children(boxes, exc)
                    break
                copy = head.mode != m.FULL and any(index in stale[b.child] for b in boxes)
                applied = applier.submit(self._apply, index, head, payload, release, copy)
                applied.add_done_callback(_releaser(release))
                for box in boxes:
                    self._forward(box, head, payload, applied, index in stale[box.child], release)
        finally:
            applier.shutdown(wait=True)
            for box in boxes:
                box.finish()
                if box.error is not None:  # the source hears of it from the child itself
                    self.stats.setdefault("lost", {})[box.child] = repr(box.error)
        return self.errors

    def _receive(
        self, group: CollectiveGroup, parent: str, index: int, slot: Slot
    ) -> tuple[m.Header, torch.Tensor | None]:
        """Bucket ``index``'s header and payload from ``parent``.

        Raises:
            PeerError: The parent died (or aborted because its own parent died).
            Exception: Another failure; it is recorded in ``errors`` first.
        """
        head = self._receive_header(group, parent, index)
        bucket = self.layout.buckets[index]
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
                self.rx._edges.drop(parent)
                self.cause = exc
                self.errors.append(f"receiving bucket {index} from {parent} failed: {exc}")
                raise
            self.stats["received_bytes"] += head.nbytes
        modes = self.stats["modes"]
        modes[head.mode] = modes.get(head.mode, 0) + 1
        return head, payload

    def _resume(self, index: int, exc: BaseException) -> bool:
        """The parent died: ask the source for the buckets from ``index`` on.

        Returns:
            Whether the source took the request (else the pull fails).
        """
        rx = self.rx
        self.stats["resumed_at"] = index
        try:
            rx._edges.group(rx.source).send(
                m.to_wire(m.Resume(rx._me, index)), timeout=remaining(self.deadline)
            )
        except Exception as err:
            self.errors.append(f"asking the source {rx.source} to resume failed: {err}")
            return False
        self.errors.pop()  # the parent's death is routed around, not this target's failure
        self.cause = None
        return True

    def _receive_header(self, group: CollectiveGroup, parent: str, index: int) -> m.Header:
        try:
            got = m.from_wire(
                group.recv(timeout=remaining(self.deadline)),
                (m.Header, m.Abort),
                parent,
                f"bucket {index}",
            )
        except Exception as exc:
            self.rx._edges.drop(parent)
            self.cause = exc
            self.errors.append(f"receiving bucket {index} from {parent} failed: {exc}")
            raise
        if isinstance(got, m.Abort):
            cause: BaseException = (
                PeerError(got.reason) if got.peer_died else RuntimeError(got.reason)
            )
            self.cause = cause
            self.errors.append(f"the sync was aborted upstream: {got.reason}")
            raise cause
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
        reason = f"{self.rx._me}: {self.errors[-1] if self.errors else exc}"
        for box in boxes:
            box.put(m.to_wire(m.Abort(reason, died)), None, lambda: None)

    def _forward(
        self,
        box: Outbox,
        head: m.Header,
        payload: torch.Tensor | None,
        applied: Future[torch.Tensor | None],
        child_stale: bool,
        release: Callable[[], None],
    ) -> None:
        """Forward one bucket to one child.

        As received when the child holds this bucket's base (or it came full), else the
        full bucket from this worker's own copy once applied.
        """
        if head.mode == m.FULL or not child_stale:
            box.put(m.to_wire(head), ready(payload), release)
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

        box.put(m.to_wire(full), own_copy, release)

    def _apply(
        self, index: int, head: m.Header, payload: torch.Tensor | None, slot: Slot, copy: bool
    ) -> torch.Tensor | None:
        """Apply one bucket to the own tensors and check it.

        Returns:
            The bucket's new bits in one buffer when ``copy`` (a stale child gets them in
            full) or when it came full; else None.

        Raises:
            Exception: The bucket could not be applied (recorded in ``errors`` first).
        """
        try:
            return self._apply_checked(index, head, payload, slot, copy)
        except Exception as exc:
            self.cause = exc
            self.errors.append(f"bucket {index} ({head.mode}) could not be applied: {exc}")
            raise

    def _apply_checked(
        self, index: int, head: m.Header, payload: torch.Tensor | None, slot: Slot, copy: bool
    ) -> torch.Tensor | None:
        bucket = self.layout.buckets[index]
        gens = self.rx._gens
        if head.mode == m.FULL:  # checked in its buffer, written only when right
            assert payload is not None
            got = checksum(payload)
            if got != head.crc:
                self._mismatch(index, head, got, "the bucket keeps its old values")
                return payload
            gens[index] = None  # while it is written
            scatter(bucket, payload, self.own)
        else:  # a delta is written in place, over the own tensors, then checked there
            own = pieces(bucket, self.own)
            if head.mode == m.DELTA:
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
        done, total = self.rx.progress
        self.rx.progress = (done + 1, total)
        return payload

    def _mismatch(self, index: int, head: m.Header, got: int, then: str) -> None:
        self.errors.append(
            f"bucket {index} ({head.mode}) failed its check: checksum {got:#010x}, the"
            f" source's {head.crc:#010x}; {then}"
        )


def _release_all(release: Callable[[], None], users: int) -> None:
    for _ in range(users):
        release()


def _releaser(release: Callable[[], None]) -> Callable[[Future[torch.Tensor | None]], None]:
    def done(_: Future[torch.Tensor | None]) -> None:
        release()

    return done


def new_generation() -> str:
    """A fresh generation id: one source life's counter prefix."""
    return uuid.uuid4().hex[:16]
