"""The same RL loop on Ray's own primitives: the baseline of ``p2p-bench rl``.

Plain Ray actors run the same policy, sampling, reward and loss
(:mod:`p2p_worker.bench._rl_policy`) with the same seeds; only the transport differs:

* rollouts go through one ``ray.util.queue.Queue`` per trainer (the p2p loop's channel
  keys), each item taken with ``Queue.get`` until the trainer has its sequences;
* gradients are summed with ``ray.util.collective.allreduce`` over a gloo group of the
  trainers (``init_collective_group(world, rank, backend="gloo", group_name=...)``);
* trainer 0 hands out the new weights with ``ray.put``; the driver passes the reference
  to every rollout worker, which ``ray.get`` s the state dict and copies it into its
  own tensors.

Every actor (the queues too, on the trainers' node as p2p's channel) starts on the node
that ``--placement`` gives it, by node affinity (:mod:`p2p_worker.bench._rl_placement`).
"""

from __future__ import annotations

import functools
import itertools
import os
import time
from typing import TYPE_CHECKING

import ray
import torch

from p2p_worker import Cluster
from p2p_worker._runtime._heap import settle_heap
from p2p_worker.bench._rl_ledger import Inbox, RolloutItem
from p2p_worker.bench._rl_phases import SpanLog
from p2p_worker.bench._rl_placement import layout, pinned
from p2p_worker.bench._rl_policy import (
    Learner,
    RLSpec,
    RLSpecFields,
    load_state,
    new_policy,
    order_batch,
    pin_threads,
    policy_state,
    sample,
    warmup_item,
)
from p2p_worker.bench._rl_records import (
    RolloutResult,
    SpanRow,
    StepResult,
    TrainerResult,
)
from p2p_worker.bench._weights_actors import state_checksum

if TYPE_CHECKING:
    from ray.util.queue import Queue

WeightRefs = list["ray.ObjectRef[dict[str, torch.Tensor]]"]
"""A version of the weights: the reference of trainer 0's state dict, in a list (so that
Ray passes the reference itself, not the state dict, to the rollout workers)."""


class RayTrainerResult(TrainerResult):
    """What a trainer of the baseline returns: its result and the weights it put (rank 0)."""

    weights: WeightRefs


_runs = itertools.count()


@ray.remote(num_cpus=0)
class RayRollout:
    """A rollout worker of the baseline: samples, ``Queue.put`` s, loads from the object store.

    Args:
        spec: The run's :class:`RLSpec` as a dict.
        rank: This rollout worker's rank.
        queue: The queue of the trainer that trains on this worker's sequences.
    """

    def __init__(self, spec: RLSpecFields, rank: int, queue: Queue) -> None:
        pin_threads()
        self.spec = RLSpec(**spec)
        self.rank = rank
        self.queue = queue
        self.model = new_policy(self.spec).requires_grad_(False)

    def prepare(self) -> None:
        """Put one warm-up item."""
        self.queue.put(warmup_item(self.spec, self.rank), block=True, timeout=self.spec.timeout)
        settle_heap()

    def step(self, step: int, refs: WeightRefs | None = None) -> RolloutResult:
        """Sample this worker's sequences of ``spec.sampled_in(step)``, put them in the queue.

        With ``refs`` (``--overlap``: the previous version) load those weights first.
        """
        spec = self.spec
        log = SpanLog(f"rollout {self.rank}")
        if refs:
            with log.span("pull"):
                state: dict[str, torch.Tensor] = ray.get(refs[0], timeout=spec.timeout)
                load_state(self.model, state)
        for sampled in spec.sampled_in(step):
            with log.span("generate"):
                item = sample(self.model, spec, sampled, self.rank)
            with log.span("put"):
                self.queue.put(item, block=True, timeout=spec.timeout)
        return {"spans": log.rows()}

    def load(self, refs: WeightRefs) -> list[SpanRow]:
        """``ray.get`` the new weights (the reference travels in a list) and copy them in."""
        log = SpanLog(f"rollout {self.rank}")
        with log.span("pull"):
            state: dict[str, torch.Tensor] = ray.get(refs[0], timeout=self.spec.timeout)
            load_state(self.model, state)
        return log.rows()

    def checksum(self) -> int:
        """The checksum of the weights this worker samples with."""
        return state_checksum(policy_state(self.model))

    def node_ip(self) -> str:
        """The address of this actor's node."""
        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


@ray.remote(num_cpus=0)
class RayTrainer:
    """A trainer of the baseline: ``Queue.get``, ``ray.util.collective`` allreduce, ``ray.put``.

    Args:
        spec: The run's :class:`RLSpec` as a dict.
        rank: This trainer's rank in the collective group.
        queue: This trainer's queue of rollouts.
        group_name: The ``ray.util.collective`` group of the trainers.
    """

    def __init__(self, spec: RLSpecFields, rank: int, queue: Queue, group_name: str) -> None:
        pin_threads()
        self.spec = RLSpec(**spec)
        self.rank = rank
        self.queue = queue
        self.group_name = group_name
        self.learner = Learner(self.spec)
        self.inbox = Inbox(self.spec, rank)

    def prepare(self) -> None:
        """Take the warm-up items, join the gloo group and run one allreduce."""
        import ray.util.collective as col

        spec = self.spec
        for _ in spec.sources_of(self.rank):
            self.queue.get(block=True, timeout=spec.timeout)
        # Ray annotates backend as its Backend class; its values are strings such as this.
        col.init_collective_group(spec.trainers, self.rank, "gloo", self.group_name)  # type: ignore[arg-type]
        col.allreduce(torch.zeros(self.learner.numel), group_name=self.group_name)
        settle_heap()

    def _take(self, step: int) -> list[RolloutItem]:
        """This trainer's items of ``step``, one ``Queue.get`` each (later ones kept)."""
        from ray.util.queue import Empty

        def fetch(weight: int, timeout: float) -> list[RolloutItem]:
            try:
                return [self.queue.get(block=True, timeout=timeout)]
            except Empty:
                return []

        items, _ = self.inbox.take(fetch, step)
        return items

    def step(self, step: int) -> RayTrainerResult:
        """Train on this trainer's rollouts of ``step``; rank 0 ``ray.put`` s the weights."""
        import ray.util.collective as col

        spec = self.spec
        log = SpanLog(f"trainer {self.rank}")
        with log.span("get"):
            items = self._take(step)
        with log.span("train"):
            batch = order_batch(items, spec)
            grads = self.learner.backward(batch)
        with log.span("allreduce"):
            col.allreduce(grads, group_name=self.group_name)
        with log.span("optim"):
            self.learner.apply(grads)
        refs: WeightRefs = []
        weights_bytes: int | None = None
        if self.rank == 0:
            with log.span("push"):
                state = policy_state(self.learner.model)
                refs = [ray.put(state)]
            weights_bytes = sum(t.numel() * t.element_size() for t in state.values())
        out: RayTrainerResult = {
            "spans": log.rows(),
            "loss": self.learner.last_loss,
            "ids": batch["ids"].tolist(),
            "rewards": batch["rewards"].tolist(),
            "weights": refs,
        }
        if weights_bytes is not None:
            out["weights_bytes"] = weights_bytes
        return out

    def checksum(self) -> int:
        """The checksum of this trainer's weights."""
        return state_checksum(policy_state(self.learner.model))

    def node_ip(self) -> str:
        """The address of this actor's node."""
        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    def close(self) -> None:
        """Leave the collective group."""
        import ray.util.collective as col

        col.destroy_collective_group(self.group_name)


class RayLoop:
    """The loop on Ray's primitives, on the running (or an embedded local) Ray cluster.

    The actors start in the background; call :meth:`ready` before the first step.

    Args:
        spec: The run's spec.
        address: Ray address, or None for an embedded local cluster.
    """

    stack = "ray"

    def __init__(self, spec: RLSpec, address: str | None = None) -> None:
        from ray.util.queue import Queue

        self.spec = spec
        self.cluster = Cluster(address=address or "local", timeout=spec.timeout)
        try:
            nodes = layout(
                spec.placement, spec.trainers, spec.rollout_workers, self.cluster.num_nodes
            )
        except BaseException:
            self.cluster.shutdown()
            raise
        group = f"ray_rl_{os.getpid()}_{next(_runs)}"
        config = spec.as_dict()
        on = functools.partial(pinned, self.cluster)
        # the queues on the trainers' node, as p2p's channel (node 0)
        self.queues = [Queue(actor_options=on(0)) for _ in range(spec.trainers)]
        self.trainers = [
            RayTrainer.options(**on(nodes.trainers[t])).remote(  # type: ignore[attr-defined]
                config, t, self.queues[t], group
            )
            for t in range(spec.trainers)
        ]
        self.rollouts = [
            RayRollout.options(**on(nodes.rollouts[r])).remote(  # type: ignore[attr-defined]
                config, r, self.queues[spec.trainer_of(r)]
            )
            for r in range(spec.rollout_workers)
        ]
        self._preparing = [a.prepare.remote() for a in [*self.rollouts, *self.trainers]]
        self._weights: WeightRefs | None = None  # the last version's reference, in a list

    def ready(self) -> None:
        """Wait until every actor has started and warmed up (they start in the background).

        Raises:
            ray.exceptions.GetTimeoutError: Not ready within ``spec.timeout``.
        """
        try:
            ray.get(self._preparing, timeout=self.spec.timeout)
        except BaseException:
            self._kill()
            raise

    def step(self, step: int) -> StepResult:
        """Run step ``step``: (rollout workers' results, trainers' results, wall seconds)."""
        spec, timeout = self.spec, self.spec.timeout
        t0 = time.time()
        previous = self._weights if spec.overlap else None  # loaded at the step's start
        rolling = [a.step.remote(step, previous) for a in self.rollouts]
        training = [a.step.remote(step) for a in self.trainers]
        trained: list[RayTrainerResult] = ray.get(training, timeout=timeout)
        self._weights = trained[0]["weights"]
        loads = []
        if not spec.overlap or step == spec.steps:
            loads = [a.load.remote(trained[0]["weights"]) for a in self.rollouts]
        rolled: list[RolloutResult] = ray.get(rolling, timeout=timeout)
        loaded = ray.get(loads, timeout=timeout) if loads else [[] for _ in rolled]
        wall = time.time() - t0
        for result, spans in zip(rolled, loaded, strict=True):
            result["spans"] = [*result["spans"], *spans]
        return rolled, [_without_weights(t) for t in trained], wall

    def where(self) -> dict[str, str]:
        """The node address of every actor: ``trainer i`` and ``rollout i``."""
        out: dict[str, str] = {}
        for role, actors in (("trainer", self.trainers), ("rollout", self.rollouts)):
            ips = ray.get([a.node_ip.remote() for a in actors], timeout=self.spec.timeout)
            out.update({f"{role} {i}": str(ip) for i, ip in enumerate(ips)})
        return out

    def checksums(self) -> dict[str, int]:
        """Each worker's weight checksum: ``trainer i`` and ``rollout i``."""
        out: dict[str, int] = {}
        for role, actors in (("trainer", self.trainers), ("rollout", self.rollouts)):
            sums = ray.get([a.checksum.remote() for a in actors], timeout=self.spec.timeout)
            out.update({f"{role} {i}": int(s) for i, s in enumerate(sums)})
        return out

    def _kill(self) -> None:
        for actor in [*self.rollouts, *self.trainers]:
            ray.kill(actor)
        for queue in self.queues:
            queue.shutdown()
        self.cluster.shutdown()

    def close(self) -> None:
        """Leave the collective group and stop every actor of the loop."""
        try:
            ray.get([a.close.remote() for a in self.trainers], timeout=self.spec.timeout)
        except Exception:  # a group that never formed: killing the actors is what is left
            pass
        finally:
            self._kill()


def _without_weights(result: RayTrainerResult) -> TrainerResult:
    """A baseline trainer's result as the driver records it: without the weights' reference."""
    out: TrainerResult = {
        "spans": result["spans"],
        "ids": result["ids"],
        "rewards": result["rewards"],
        "loss": result["loss"],
    }
    if "weights_bytes" in result:
        out["weights_bytes"] = result["weights_bytes"]
    return out
