"""The RL loop on p2p: rollout and trainer workers, a channel, an allreduce, a weight sync.

One step of :class:`P2PLoop`:

1. every :class:`RLRollout` samples its sequences from its copy of the policy and puts
   them, as one item weighted by its number of sequences, into the job's channel under
   the key of the trainer that trains on them (``Channel.put``);
2. every :class:`RLTrainer` takes its batch from its key by weight
   (``Channel.get_batch(target_weight=...)``), orders it by rollout id, computes its
   gradients and sums them with the other trainer's (``MultiCollectiveGroup.allreduce``
   over the trainer group), and takes the optimizer step;
3. trainer 0 pushes the new weights to every rollout worker
   (``Worker.push_weights``: a relay through the rollout workers; bit-level deltas after
   the first step with ``RLSpec.delta``), and each rollout worker pulls them into its
   own tensors in place (``Worker.pull_weights``), checked against the trainer's
   checksums.

The driver only starts each step and collects what the workers recorded. The workers go
where ``spec.placement`` says (:mod:`p2p_worker.bench._rl_placement`); the channel lives
on node 0, with the trainers.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator

import torch

from p2p_asyncwork import AsyncWork, wait_any
from p2p_collective import MultiCollectiveGroup
from p2p_worker import (
    Channel,
    Cluster,
    PushReport,
    WeightSyncError,
    Worker,
    WorkerError,
    WorkerGroup,
    create_channel,
)
from p2p_worker._runtime._heap import settle_heap
from p2p_worker._weights._api import TargetItem
from p2p_worker.bench._rl_ledger import Inbox, take_batch, trainer_key
from p2p_worker.bench._rl_phases import SpanLog
from p2p_worker.bench._rl_placement import InOrder, layout
from p2p_worker.bench._rl_policy import (
    Learner,
    RLSpec,
    RLSpecFields,
    new_policy,
    order_batch,
    pin_threads,
    policy_state,
    sample,
    warmup_item,
)
from p2p_worker.bench._rl_records import (
    Event,
    PushSent,
    RolloutResult,
    StepResult,
    TrainerResult,
    VersionResult,
)
from p2p_worker.bench._rl_recovery import Members, died, kill
from p2p_worker.bench._weights_actors import state_checksum

JOB_CONFIG = {"cluster": {"collective": {"init_timeout": 120.0}}}
_runs = itertools.count()


CATCH_UP = "catchup"
"""The sync a replacement rollout worker receives the trainers' current weights on."""


class RLRollout(Worker):
    """A rollout worker: samples from its own fp32 copy of the policy, pulls each new version.

    Args:
        spec: The run's :class:`RLSpec` as a dict.
        channel_name: The job's rollout channel.
        trainer_group: The trainer group's name (its rank 0 pushes the weights).
        slot: The rollout rank this worker plays (its seeds, its trainer); default its
            rank in its group. A replacement, alone in a group of its own, plays the
            slot of the worker it replaces.
    """

    def __init__(
        self, spec: RLSpecFields, channel_name: str, trainer_group: str, slot: int | None = None
    ) -> None:
        super().__init__()
        pin_threads()
        self.spec = RLSpec(**spec)
        self.model = new_policy(self.spec).requires_grad_(False)
        self.channel_name = channel_name
        self.trainer_group = trainer_group
        self.slot = self._rank if slot is None else slot
        self.label = f"rollout {self.slot}" + ("" if slot is None else " (replacement)")
        self.channel: Channel | None = None
        self.version = 0  # of the weights sampled with

    def prepare(self, warm_up: bool = True) -> int:
        """Connect to the channel and put one warm-up item (the links are built now).

        A replacement puts none (the trainers took the warm-up items long ago).

        Returns:
            This worker's process id.
        """
        self.channel = self.connect_channel(self.channel_name, timeout=self.spec.timeout)
        if warm_up:
            key = trainer_key(self.spec.trainer_of(self.slot))
            item = warmup_item(self.spec, self.slot)
            self.channel.put(item, weight=1, key=key, timeout=self.spec.timeout)
        settle_heap()
        return os.getpid()

    def join(self) -> VersionResult:
        """Receive the trainers' current weights on the catch-up sync (a replacement's start).

        Returns:
            ``version`` (the version now held) and ``spans``.
        """
        log = SpanLog(self.label)
        with log.span("join"):
            version = self.pull_weights(
                self.model, self.trainer_group, 0, sync=CATCH_UP, timeout=self.spec.timeout
            )
        assert isinstance(version, int)  # async_op=False
        self.version = version
        return {"version": version, "spans": log.rows()}

    def step(self, step: int) -> RolloutResult:
        """Sample, put the rollouts for the trainer, pull version ``step`` of the weights.

        With ``spec.overlap``: pull version ``step - 1`` first (from step 2 on), sample
        and put the rollouts of ``spec.sampled_in(step)``, and pull version ``step`` only
        in the last step.
        """
        if self.channel is None:
            raise RuntimeError("RLRollout.step: call prepare() first")
        spec = self.spec
        log = SpanLog(self.label)
        if spec.overlap and step > 1:
            self._pull(step - 1, log)
        for sampled in spec.sampled_in(step):
            with log.span("generate"):
                item = sample(self.model, spec, sampled, self.slot)
            with log.span("put"):
                key = trainer_key(spec.trainer_of(self.slot))
                self.channel.put(item, weight=spec.batch, key=key, timeout=spec.timeout)
        if not spec.overlap or step == spec.steps:
            self._pull(step, log)
        return {"spans": log.rows()}

    def _pull(self, version: int, log: SpanLog) -> None:
        with log.span("pull"):
            got = self.pull_weights(self.model, self.trainer_group, 0, timeout=self.spec.timeout)
        if got != version:
            raise RuntimeError(f"{self.label}: pulled version {got}, wanted {version}")
        self.version = version

    def held(self) -> tuple[int, int]:
        """The version of the weights this worker samples with, and their checksum."""
        return self.version, self.checksum()

    def checksum(self) -> int:
        """The checksum of the weights this worker samples with."""
        return state_checksum(policy_state(self.model))


class RLTrainer(Worker):
    """A trainer: takes its batch from the channel, allreduces gradients, rank 0 pushes.

    Launched with two method threads, so that the driver can change rank 0's weight
    targets (:meth:`set_targets`) and have it hand its current weights to a replacement
    rollout worker (:meth:`catch_up`) while a step waits for rollouts. A lock keeps
    those apart from the step's optimizer step and push.

    Args:
        spec: The run's :class:`RLSpec` as a dict.
        channel_name: The job's rollout channel.
        trainer_group: This group's own name (the allreduce runs over all of it).
        rollout_group: The rollout group's name (where rank 0 pushes the weights).
    """

    def __init__(
        self, spec: RLSpecFields, channel_name: str, trainer_group: str, rollout_group: str
    ) -> None:
        super().__init__()
        pin_threads()
        self.spec = RLSpec(**spec)
        self.learner = Learner(self.spec)
        self.version = 0  # the optimizer steps taken: the version of the weights held
        self.channel_name = channel_name
        self.trainer_group = trainer_group
        self.rollout_group = rollout_group
        self.channel: Channel | None = None
        self.group: MultiCollectiveGroup | None = None
        self._lock = threading.Lock()
        self._targets: list[tuple[str, list[int]]] | None = None  # new ones, for the next push
        self._inbox = Inbox(self.spec, self._rank)
        # with overlap: the push of the previous version, running
        self._pushing: AsyncWork[PushReport] | None = None

    def prepare(self) -> None:
        """Connect, take the warm-up items, build the allreduce group and run it once."""
        spec = self.spec
        self.channel = self.connect_channel(self.channel_name, timeout=spec.timeout)
        want = len(spec.sources_of(self._rank))
        got = self.channel.get_batch(
            target_weight=want, key=trainer_key(self._rank), timeout=spec.timeout
        )
        if len(got) != want:
            raise RuntimeError(f"trainer {self._rank}: {len(got)} of {want} warm-up items came")
        group = self.create_collective(self.trainer_group, timeout=spec.timeout)
        self.group = group
        warm = torch.zeros(self.learner.numel)
        group.allreduce(warm, op="sum", timeout=spec.timeout)
        settle_heap()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the weights' lock (at most ``spec.timeout`` seconds spent waiting for it)."""
        if not self._lock.acquire(timeout=self.spec.timeout):
            raise RuntimeError(f"trainer {self._rank}: weights busy for {self.spec.timeout} s")
        try:
            yield
        finally:
            self._lock.release()

    def set_targets(self, targets: list[tuple[str, list[int]]]) -> None:
        """Push to ``targets`` (``(group, ranks)`` pairs) from the next push on."""
        with self._locked():
            self._targets = [(group, list(ranks)) for group, ranks in targets]

    def catch_up(self, targets: list[tuple[str, list[int]]]) -> VersionResult:
        """Push the weights held now, in full, to ``targets`` on the catch-up sync.

        Returns:
            ``version`` (the version pushed) and ``spans``.
        """
        log = SpanLog(f"trainer {self._rank}")
        with self._locked(), log.span("catchup"):
            version = self.version
            self.push_weights(
                self.learner.model,
                version,
                [(group, list(ranks)) for group, ranks in targets],
                sync=CATCH_UP,
                timeout=self.spec.timeout,
                delta=False,
            )
        return {"version": version, "spans": log.rows()}

    def step(self, step: int) -> TrainerResult:
        """Train on this trainer's rollouts of ``step``; rank 0 pushes version ``step``.

        A target the push could not reach (a rollout worker that died) does not fail
        the step: rank 0 returns it under ``push_failed`` and the driver decides.
        """
        if self.channel is None or self.group is None:
            raise RuntimeError("RLTrainer.step: call prepare() first")
        spec = self.spec
        log = SpanLog(f"trainer {self._rank}")
        with log.span("get"):
            items, dropped = take_batch(self.channel, self._inbox, step)
        with log.span("train"):
            batch = order_batch(items, spec)
            grads = self.learner.backward(batch)
        with log.span("allreduce"):
            self.group.allreduce(grads, op="sum", timeout=spec.timeout)
        ids: list[int] = batch["ids"].tolist()
        rewards: list[float] = batch["rewards"].tolist()
        report: tuple[PushSent, dict[str, str]] | None = None
        with self._locked():
            if self._pushing is not None:  # the previous version must be out before a change
                pushing, self._pushing = self._pushing, None
                with log.span("push"):
                    report = self._report(lambda: pushing.wait(timeout=spec.timeout))
            with log.span("optim"):
                self.learner.apply(grads)
                self.version = step
            loss = self.learner.last_loss
            if self._rank == 0:
                with log.span("push"):
                    if spec.overlap and step < spec.steps:  # pulled during the next step
                        running = self._push(step, async_op=True)
                        assert isinstance(running, AsyncWork)  # async_op=True
                        self._pushing = running
                    else:
                        report = self._report(lambda: self._push(step, async_op=False))
        out: TrainerResult = {
            "ids": ids,
            "rewards": rewards,
            "dropped": dropped,
            "loss": loss,
            "spans": log.rows(),
        }
        if report is not None:
            out["push"], out["push_failed"] = report
        return out

    def _push(self, step: int, *, async_op: bool) -> PushReport | AsyncWork[PushReport]:
        targets: list[TargetItem] | str | None = (
            None if self._targets is None else list(self._targets)
        )
        self._targets = None
        if targets is None and step == 1:
            targets = self.rollout_group
        model, timeout = self.learner.model, self.spec.timeout
        return self.push_weights(
            model, step, targets, async_op=async_op, timeout=timeout, delta=self.spec.delta
        )

    def _report(self, push: Callable[[], object]) -> tuple[PushSent, dict[str, str]]:
        """Run ``push`` (a push, or the wait for one); its report as plain values.

        Returns:
            What the push sent, and the targets it could not reach (address -> why).
        """
        failed: dict[str, str] = {}
        report: object
        try:
            report = push()
        except WeightSyncError as exc:  # the report of the targets it did reach rides on it
            report = getattr(exc, "report", None)
            if report is None:
                raise
            failed = dict(exc.failed)
        assert isinstance(report, PushReport)
        sent: PushSent = {
            "sent_bytes": report.sent_bytes,
            "shared_bytes": report.shared_bytes,
            "full_bytes": report.full_bytes,
            "buckets": report.buckets,
            "modes": dict(report.modes),
        }
        return sent, failed

    def checksum(self) -> int:
        """The checksum of this trainer's weights."""
        return state_checksum(policy_state(self.learner.model))


class P2PLoop:
    """The loop on p2p: a job of its own (store, channel, groups) on the running Ray cluster.

    With ``spec.kill_rollout`` it kills its last rollout worker during that step and
    puts a replacement in its place (:mod:`p2p_worker.bench._rl_recovery`); ``events``
    then tells what happened.

    Args:
        spec: The run's spec.
        address: Ray address, or None for an embedded local cluster.
    """

    stack = "p2p"

    def __init__(self, spec: RLSpec, address: str | None = None) -> None:
        self.spec = spec
        self.events: list[Event] = []
        self.cluster = Cluster(config=JOB_CONFIG, address=address or "local")
        try:
            self.layout = layout(
                spec.placement, spec.trainers, spec.rollout_workers, self.cluster.num_nodes
            )
        except BaseException:
            self.cluster.shutdown()
            raise
        n = f"{os.getpid()}_{next(_runs)}"
        self.channel_name, self.trainer_name, rollout_name = (
            f"p2p_rl_ch_{n}",
            f"p2p_rl_trainer_{n}",
            f"p2p_rl_rollout_{n}",
        )
        try:
            self.channel = create_channel(self.cluster, self.channel_name, timeout=spec.timeout)
            self.trainers = RLTrainer.create_group(
                spec.as_dict(), self.channel_name, self.trainer_name, rollout_name
            ).launch(
                self.cluster,
                InOrder(self.layout.trainers),
                name=self.trainer_name,
                max_concurrency=2,  # set_targets / catch_up while a step waits
                timeout=spec.timeout,
            )
            rollouts = self._launch(spec.rollout_workers, rollout_name, None)
            self.members = Members(rollouts)
            ready = [rollouts.call("prepare"), self.trainers.call("prepare")]
            for handle in ready:
                handle.wait(timeout=spec.timeout)
        except BaseException:
            self.cluster.shutdown()
            raise

    def _launch(self, count: int, name: str, slot: int | None) -> WorkerGroup[RLRollout]:
        return RLRollout.create_group(
            self.spec.as_dict(), self.channel_name, self.trainer_name, slot
        ).launch(
            self.cluster,
            InOrder(self.layout.rollouts if slot is None else [self.layout.rollouts[slot]]),
            name=name,
            timeout=self.spec.timeout,
        )

    def step(self, step: int) -> StepResult:
        """Run step ``step``: (rollout workers' results, trainers' results, wall seconds).

        Raises:
            WorkerError: A worker's step raised, or a trainer died.
            RuntimeError: The step did not finish within ``spec.timeout`` (after the
                last replacement), or the weight push failed for a live worker.
        """
        spec = self.spec
        t0 = time.time()
        rolling = {r: self.members.call(r, "step", step) for r in range(spec.rollout_workers)}
        training = self.trainers.call("step", step)
        if spec.kill_rollout == step:
            self.events.append(kill(*self.members.slots[spec.victim], step))
        rolled: list[RolloutResult] = []
        deadline = time.monotonic() + spec.timeout
        while True:
            for slot, handle in [(r, h) for r, h in rolling.items() if h.done()]:
                del rolling[slot]
                try:
                    rolled += handle.wait(timeout=0)
                except WorkerError as exc:
                    if not died(exc):
                        raise
                    new, event = self.members.replace(
                        slot, step, lambda s, n: self._launch(1, n, s), self.trainers, spec.timeout
                    )
                    self.events.append(event)
                    rolled.append({"spans": event.pop("spans")})
                    if new is not None:
                        rolling[slot] = new
                    deadline = time.monotonic() + spec.timeout
            if training.done() and not rolling:
                break
            pending = [w for w in (*rolling.values(), training) if not w.done()]
            left = deadline - time.monotonic()
            if left <= 0:
                busy = "trainers, " if not training.done() else ""
                raise RuntimeError(
                    f"p2p step {step}: not done within {spec.timeout} s (still running:"
                    f" {busy}rollout slots {sorted(rolling)})"
                )
            wait_any(pending, timeout=left)
        wall = time.time() - t0
        trained: list[TrainerResult] = training.wait(timeout=0)
        pushed = trained[0].get("push_failed", {})
        failed = {k: v for k, v in pushed.items() if k not in self.members.dead}
        if failed:
            raise RuntimeError(f"p2p step {step}: the weights did not reach live workers: {failed}")
        for event in self.events:
            if event["step"] == step and event["event"] == "replaced":
                self._held(event)
        return rolled, trained, wall

    def _held(self, event: Event) -> None:
        """What a replacement holds at the end of the step it joined in, against trainer 0."""
        timeout = self.spec.timeout
        version, own = self.members.call(event["slot"], "held").wait(timeout=timeout)[0]
        trainer = self.trainers.execute_on(0).call("checksum").wait(timeout=timeout)[0]
        event["held_at_end"] = version
        event["caught_up"] = version == event["step"] and own == trainer

    def where(self) -> dict[str, str]:
        """The node address of every live worker: ``trainer i`` and ``rollout i``."""
        out = {f"trainer {i}": w.node_ip for i, w in enumerate(self.trainers.worker_infos)}
        for slot, (group, rank) in sorted(self.members.slots.items()):
            out[f"rollout {slot}"] = group.worker_infos[rank].node_ip
        return out

    def checksums(self) -> dict[str, int]:
        """Each live worker's weight checksum: ``trainer i`` and ``rollout i``."""
        sums = self.trainers.call("checksum").wait(timeout=self.spec.timeout)
        out = {f"trainer {i}": int(s) for i, s in enumerate(sums)}
        for slot in self.members.slots:
            got = self.members.call(slot, "checksum").wait(timeout=self.spec.timeout)
            out[f"rollout {slot}"] = int(got[0])
        return out

    def close(self) -> None:
        """Destroy the channel and stop the workers."""
        try:
            self.channel.destroy()
        finally:
            self.cluster.shutdown()
