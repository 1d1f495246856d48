"""The source side of a weight sync: push a version of a model to every target.

One :class:`WeightSender` per worker and sync. Each :meth:`~WeightSender.push` waits for
every target's hello (what it holds), plans the relay, then prepares bucket after bucket
(cast to the targets' dtype, checksum, unchanged / delta / full / packed) while the
previous one is on the wire to the first target, and finally collects every target's
result. A target whose parent in the relay died asks the source for the rest; the source
sends it full buckets from its own copy.

Targets on the source's own node are lent leaves (see ``_topology``): the source
prepares each bucket into its shared arena and they read it there.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from p2p_asyncwork import AsyncWork, wait_any
from p2p_asyncwork.internal import check_timeout
from p2p_collective import Collective
from p2p_worker._weights import _messages as m
from p2p_worker._weights._arena import Arena, Lender, fit_arena, lending
from p2p_worker._weights._codec import Packed, bucket_form, checksum, packed_form
from p2p_worker._weights._edges import (
    Edges,
    Outbox,
    deadline_after,
    ready,
    remaining,
)
from p2p_worker._weights._errors import WeightSyncError
from p2p_worker._weights._hellos import POLL, Waiting, gather_hellos
from p2p_worker._weights._layout import (
    Bucket,
    Entry,
    Layout,
    auto_bucket_bytes,
    check_bucket_bytes,
    gather,
    named_tensors,
)
from p2p_worker._weights._pipeline import BucketPools, Slot, Slots, run_async
from p2p_worker._weights._report import PushReport
from p2p_worker._weights._target import new_generation
from p2p_worker._weights._topology import Tree, build_tree, check_fanout

DEFAULT_PUSH_TIMEOUT = 600.0
DEFAULT_JOIN_TIMEOUT = 60.0
INFLIGHT = 3  # buckets the source prepares ahead of the wire
PREPARERS = 2  # buckets prepared at once (threads)
_Prepared = tuple[m.Header, "torch.Tensor | None", "torch.Tensor | None", "Packed | None"]
"""A prepared bucket: its header, its payload, its new bits in full (when gathered), and
its packed form (when some child takes it by value in full and packing pays)."""


class WeightSender:
    """Pushes versions of a model to a set of targets, relayed, verified and in place.

    Made by :meth:`p2p_worker.Worker.push_weights` (one per sync name), or directly.

    Args:
        collective: This worker's ``p2p_collective.Collective``.
        me: This worker's address name.
        targets: ``targets(deadline) -> list of target address names``.
        sync: The sync's name, the same on both sides.
        bucket_bytes: Bucket size in bytes of the targets' dtype (None: chosen per model
            by ``auto_bucket_bytes`` per push, from where the targets are).
        fanout: Children per target in the relay (1: a chain).
        delta: Keep a delta base (one copy of the model in the targets' dtypes) so that
            unchanged buckets are not sent and changed ones travel as bit-level deltas
            where p2p-compress offers them and they are smaller.
        codec: The entropy codec of deltas and packed buckets (``"zstd"`` or ``"lz4"``).
        level: The codec's level.
        compress_full: A bucket that goes to a child in full over a connection travels
            packed (compressed without loss: byte planes, then ``codec``). Children
            that read a shared arena get the plain bits there. A bucket whose packed
            form does not save 1/8 of its bytes goes plain, and is not packed again
            until the layout changes.
        partial: This source is one shard of a sharded trainer: it fills the targets'
            keys it holds (the other shards fill the rest) instead of requiring all.
        node: This worker's node index: targets on it read the buckets from the
            source's shared arena (None: unknown, every target is relayed).

    Example:
        >>> self.push_weights(model, 1, targets="rollout")  # doctest: +SKIP
        >>> sender = self.weight_sender()  # doctest: +SKIP
        >>> sender.base_bytes  # doctest: +SKIP
        1048576
    """

    def __init__(
        self,
        collective: Collective,
        me: str,
        targets: Callable[[float | None], list[str]],
        sync: str,
        *,
        bucket_bytes: int | None = None,
        fanout: int = 1,
        delta: bool = True,
        codec: str = "zstd",
        level: int = 1,
        partial: bool = False,
        node: int | None = None,
        compress_full: bool = False,
    ) -> None:
        self.sync = sync
        self._me = me
        self._node = node
        self._coll = collective
        self._arena: Arena | None = None
        self._targets = targets
        self._edges = Edges(collective, me, sync, me)
        self.partial = False
        self.bucket_bytes: int | None = None
        self.compress_full = False
        self.configure(bucket_bytes=bucket_bytes, fanout=fanout, delta=delta, partial=partial)
        self.configure(compress_full=compress_full)
        self.codec = codec
        self.level = level
        self._life = new_generation()
        self._count = 0
        self._base: list[torch.Tensor | None] = []  # the last pushed bits, per bucket
        self._crcs: list[int] = []
        self._packs: list[bool] = []  # per bucket: packing still pays (this layout)
        self._packs_digest: str | None = None
        self._base_gen: str | None = None
        self._base_digest: str | None = None
        self._waiting: dict[str, Waiting] = {}  # target -> its hello's receive, still waiting
        self._pools = BucketPools(INFLIGHT)

    def configure(
        self,
        *,
        bucket_bytes: int | None = None,
        fanout: int | None = None,
        delta: bool | None = None,
        partial: bool | None = None,
        compress_full: bool | None = None,
    ) -> None:
        """Change settings for the next pushes (a new bucket size means full copies once).

        Raises:
            TypeError, ValueError: A setting is out of range (nothing changes).
        """
        b = check_bucket_bytes(bucket_bytes) if bucket_bytes is not None else None
        f = check_fanout(fanout) if fanout is not None else None
        for arg, value in (
            ("delta", delta),
            ("partial", partial),
            ("compress_full", compress_full),
        ):
            if value is not None and not isinstance(value, bool):
                raise TypeError(f"{arg}: expected a bool, got {type(value).__name__}")
        if b is not None:
            self.bucket_bytes = b
        if f is not None:
            self.fanout = f
        if delta is not None:
            self.delta = delta
        if partial is not None:
            self.partial = partial
        if compress_full is not None:
            self.compress_full = compress_full

    @property
    def base_bytes(self) -> int:
        """Bytes of the delta base held now (one copy of the model in the targets' dtypes)."""
        return sum(b.numel() * b.element_size() for b in self._base if b is not None)

    def push(
        self,
        model: object,
        version: int,
        *,
        async_op: bool = False,
        timeout: float | None = DEFAULT_PUSH_TIMEOUT,
        join_timeout: float | None = DEFAULT_JOIN_TIMEOUT,
    ) -> PushReport | AsyncWork[PushReport]:
        """Push ``model`` as ``version`` to every target (see ``Worker.push_weights``).

        Args:
            model: An ``nn.Module`` or a dict of tensors (fp32 masters are fine).
            version: The version number the targets will report.
            async_op: Return an ``AsyncWork[PushReport]`` at once.
            timeout: Seconds for the whole push.
            join_timeout: Seconds to wait for every target's hello.

        Returns:
            The :class:`PushReport` (or a handle to it).

        Raises:
            TypeError, ValueError: Bad arguments, or the model cannot fill a target's key.
            WeightSyncError: Some target did not confirm ``version``.

        Example:
            >>> report = sender.push(model, 7)  # doctest: +SKIP
        """
        if isinstance(version, bool) or not isinstance(version, int):
            raise TypeError(f"version: expected an int, got {type(version).__name__}")
        tensors, frozen = named_tensors(model, "model")
        limit = check_timeout(timeout, "timeout")
        join = check_timeout(join_timeout, "join_timeout")

        def run() -> PushReport:
            deadline = deadline_after(limit)
            join_deadline = deadline_after(join)
            if deadline is not None and (join_deadline is None or join_deadline > deadline):
                join_deadline = deadline
            return self._push(tensors, frozen, version, deadline, join_deadline)

        if async_op:
            return run_async(run, f"p2p-weights-push-{self.sync}")
        return run()

    # -- one push ------------------------------------------------------------------------

    def _push(
        self,
        tensors: dict[str, torch.Tensor],
        frozen: set[str],
        version: int,
        deadline: float | None,
        join_deadline: float | None,
    ) -> PushReport:
        t0 = time.monotonic()
        report = PushReport(version)
        names = self._targets(join_deadline)
        hellos = gather_hellos(self._edges, self._waiting, names, join_deadline, report.failed)
        if not hellos:
            raise self._error(report, "no target said hello")
        ref = next(iter(hellos.values()))
        entries = [Entry(k, tuple(s), d) for k, s, d in ref.entries]
        for name, h in list(hellos.items()):
            if h.entries != ref.entries:
                why = f"its tensors differ from {ref.name}'s (keys, shapes or dtypes)"
                self._abort(name, why, report.failed)
                del hellos[name]
        fills = tuple(i for i, e in enumerate(entries) if not self.partial or e.key in tensors)
        entries = [entries[i] for i in fills]
        problem = _check_source(entries, tensors, ref.name)
        if not entries:
            problem = f"the source holds none of the targets' keys (first: {ref.entries[0][0]!r})"
        if problem is not None:
            for name in hellos:
                self._abort(name, problem, None)
            raise ValueError(f"model: {problem}")
        network = self._coll.config.net_emulation is not None or any(
            self._node is None or h.node != self._node for h in hellos.values()
        )
        lend = lending(self._coll.config)  # the tree's and the bucket size's, once
        size = self.bucket_bytes or auto_bucket_bytes(entries, network, lend, self.delta)
        layout = Layout.build(entries, size, frozen & {e.key for e in entries})
        if self._base_digest != layout.digest or not self.delta:  # no base: all in full
            self._base = [None] * len(layout.buckets)
            self._crcs = [0] * len(layout.buckets)
            self._base_gen = None
            self._base_digest = layout.digest
        if self._packs_digest != layout.digest:
            self._packs = [True] * len(layout.buckets)
            self._packs_digest = layout.digest
        stale = {name: self._stale(h, layout) for name, h in hellos.items()}
        tree = build_tree(
            self._me,
            [(n, h.node, len(stale[n])) for n, h in hellos.items()],
            self.fanout,
            lend=lend,
            source_node=self._node,
        )
        self._count += 1
        gen = f"{self._life}:{self._count}"
        plan = m.Plan(
            version,
            gen,
            size,
            tuple(sorted(frozen & {e.key for e in entries})),
            tree.order,
            dict(tree.parent),
            stale,
            fills,
            tree.lent,
        )
        live: list[str] = []

        def send_plans(names: list[str]) -> None:  # while the first buckets are prepared
            for name in names:
                try:
                    self._edges.group(name).send(m.to_wire(plan), timeout=remaining(deadline))
                    live.append(name)
                except Exception as exc:
                    self._edges.drop(name)
                    report.failed[name] = f"the plan did not reach it: {exc}"

        report.order = tree.order
        report.buckets = len(layout.buckets)
        report.bucket_bytes = size
        report.full_bytes = sum(b.nbytes for b in layout.buckets)
        src = [tensors[e.key] for e in entries]
        self._stream(layout, src, tree, stale, gen, deadline, report, send_plans)
        self._results(live, layout, src, deadline, report)
        report.base_bytes = self.base_bytes
        report.seconds = time.monotonic() - t0
        if report.failed:
            raise self._error(report, "")
        return report

    def _stale(self, hello: m.Hello, layout: Layout) -> tuple[int, ...]:
        """The buckets whose delta base ``hello``'s target does not hold."""
        every = tuple(range(len(layout.buckets)))
        if self._base_gen is None or hello.digest != layout.digest:
            return every
        if len(hello.gens) != len(layout.buckets):
            return every
        return tuple(i for i, g in enumerate(hello.gens) if g != self._base_gen)

    def _abort(self, name: str, why: str, failed: dict[str, str] | None) -> None:
        if failed is not None:
            failed[name] = why
        try:
            self._edges.group(name).send(m.to_wire(m.Abort(why)), timeout=10.0)
        except Exception:
            self._edges.drop(name)

    def _stream(
        self,
        layout: Layout,
        src: list[torch.Tensor],
        tree: Tree,
        stale: dict[str, tuple[int, ...]],
        gen: str,
        deadline: float | None,
        report: PushReport,
        send_plans: Callable[[list[str]], None],
    ) -> None:
        """Prepare buckets on two threads while earlier ones are on the wire, in order.

        Preparing a bucket (cast, checksum, delta against the base) is the source's
        serial work and, with many targets sharing few cores, the pace of the whole
        relay; two buckets are prepared at once (the heavy steps release the GIL).
        Each bucket is prepared once for all the source's children: as a delta where a
        child holds its base, and in full for a child that does not. When every child
        reads the source's arena, no delta is encoded at all: reading a changed bucket in
        full from shared memory costs a child about what applying its delta would, and
        the source saves the delta scan (it only compares the bucket with its base).

        With ``compress_full``, a bucket that some child takes by value in full is also
        packed (compressed without loss) for those children; lent children read the
        plain bits.

        The first buckets are being prepared while ``send_plans`` sends the plan to every
        child; a child whose plan did not go gets no bucket (its share of each bucket's
        slot is released at once). The other targets get theirs once the first bucket is
        handed to the children's outboxes: they wait for their parent's copy, which
        cannot come before the first bucket has crossed a link.
        """
        children = [c for c in tree.children(self._me) if c not in report.failed]
        first = [n for n in tree.order if n in children]
        later = [n for n in tree.order if n not in first]
        lender = self._lender(layout, tree, children, report)
        boxes: list[Outbox] = []
        opened = False

        def open_boxes() -> None:
            nonlocal opened
            opened = True
            send_plans(first)
            boxes.extend(
                Outbox(
                    self._edges.group(c),
                    c,
                    deadline,
                    self._lost,
                    lent=c in tree.lent,
                    lender=lender,
                )
                for c in children
                if c not in report.failed
            )

        def send_later() -> None:  # the targets below the children, once
            names = later[:]
            later.clear()
            send_plans(names)

        stale_of = {c: set(stale.get(c, ())) for c in children}
        by_value = [c for c in children if c not in tree.lent]
        encode = bool(by_value)
        arena = None if lender is None else lender.arena
        slots = Slots(INFLIGHT, self._pools.get(layout), arena)
        held_gen = self._base_gen
        self._base_gen = None  # partial bases are never used
        preparing: deque[tuple[Slot, Future[_Prepared]]] = deque()
        workers = ThreadPoolExecutor(PREPARERS, thread_name_prefix="p2p-weights-prepare")

        def hand_over(keep: int) -> None:
            if not opened and len(preparing) > keep:  # as many buckets are being prepared
                open_boxes()  # as there are preparers: the plans go out meanwhile
            while len(preparing) > keep:
                release, prepared = preparing.popleft()
                head, payload, new, packed = prepared.result()
                for _ in range(len(children) - len(boxes)):  # their plan did not go
                    release()
                mode = m.PACKED if packed is not None and head.mode == m.FULL else head.mode
                report.modes[mode] = report.modes.get(mode, 0) + 1
                nbytes = layout.buckets[head.index].nbytes
                full = m.Header(head.index, m.FULL, head.crc, None, nbytes)
                for box in boxes:
                    if head.mode != m.FULL and head.index not in stale_of[box.child]:
                        box.put(head, ready(payload), release)  # unchanged, or its delta
                    elif packed is not None and box.child not in tree.lent:
                        box.put(packed[0], ready(packed[1]), release)
                    else:  # in full: its bits (lent: in the arena)
                        box.put(full, ready(new), release)
                send_later()

        try:
            for bucket in layout.buckets:
                i = bucket.index
                lacking = sum(i in stale_of[c] for c in children)
                held = held_gen is not None and lacking < len(children)
                release = slots.take(len(children), deadline, f"bucket {i}")
                packs = self.compress_full and self._packs[i] and bool(by_value)
                packs_stale = packs and any(i in stale_of[c] for c in by_value)
                need = (held, lacking > 0, encode, packs, packs_stale)
                job = workers.submit(self._prepare, bucket, src, release, *need)
                preparing.append((release, job))
                hand_over(PREPARERS - 1)
            hand_over(0)
            self._base_gen = gen if self.delta else None
        finally:
            workers.shutdown(wait=True)
            if not opened:  # every target waits for its plan
                open_boxes()
            send_later()
            for box in boxes:
                box.finish()
                report.sent_bytes += box.sent_bytes
                if box.error is not None:
                    report.failed.setdefault(box.child, f"sending to it failed: {box.error}")
                elif box.refused is not None:
                    report.unshared[box.child] = box.refused
            if lender is not None:
                lender.finish(deadline)
                report.shared_bytes += sum(lender.shared.values())

    def _lender(
        self, layout: Layout, tree: Tree, children: list[str], report: PushReport
    ) -> Lender | None:
        """This push's lender when some child is lent, on a fitting arena (None: none)."""
        if not any(c in tree.lent for c in children):
            return None
        largest = max(b.nbytes for b in layout.buckets)
        try:
            self._arena = fit_arena(self._arena, INFLIGHT, largest)
        except OSError as exc:  # the lent children are told, and get buckets by value
            for c in children:
                if c in tree.lent:
                    report.unshared[c] = f"no shared arena: {exc}"
            return None
        return Lender(self._arena)

    def _prepare(
        self,
        bucket: Bucket,
        src: list[torch.Tensor],
        slot: Slot,
        held: bool,
        full: bool,
        encode: bool,
        packs: bool,
        packs_stale: bool,
    ) -> _Prepared:
        """Bucket ``bucket``'s header and payload, its new bits and its packed form.

        ``held``: some child holds its base; ``full``: some child does not; ``encode``:
        some child takes deltas; ``packs``: a child that takes buckets by value gets
        this one packed when it goes in full; ``packs_stale``: one of those lacks the
        base. The new bits and the packed form are None when not needed. Updates the
        base.
        """
        i = bucket.index
        base = self._base[i]
        if bucket.frozen and base is not None and held and not full:
            return m.Header(i, m.SAME, self._crcs[i], None, 0), None, None, None
        new = gather(bucket, src, slot.buffer(bucket.numel, bucket.dtype))
        crc = checksum(new)
        how = (crc, bucket.nbytes, self.codec, self.level)
        head, payload = bucket_form(i, new, base if held else None, encode, *how)
        packed = None
        if packs and (head.mode == m.FULL or packs_stale):
            packed = packed_form(i, new, *how)
            self._packs[i] = packed is not None
        if not self.delta:
            self._base[i] = None
        elif base is None:
            self._base[i] = new.clone()  # the slot's buffer goes back to the pool
        elif head.mode != m.SAME:
            base.copy_(new)  # a copy costs less than faulting in a new buffer
        self._crcs[i] = crc
        return head, payload, new, packed

    def _lost(self, child: str, exc: BaseException) -> None:
        self._edges.drop(child)

    def _results(
        self,
        live: list[str],
        layout: Layout,
        src: list[torch.Tensor],
        deadline: float | None,
        report: PushReport,
    ) -> None:
        """Every target's result; a resume request gets the rest of the buckets in full."""
        works: dict[str, AsyncWork[object]] = {}
        resends: list[Outbox] = []
        for name in live:
            works[name] = self._edges.group(name).recv(async_op=True, timeout=remaining(deadline))
        while works:
            for name, work in list(works.items()):
                if not work.done():
                    continue
                try:
                    got = m.from_wire(work.wait(), (m.Result, m.Resume), name, "result")
                except Exception as exc:
                    self._edges.drop(name)
                    report.failed.setdefault(name, f"no result: {exc}")
                    report.targets[name] = None
                    del works[name]
                    continue
                if isinstance(got, m.Resume):
                    resends.append(self._resend(name, got.index, layout, src, deadline))
                    group = self._edges.group(name)
                    works[name] = group.recv(async_op=True, timeout=remaining(deadline))
                    continue
                report.targets[name] = got.version
                if got.error is not None or got.version != report.version:
                    report.failed[name] = got.error or f"holds version {got.version}"
                else:
                    report.failed.pop(name, None)
                del works[name]
            if works:
                left = remaining(deadline)  # each receive times out by the deadline itself
                wait_any(works.values(), timeout=None if left is None else max(left, POLL))
        for box in resends:
            box.finish()
            report.sent_bytes += box.sent_bytes

    def _resend(
        self,
        name: str,
        start: int,
        layout: Layout,
        src: list[torch.Tensor],
        deadline: float | None,
    ) -> Outbox:
        """Full buckets from ``start`` on to a target whose parent died."""
        box = Outbox(self._edges.group(name), name, deadline, self._lost)
        for bucket in layout.buckets[start:]:
            i = bucket.index
            head = m.Header(i, m.FULL, self._crcs[i], None, bucket.nbytes)

            def payload(b: Bucket = bucket) -> torch.Tensor:
                kept = self._base[b.index]
                if kept is not None:
                    return kept
                return gather(b, src, torch.empty(b.numel, dtype=b.dtype))

            box.put(head, payload, lambda: None)
        return box

    def _error(self, report: PushReport, why: str) -> WeightSyncError:
        lines = [f"{n}: {r}" for n, r in sorted(report.failed.items())]
        err = WeightSyncError(
            f"weight sync {self.sync!r}: version {report.version} did not reach"
            f" {len(report.failed)} target(s){': ' + why if why else ''}: " + "; ".join(lines),
            version=report.version,
            failed=report.failed,
        )
        err.report = report  # type: ignore[attr-defined]
        return err


def _check_source(
    entries: list[Entry], tensors: dict[str, torch.Tensor], target: str
) -> str | None:
    """Why the source cannot fill the targets' entries, or None."""
    for e in entries:
        t = tensors.get(e.key)
        if t is None:
            return f"the targets hold {e.key!r} (seen on {target}) but the source has no such key"
        if t.numel() != e.numel:
            return f"{e.key!r} has shape {tuple(t.shape)} on the source but {e.shape} on {target}"
    return None
