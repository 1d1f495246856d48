"""Where a step of the RL loop spends its time: what workers record, and the accounting.

Every worker of either stack records what it did in a step as :class:`Span` s (worker,
activity, start, end, in ``time.time()`` seconds: the workers of one machine share the
clock). :func:`account` turns a step's spans into the seconds of each phase on the
step's critical path:

* ``generate``: the slowest rollout worker's sampling;
* ``rollouts``: from the last rollout worker done sampling until the last trainer holds
  its whole batch (the rollouts moving to the trainers);
* ``train``: the slowest trainer's forward, backward and optimizer step;
* ``allreduce``: from the moment the last trainer joined the allreduce until the last
  one left it (the gradients moving, not one trainer waiting for the other);
* ``weights``: from the trainer starting to hand out the new weights until the last
  rollout worker holds them (with ``--overlap``, where the rollout workers pull at the
  start of a step the version handed out at the end of the one before: the slowest
  rollout worker's pull);
* ``idle``: the rest of the step's wall time (dispatch, waiting, coordination).

Example:
    >>> spans = [Span("rollout 0", "generate", 0.0, 1.0), Span("trainer 0", "get", 0.1, 1.5)]
    >>> account(spans, wall=2.0)["rollouts"]
    0.5
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal, NamedTuple

from p2p_worker.bench._rl_records import Phases, SpanRow

PhaseName = Literal["generate", "rollouts", "train", "allreduce", "weights", "idle"]
"""The name of a phase: a key of :class:`~p2p_worker.bench._rl_records.Phases`."""
PHASES: tuple[PhaseName, ...] = ("generate", "rollouts", "train", "allreduce", "weights", "idle")
"""The phases of a step, in the order they happen (``idle`` last: the remainder)."""
MOVING: tuple[PhaseName, ...] = ("rollouts", "allreduce", "weights")
"""The phases that move data: what the transport decides."""
ACTIVITIES = (
    "generate",
    "put",
    "get",
    "train",
    "allreduce",
    "optim",
    "push",
    "pull",
    "catchup",
    "join",
)
"""What a worker records: rollout workers ``generate``/``put``/``pull``, trainers
``get``/``train``/``allreduce``/``optim``/``push``; after a lost rollout worker, trainer 0
``catchup`` (its weights to the replacement) and the replacement ``join`` (receiving
them). Those two are in no phase: their time counts as ``idle``."""


class Span(NamedTuple):
    """One activity of one worker: ``[start, end]`` in ``time.time()`` seconds."""

    worker: str
    activity: str
    start: float
    end: float


class SpanLog:
    """A worker's spans of one step.

    Example:
        >>> log = SpanLog("trainer 0")
        >>> with log.span("train"):
        ...     pass
        >>> [s.activity for s in log.spans]
        ['train']
    """

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.spans: list[Span] = []

    def rows(self) -> list[SpanRow]:
        """The spans as plain tuples (how they travel back to the driver)."""
        return [(s.worker, s.activity, s.start, s.end) for s in self.spans]

    @contextmanager
    def span(self, activity: str) -> Iterator[None]:
        """Record the time the ``with`` block takes as ``activity`` (also when it raises).

        Raises:
            ValueError: ``activity`` is not one of :data:`ACTIVITIES`.
        """
        if activity not in ACTIVITIES:
            raise ValueError(f"activity: got {activity!r}; allowed: {', '.join(ACTIVITIES)}")
        start = time.time()
        try:
            yield
        finally:
            self.spans.append(Span(self.worker, activity, start, time.time()))


def _of(spans: Sequence[Span], activity: str) -> list[Span]:
    return [s for s in spans if s.activity == activity]


def _longest_per_worker(spans: Sequence[Span], activities: Sequence[str]) -> float:
    per: dict[str, float] = {}
    for s in spans:
        if s.activity in activities:
            per[s.worker] = per.get(s.worker, 0.0) + (s.end - s.start)
    return max(per.values(), default=0.0)


def _after(end: Sequence[Span], start: float | None) -> float:
    if not end or start is None:
        return 0.0
    return max(0.0, max(s.end for s in end) - start)


def _weights(spans: Sequence[Span], first_push: float | None) -> float:
    pulls = _of(spans, "pull")
    if pulls and first_push is not None and max(s.end for s in pulls) <= first_push:
        # with overlap: the pulls of a step take the version pushed in the step before
        return _longest_per_worker(spans, ("pull",))
    return _after(pulls, first_push)


def account(spans: Sequence[Span], wall: float) -> Phases:
    """Seconds of each phase of :data:`PHASES` in one step (see the module's docstring).

    Args:
        spans: Every worker's spans of the step.
        wall: The step's wall time in seconds, as the driver measured it.

    Returns:
        Phase -> seconds, each >= 0.
    """
    gen = _of(spans, "generate")
    gets = _of(spans, "get")
    ar = _of(spans, "allreduce")
    push = _of(spans, "push")
    generate = _longest_per_worker(spans, ("generate",))
    rollouts = _after(gets, max((s.end for s in gen), default=None))
    train = _longest_per_worker(spans, ("train", "optim"))
    allreduce = _after(ar, max((s.start for s in ar), default=None))
    weights = _weights(spans, min((s.start for s in push), default=None))
    busy = sum((generate, rollouts, train, allreduce, weights))
    return {
        "generate": generate,
        "rollouts": rollouts,
        "train": train,
        "allreduce": allreduce,
        "weights": weights,
        "idle": max(0.0, wall - busy),
    }
