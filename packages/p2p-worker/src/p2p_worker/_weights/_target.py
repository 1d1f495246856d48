"""The target side of a weight sync: pull a version into one's own tensors, in place.

One :class:`WeightReceiver` per worker and sync. Each :meth:`~WeightReceiver.pull` says
hello to the source (what this worker holds), learns the plan, then receives bucket after
bucket from its parent in the relay, forwards each to its children as soon as it has it,
and applies it on a second thread while the next one arrives. Every bucket is checked
against the source's checksum after it is applied; only then does this worker count the
bucket as holding the new version.

How the buckets of one pull move (and how same-node targets share them) is
:mod:`p2p_worker._weights._pull`.
"""

from __future__ import annotations

import uuid

import torch

from p2p_asyncwork import AsyncWork
from p2p_asyncwork.internal import check_timeout
from p2p_collective import Collective
from p2p_worker._weights import _messages as m
from p2p_worker._weights._edges import Edges, deadline_after, remaining
from p2p_worker._weights._errors import WeightSyncError
from p2p_worker._weights._layout import Entry, Layout, named_tensors, target_entries
from p2p_worker._weights._pipeline import run_async
from p2p_worker._weights._pull import PullRun, PullStats, TargetState

DEFAULT_PULL_TIMEOUT = 600.0


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
        self._st = TargetState(me, source, sync, Edges(collective, me, sync, source))
        self._edges = self._st.edges
        self._digest: str | None = None
        self._versions: dict[str, int] = {}  # generation -> version (the last two)
        self.last_stats: PullStats = {}
        self.keys: tuple[str, ...] = ()
        """The keys the source filled in the last pull (all, unless it is one shard)."""

    @property
    def progress(self) -> tuple[int, int]:
        """Buckets checked and applied by the running (or last) pull, and its bucket count."""
        return self._st.progress

    @property
    def _gens(self) -> list[str | None]:
        return self._st.gens

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
        self._st.progress = (0, 0)
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
            self._st.gens = [None] * len(layout.buckets)
        old = {g: v for g, v in self._versions.items() if g in self._gens}
        self._versions = {**old, plan.gen: plan.version}
        self._st.progress = (0, len(layout.buckets))
        run = PullRun(self._st, plan, layout, own, deadline)
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


def new_generation() -> str:
    """A fresh generation id: one source life's counter prefix."""
    return uuid.uuid4().hex[:16]
