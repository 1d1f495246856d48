"""Rollouts of ``p2p-bench rl`` accounted exactly once: what a trainer takes, what the run trained.

Every item a rollout worker puts is the ``batch`` sequences of one ``(step, rank)``; their
rollout ids (:func:`~p2p_worker.bench._rl_policy.rollout_ids`) are unique in a run. When a
rollout worker dies, its replacement samples the dead worker's sequences of that step
again, from the same weights and seeds, so they are the same sequences with the same ids.
Whether the dead worker's own item reached the channel before it died cannot be known
from outside, so the same item may arrive twice: :func:`take_batch` keeps the first and
drops the other (an item of an earlier step, or one already held), and counts it.
:func:`account` then checks, over the whole run, that every rollout id was trained on
exactly once.

Example:
    >>> from p2p_worker.bench._rl_policy import RLSpec
    >>> spec = RLSpec(model="tiny", rollout_workers=2, steps=2, batch=2)
    >>> account(spec, [[0, 1, 2, 3], [4, 5, 6, 7]])["lost"]
    0
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence

import torch

from p2p_worker import Channel, ChannelEmpty, LocalChannel
from p2p_worker.bench._rl_policy import RLSpec, rollout_key
from p2p_worker.bench._rl_records import Accounting


def trainer_key(trainer: int) -> str:
    """The channel key (its own FIFO) of trainer ``trainer``'s rollouts."""
    return f"trainer{trainer}"


RolloutItem = dict[str, torch.Tensor]
"""What a rollout worker puts: ``ids``, ``tokens`` and ``rewards`` of one ``(step, rank)``."""
Fetch = Callable[[int, float], list[RolloutItem]]
"""``fetch(weight, timeout)``: the next items of a trainer's FIFO, about ``weight`` sequences
(an empty list: none came within ``timeout`` seconds)."""


class Inbox:
    """A trainer's rollouts by ``(step, rank)``: each kept once, early ones kept for later.

    With ``--overlap`` the rollout workers put the next step's items while the trainers
    take this step's, so an item of a later step may come first; it waits here.

    Args:
        spec: The run's spec.
        trainer: The trainer's rank.
    """

    def __init__(self, spec: RLSpec, trainer: int) -> None:
        self.spec = spec
        self.trainer = trainer
        self.early: dict[tuple[int, int], RolloutItem] = {}

    def take(self, fetch: Fetch, step: int) -> tuple[list[RolloutItem], int]:
        """This trainer's items of ``step``, in rollout id order, and the sequences dropped.

        Raises:
            RuntimeError: Some rollout worker's sequences did not arrive within
                ``spec.timeout`` (the message names the ranks).
        """
        spec = self.spec
        wanted = {(step, rank) for rank in spec.sources_of(self.trainer)}
        held = {k: self.early.pop(k) for k in wanted if k in self.early}
        dropped = 0
        deadline = time.monotonic() + spec.timeout
        while len(held) < len(wanted):
            left = deadline - time.monotonic()
            got = fetch(spec.batch * (len(wanted) - len(held)), left) if left > 0 else []
            if not got:
                missing = sorted(rank for _, rank in wanted - set(held))
                raise RuntimeError(
                    f"trainer {self.trainer}: the sequences of rollout worker(s) {missing} for"
                    f" step {step} did not arrive within {spec.timeout} s"
                )
            for item in got:
                key = rollout_key(spec, int(item["ids"][0]))
                if key in held or key in self.early or key[0] < step:
                    dropped += int(item["ids"].numel())  # trained on, or held, already
                elif key in wanted:
                    held[key] = item
                else:
                    self.early[key] = item
        return [held[k] for k in sorted(held)], dropped


def take_batch(
    channel: Channel | LocalChannel, inbox: Inbox, step: int
) -> tuple[list[RolloutItem], int]:
    """Trainer ``inbox.trainer``'s items of ``step`` from the channel, by weight.

    Takes from the trainer's key with ``get_batch(target_weight=...)`` (one exchange when
    nothing is missing) until it holds an item of every rollout worker it trains on; an
    item it already held or trained on is dropped, one of a later step kept for it.

    Returns:
        The items, and the number of sequences dropped as arriving twice.

    Raises:
        RuntimeError: Some rollout worker's sequences did not arrive within
            ``spec.timeout`` (the message names the ranks).
    """
    key = trainer_key(inbox.trainer)

    def fetch(weight: int, timeout: float) -> list[RolloutItem]:
        try:
            got: list[RolloutItem] = channel.get_batch(
                target_weight=weight, key=key, timeout=timeout
            )
        except ChannelEmpty:
            return []
        return got

    return inbox.take(fetch, step)


def account(spec: RLSpec, trained: Sequence[Sequence[int]]) -> Accounting:
    """Whether every rollout id of the run was trained on exactly once.

    Args:
        spec: The run's spec (steps, rollout workers, batch: the ids due).
        trained: The ids each trainer trained on, one list per trainer and step.

    Returns:
        ``due`` (ids the run should train on), ``trained`` (ids trained, counted with
        repeats), ``lost`` (due, never trained), ``twice`` (trained more than once, each
        counted once), ``unknown`` (trained but never due) and ``exactly_once``.
    """
    due = spec.steps * spec.rollout_workers * spec.batch
    counts = Counter(i for ids in trained for i in ids)
    lost = sum(1 for i in range(due) if i not in counts)
    twice = sum(1 for n in counts.values() if n > 1)
    unknown = sum(1 for i in counts if not 0 <= i < due)
    return {
        "due": due,
        "trained": sum(counts.values()),
        "lost": lost,
        "twice": twice,
        "unknown": unknown,
        "exactly_once": lost == twice == unknown == 0,
    }
