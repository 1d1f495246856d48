"""The plain values of ``p2p-bench rl``: what workers return, what the report records.

Workers of both stacks return plain dicts (they travel through Ray), the driver turns
them into one :class:`StepRecord` per stack and step and one :class:`Timeline` entry,
and the report writes them to JSON as they are. These are their shapes.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict

SpanRow = tuple[str, str, float, float]
"""A :class:`~p2p_worker.bench._rl_phases.Span` as plain values: worker, activity, start, end."""


class RolloutResult(TypedDict):
    """What a rollout worker's step returns: its spans."""

    spans: list[SpanRow]


class VersionResult(TypedDict):
    """A replacement's ``join`` or trainer 0's ``catch_up``: the version and the spans."""

    version: int
    spans: list[SpanRow]


class PushSent(TypedDict):
    """What trainer 0's weight push sent (a ``PushReport`` as plain values)."""

    sent_bytes: int
    shared_bytes: int
    full_bytes: int
    buckets: int
    modes: dict[str, int]


class TrainerResult(TypedDict):
    """What a trainer's step returns.

    ``dropped`` (p2p: sequences that arrived twice), ``push`` / ``push_failed`` (p2p's
    trainer 0: what its push sent, the targets it could not reach) and
    ``weights_bytes`` (Ray's trainer 0: the bytes of the state dict it put) are there
    only where they apply.
    """

    spans: list[SpanRow]
    ids: list[int]
    rewards: list[float]
    loss: float
    dropped: NotRequired[int]
    push: NotRequired[PushSent]
    push_failed: NotRequired[dict[str, str]]
    weights_bytes: NotRequired[int]


class Phases(TypedDict):
    """Seconds of each phase of :data:`~p2p_worker.bench._rl_phases.PHASES` in one step."""

    generate: float
    rollouts: float
    train: float
    allreduce: float
    weights: float
    idle: float


class StepRecord(Phases):
    """The JSON record of one stack's step (see :mod:`p2p_worker.bench._rl_report`)."""

    stack: str
    step: int
    reward: float
    moving: float
    step_s: float
    loss: float
    sequences: int
    dropped: int
    weights_sent_bytes: NotRequired[int]
    weights_shared_bytes: NotRequired[int]
    weights_full_bytes: NotRequired[int]
    weights_modes: NotRequired[dict[str, int]]
    lost_worker: NotRequired[bool]


class Timeline(TypedDict):
    """One stack's step in the timeline: its start, wall seconds and every worker's spans."""

    step: int
    start: float
    wall: float
    spans: list[list[str | float]]


class Event(TypedDict):
    """What happened to a lost rollout worker: ``killed``, then ``replaced``.

    A ``killed`` event holds ``pid``, ``how`` and ``at``; a ``replaced`` one the
    replacement's times, the version it joined with and (once the step is over)
    ``held_at_end`` and ``caught_up``.
    """

    event: str
    step: int
    slot: int
    worker: str
    pid: NotRequired[int | None]
    how: NotRequired[str]
    at: NotRequired[float]
    noticed: NotRequired[float]
    launch_s: NotRequired[float]
    catch_up_s: NotRequired[float]
    joined_version: NotRequired[int]
    resampled: NotRequired[bool]
    spans: NotRequired[list[SpanRow]]
    held_at_end: NotRequired[int]
    caught_up: NotRequired[bool]


class Accounting(TypedDict):
    """A stack's rollout ids: due, trained, lost, twice, unknown, and whether exactly once.

    :func:`p2p_worker.bench._rl.tallied` adds ``dropped`` and ``resampled``.
    """

    due: int
    trained: int
    lost: int
    twice: int
    unknown: int
    exactly_once: bool
    dropped: NotRequired[int]
    resampled: NotRequired[int]


class RunExtra(TypedDict):
    """What a run found besides its records: per stack its accounting and nodes, the events."""

    accounting: dict[str, Accounting]
    events: list[Event]
    nodes: dict[str, dict[str, str]]


RLMeta = TypedDict(
    "RLMeta",
    {
        "command": str,
        "model": str,
        "parameters": int,
        "rollout_workers": int,
        "trainers": int,
        "sequences per step": int,
        "steps": int,
        "lr": float,
        "seed": int,
        "weight deltas": bool,
        "overlap": bool,
        "placement": str,
        "stacks": str,
        "wall_s": float,
        "link Mbit/s": float,
        "p2p rollout worker killed in step": int,
        "plot": bool,
        "checks": dict[str, bool],
        "accounting": dict[str, Accounting],
        "events": list[Event],
        "nodes": dict[str, dict[str, str]],
    },
    total=False,
)
"""The setup of a run, as the report shows it; the Markdown's also holds the checks and
what :class:`RunExtra` holds (each key only where it applies)."""


StepResult = tuple[list[RolloutResult], list[TrainerResult], float]
"""A loop's step: the rollout workers' results, the trainers' results, the wall seconds."""
