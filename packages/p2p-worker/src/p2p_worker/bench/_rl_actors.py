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

The driver only starts each step and collects what the workers recorded.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import torch

from p2p_worker import (
    Channel,
    Cluster,
    NodePlacementStrategy,
    PushReport,
    Worker,
    create_channel,
)
from p2p_worker.bench._rl_phases import SpanLog
from p2p_worker.bench._rl_policy import (
    Learner,
    RLSpec,
    new_policy,
    order_batch,
    pin_threads,
    policy_state,
    sample,
    warmup_item,
)
from p2p_worker.bench._weights_actors import state_checksum

JOB_CONFIG = {"cluster": {"collective": {"init_timeout": 120.0}}}
_runs = itertools.count()


def trainer_key(trainer: int) -> str:
    """The channel key (its own FIFO) of trainer ``trainer``'s rollouts."""
    return f"trainer{trainer}"


def take_batch(channel: Channel, spec: RLSpec, trainer: int) -> list[dict[str, Any]]:
    """Trainer ``trainer``'s items of one step, by weight (one per sequence), in one exchange.

    Raises:
        RuntimeError: Fewer sequences than due arrived within ``spec.timeout``.
    """
    want = spec.batch * len(spec.sources_of(trainer))
    items: list[dict[str, Any]] = channel.get_batch(
        target_weight=want, key=trainer_key(trainer), timeout=spec.timeout
    )
    got = sum(int(it["ids"].numel()) for it in items)
    if got != want:
        raise RuntimeError(
            f"trainer {trainer}: {got} of {want} sequences arrived within {spec.timeout} s"
        )
    return items


class RLRollout(Worker):
    """A rollout worker: samples from its own fp32 copy of the policy, pulls each new version.

    Args:
        spec: The run's :class:`RLSpec` as a dict.
        channel_name: The job's rollout channel.
        trainer_group: The trainer group's name (its rank 0 pushes the weights).
    """

    def __init__(self, spec: dict[str, Any], channel_name: str, trainer_group: str) -> None:
        super().__init__()
        pin_threads()
        self.spec = RLSpec(**spec)
        self.model = new_policy(self.spec).requires_grad_(False)
        self.channel_name = channel_name
        self.trainer_group = trainer_group
        self.channel: Channel | None = None

    def prepare(self) -> None:
        """Connect to the channel and put one warm-up item (the links are built now)."""
        self.channel = self.connect_channel(self.channel_name, timeout=self.spec.timeout)
        key = trainer_key(self.spec.trainer_of(self._rank))
        self.channel.put(
            warmup_item(self.spec, self._rank), weight=1, key=key, timeout=self.spec.timeout
        )

    def step(self, step: int) -> dict[str, Any]:
        """Sample, put the rollouts for the trainer, pull version ``step`` of the weights."""
        if self.channel is None:
            raise RuntimeError("RLRollout.step: call prepare() first")
        spec = self.spec
        log = SpanLog(f"rollout {self._rank}")
        with log.span("generate"):
            item = sample(self.model, spec, step, self._rank)
        with log.span("put"):
            key = trainer_key(spec.trainer_of(self._rank))
            self.channel.put(item, weight=spec.batch, key=key, timeout=spec.timeout)
        with log.span("pull"):
            version = self.pull_weights(self.model, self.trainer_group, 0, timeout=spec.timeout)
        if version != step:
            raise RuntimeError(f"rollout {self._rank}: pulled version {version}, wanted {step}")
        return {"spans": [tuple(s) for s in log.spans], "rewards": item["rewards"].tolist()}

    def checksum(self) -> int:
        """The checksum of the weights this worker samples with."""
        return state_checksum(policy_state(self.model))


class RLTrainer(Worker):
    """A trainer: takes its batch from the channel, allreduces gradients, rank 0 pushes.

    Args:
        spec: The run's :class:`RLSpec` as a dict.
        channel_name: The job's rollout channel.
        trainer_group: This group's own name (the allreduce runs over all of it).
        rollout_group: The rollout group's name (where rank 0 pushes the weights).
    """

    def __init__(
        self, spec: dict[str, Any], channel_name: str, trainer_group: str, rollout_group: str
    ) -> None:
        super().__init__()
        pin_threads()
        self.spec = RLSpec(**spec)
        self.learner = Learner(self.spec)
        self.channel_name = channel_name
        self.trainer_group = trainer_group
        self.rollout_group = rollout_group
        self.channel: Channel | None = None
        self.group: Any = None

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
        self.group = self.create_collective(self.trainer_group, timeout=spec.timeout)
        warm = torch.zeros(self.learner.numel)
        self.group.allreduce(warm, op="sum", timeout=spec.timeout)

    def step(self, step: int) -> dict[str, Any]:
        """Train on this trainer's rollouts of ``step``; rank 0 pushes version ``step``."""
        if self.channel is None:
            raise RuntimeError("RLTrainer.step: call prepare() first")
        spec = self.spec
        log = SpanLog(f"trainer {self._rank}")
        with log.span("get"):
            items = take_batch(self.channel, spec, self._rank)
        with log.span("train"):
            grads = self.learner.backward(order_batch(items, spec))
        with log.span("allreduce"):
            self.group.allreduce(grads, op="sum", timeout=spec.timeout)
        with log.span("optim"):
            self.learner.apply(grads)
        out: dict[str, Any] = {"loss": self.learner.last_loss}
        if self._rank == 0:
            with log.span("push"):
                report = self.push_weights(
                    self.learner.model,
                    step,
                    self.rollout_group,
                    timeout=spec.timeout,
                    delta=spec.delta,
                )
            assert isinstance(report, PushReport)  # async_op=False
            out["push"] = {
                "sent_bytes": report.sent_bytes,
                "full_bytes": report.full_bytes,
                "buckets": report.buckets,
                "modes": dict(report.modes),
            }
        out["spans"] = [tuple(s) for s in log.spans]
        return out

    def checksum(self) -> int:
        """The checksum of this trainer's weights."""
        return state_checksum(policy_state(self.learner.model))


class P2PLoop:
    """The loop on p2p: a job of its own (store, channel, groups) on the running Ray cluster.

    Args:
        spec: The run's spec.
        address: Ray address, or None for an embedded local cluster.
    """

    stack = "p2p"

    def __init__(self, spec: RLSpec, address: str | None = None) -> None:
        self.spec = spec
        self.cluster = Cluster(config=JOB_CONFIG, address=address or "local")
        n = f"{os.getpid()}_{next(_runs)}"
        channel_name, trainer_name, rollout_name = (
            f"p2p_rl_ch_{n}",
            f"p2p_rl_trainer_{n}",
            f"p2p_rl_rollout_{n}",
        )
        try:
            self.channel = create_channel(self.cluster, channel_name, timeout=spec.timeout)
            self.trainers = RLTrainer.create_group(
                spec.as_dict(), channel_name, trainer_name, rollout_name
            ).launch(
                self.cluster,
                NodePlacementStrategy([0] * spec.trainers, cpus_per_worker=0),
                name=trainer_name,
                timeout=spec.timeout,
            )
            self.rollouts = RLRollout.create_group(
                spec.as_dict(), channel_name, trainer_name
            ).launch(
                self.cluster,
                NodePlacementStrategy([0] * spec.rollout_workers, cpus_per_worker=0),
                name=rollout_name,
                timeout=spec.timeout,
            )
            ready = [self.rollouts.call("prepare"), self.trainers.call("prepare")]
            for handle in ready:
                handle.wait(timeout=spec.timeout)
        except BaseException:
            self.cluster.shutdown()
            raise

    def step(self, step: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]], float]:
        """Run step ``step``: (rollout workers' results, trainers' results, wall seconds)."""
        t0 = time.time()
        rolling = self.rollouts.call("step", step)
        training = self.trainers.call("step", step)
        trained: list[dict[str, Any]] = training.wait(timeout=self.spec.timeout)
        rolled: list[dict[str, Any]] = rolling.wait(timeout=self.spec.timeout)
        return rolled, trained, time.time() - t0

    def checksums(self) -> dict[str, int]:
        """Each worker's weight checksum: ``trainer i`` and ``rollout i``."""
        out: dict[str, int] = {}
        for role, group in (("trainer", self.trainers), ("rollout", self.rollouts)):
            sums = group.call("checksum").wait(timeout=self.spec.timeout)
            out.update({f"{role} {i}": int(s) for i, s in enumerate(sums)})
        return out

    def close(self) -> None:
        """Destroy the channel and stop the workers."""
        try:
            self.channel.destroy()
        finally:
            self.cluster.shutdown()
