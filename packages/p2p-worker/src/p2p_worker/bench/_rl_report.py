"""The report of ``p2p-bench rl``: JSON records, a Markdown table, reward curves and a timeline.

One record per stack and step holds ``stack`` (``p2p`` or ``ray``), ``step``,
``reward`` (the mean reward of the step's sequences), the seconds of every phase of
:data:`~p2p_worker.bench._rl_phases.PHASES`, ``moving`` (rollouts + allreduce +
weights), ``step_s`` (the step's wall time) and ``loss``. The table gives per-step means
per stack over the measured steps (every step but the first, which builds the links,
when there are at least three) and the ratio ray/p2p; the plot draws both reward curves
and, per stack, a Gantt-like timeline with one row per worker.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from p2p_worker.bench._rl_phases import PHASES, PhaseName
from p2p_worker.bench._rl_records import Accounting, Event, RLMeta, StepRecord, Timeline

if TYPE_CHECKING:
    from matplotlib.axes import Axes

JSON_NAME = "p2p-bench-rl.json"
MARKDOWN_NAME = "p2p-bench-rl.md"
PLOT_NAME = "p2p-bench-rl.png"
STACKS = ("p2p", "ray")
COLORS = {
    "generate": "#2a9d3a",
    "put": "#e8761a",
    "get": "#f4b183",
    "train": "#1f6fb4",
    "optim": "#6fa8dc",
    "allreduce": "#7a3fa0",
    "push": "#d62828",
    "pull": "#f08080",
    "catchup": "#8b4513",
    "join": "#daa520",
}
"""One colour per recorded activity in the timeline."""
MeanKey = Literal[PhaseName, "moving", "step_s"]
"""A key of a :class:`~p2p_worker.bench._rl_records.StepRecord` that :func:`means` averages."""


def lost_steps(records: Sequence[StepRecord]) -> set[int]:
    """The steps in which a rollout worker was lost (on any stack)."""
    return {r["step"] for r in records if r.get("lost_worker")}


def measured(records: Sequence[StepRecord], stack: str) -> list[StepRecord]:
    """The records of ``stack`` that the table averages.

    All but step 1 when there are 3 steps or more, and none of a step in which a rollout
    worker was lost (on either stack, so that both stacks' means cover the same steps).
    """
    lost = lost_steps(records)
    own = [r for r in records if r["stack"] == stack]
    kept = [r for r in own if r["step"] > 1] if len(own) >= 3 else own
    return [r for r in kept if r["step"] not in lost]


def means(records: Sequence[StepRecord], stack: str) -> dict[str, float]:
    """Per-step means of ``stack``'s measured records: every phase, ``moving``, ``step_s``."""
    rows = measured(records, stack)
    keys: tuple[MeanKey, ...] = (*PHASES, "moving", "step_s")
    return {k: statistics.fmean(r[k] for r in rows) if rows else 0.0 for k in keys}


def curve(records: Sequence[StepRecord], stack: str) -> list[float]:
    """``stack``'s reward per step, in step order."""
    return [r["reward"] for r in sorted(records, key=lambda r: r["step"]) if r["stack"] == stack]


def stacks_of(records: Sequence[StepRecord]) -> list[str]:
    """The stacks that have records, in :data:`STACKS` order."""
    present = {r["stack"] for r in records}
    return [s for s in STACKS if s in present]


def render_markdown(records: Sequence[StepRecord], meta: RLMeta) -> str:
    """The Markdown report: setup, the phase table with ratios, checks, the reward curves.

    With ``meta["link Mbit/s"]`` also each step's weight sync against the link
    (:func:`link_lines`).
    """
    lines = ["# p2p-bench rl", ""]
    skip = ("checks", "plot", "accounting", "events", "nodes")
    lines += [" · ".join(f"{k}: {v}" for k, v in meta.items() if k not in skip), ""]
    if meta.get("plot"):
        lines += [f"![reward and timeline]({PLOT_NAME})", ""]
    stacks = stacks_of(records) or ["p2p"]
    first = measured(records, stacks[0])
    span = f"steps {first[0]['step']}-{first[-1]['step']}" if first else "no steps"
    lost = lost_steps(records)
    inside = [s for s in sorted(lost) if first and first[0]["step"] < s < first[-1]["step"]]
    if inside:
        span += f" except {', '.join(map(str, inside))}"
    why = "; a step in which a rollout worker was lost is left out too" if lost else ""
    both = stacks == list(STACKS)
    lines += [
        f"Seconds per step, mean over {span} (step 1 builds the links and is left out when"
        f" there are 3 steps or more{why}; every step is in the JSON):",
        "",
        "| phase | " + " | ".join(stacks) + (" | ray / p2p |" if both else " |"),
        "|---|" + "---|" * (len(stacks) + both),
    ]
    mean = {stack: means(records, stack) for stack in stacks}
    labels = {"moving": "data movement (rollouts + allreduce + weights)", "step_s": "whole step"}
    for key in (*PHASES, "moving", "step_s"):
        name = labels.get(key, key)
        if key in ("moving", "step_s"):
            name = f"**{name}**"
        cells = [f"{mean[stack][key]:.4f}" for stack in stacks]
        if both:
            p2p, ray = mean["p2p"][key], mean["ray"][key]
            cells.append(f"{ray / p2p:.2f}x" if p2p > 0 else "-")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    for stack, where in meta.get("nodes", {}).items():
        lines.append(f"- {stack} workers: " + ", ".join(f"{w} on {ip}" for w, ip in where.items()))
    for check, ok in meta.get("checks", {}).items():
        lines.append(f"- {check}: {'yes' if ok else 'NO'}")
    lines += ["", *accounting_lines(meta.get("accounting", {}), meta.get("events", []))]
    if meta.get("link Mbit/s"):
        lines += link_lines(records, float(meta["link Mbit/s"]))
    lines += ["Reward per step (mean over the step's sequences):", ""]
    lines += ["| step | " + " | ".join(stacks) + " |", "|---|" + "---|" * len(stacks)]
    curves = [curve(records, stack) for stack in stacks]
    for i, values in enumerate(zip(*curves, strict=False)):
        mark = " (rollout worker lost on p2p)" if i + 1 in lost else ""
        lines.append(f"| {i + 1}{mark} | " + " | ".join(f"{v:.4f}" for v in values) + " |")
    return "\n".join(lines) + "\n"


def link_lines(records: Sequence[StepRecord], mbps: float) -> list[str]:
    """Each step's weight sync against ``1.5 x bytes / rate`` of a ``mbps`` link, as Markdown.

    The bytes are what trainer 0 handed out (p2p: the push's ``sent_bytes`` plus what it
    shared with rollout workers on its own node, ``shared_bytes``; deltas when on; Ray:
    one copy of the state dict it put, ``weights_full_bytes``).

    Example:
        >>> rec = {"stack": "p2p", "step": 1, "weights": 0.02, "weights_sent_bytes": 10**6}
        >>> link_lines([rec], 1000.0)[4]
        '| 1 | p2p | 1,000,000 | 0.0080 | 0.0120 | 0.0200 | 2.50x | no |'
    """
    rate = mbps * 1e6 / 8  # bytes per second
    lines = [
        f"Weight sync per step against the {mbps:g} Mbit/s link (bytes: what trainer 0 sent;"
        " target: weights <= 1.5 x bytes / rate):",
        "",
        "| step | stack | bytes | bytes / rate | 1.5 x bytes / rate | weights | weights /"
        " (bytes / rate) | within 1.5x |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(records, key=lambda r: (r["step"], STACKS.index(r["stack"]))):
        sent = r.get("weights_sent_bytes", r.get("weights_full_bytes"))
        if sent is not None:
            sent += r.get("weights_shared_bytes", 0)
        if not sent:
            continue
        ideal = sent / rate
        ratio = r["weights"] / ideal
        lines.append(
            f"| {r['step']} | {r['stack']} | {sent:,} | {ideal:.4f} | {1.5 * ideal:.4f} |"
            f" {r['weights']:.4f} | {ratio:.2f}x | {'yes' if ratio <= 1.5 else 'no'} |"
        )
    return [*lines, ""]


def describe(event: Event) -> str:
    """One line on a lost worker's event (``killed`` or ``replaced``)."""
    if event["event"] == "killed":
        return (
            f"rollout {event['slot']} ({event['worker']}, pid {event['pid']}) killed with"
            f" {event['how']} during step {event['step']}"
        )
    again = (
        f"sampled step {event['step']}'s lost sequences again on version {event['joined_version']}"
        if event["resampled"]
        else f"nothing of step {event['step']} left to sample"
    )
    return (
        f"replacement {event['worker']} for rollout {event['slot']}: started"
        f" {event['launch_s']:.2f} s after the death was noticed, got version"
        f" {event['joined_version']} in {event['catch_up_s']:.3f} s, {again}; held version"
        f" {event['held_at_end']} at the end of step {event['step']}"
        f" ({'bit-equal to' if event['caught_up'] else 'DIFFERENT from'} the trainers' weights)"
    )


def accounting_lines(accounting: Mapping[str, Accounting], events: Sequence[Event]) -> list[str]:
    """The rollout accounting per stack, and what happened to a lost worker, as Markdown."""
    lines = []
    for event in events:
        lines.append(f"- p2p: {describe(event)}")
    for stack, t in accounting.items():
        lines.append(
            f"- {stack} rollout accounting: {t['due']} rollout ids due, {t['trained']} trained,"
            f" {t['lost']} lost, {t['twice']} trained twice, {t['unknown']} unknown;"
            f" {t['resampled']} sampled again by a replacement, {t['dropped']} dropped as"
            " arriving twice"
        )
    return [*lines, ""] if lines else []


def write_json(path: Path, records: Sequence[StepRecord], extra: Mapping[str, object]) -> None:
    """Write ``{"meta"..., "records": [...], ...}`` to ``path``."""
    payload = {**extra, "records": list(records)}
    path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")


def _gantt(ax: Axes, steps: Sequence[Timeline], title: str, xmax: float) -> None:
    """One stack's steps laid end to end, one row per worker, one colour per activity."""
    workers = sorted({str(s[0]) for st in steps for s in st["spans"]}, reverse=True)
    row = {w: i for i, w in enumerate(workers)}
    offset = 0.0
    for st in steps:
        for span in st["spans"]:
            worker, activity, start, end = (
                str(span[0]),
                str(span[1]),
                float(span[2]),
                float(span[3]),
            )
            left = offset + start - st["start"]
            ax.barh(
                row[worker],
                max(end - start, xmax * 5e-4),
                left=left,
                height=0.7,
                color=COLORS.get(activity, "#999999"),
            )
        offset += st["wall"]
        ax.axvline(offset, color="#cccccc", linewidth=0.6)
    ax.set_yticks(range(len(workers)), workers)
    ax.set_xlim(0, xmax)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("seconds (steps laid end to end; grey lines end a step)")


def plot(
    records: Sequence[StepRecord], timelines: Mapping[str, list[Timeline]], path: Path
) -> bool:
    """Draw the reward curves and the timelines into ``path``; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        return False
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), height_ratios=[1.0, 1.2, 1.2])
    styles = {"p2p": ("#1f6fb4", "-", "o"), "ray": ("#8c8c8c", "--", "D")}
    for stack in STACKS:
        ys = curve(records, stack)
        color, line, marker = styles[stack]
        axes[0].plot(
            range(1, len(ys) + 1), ys, color=color, linestyle=line, marker=marker, label=stack
        )
    axes[0].set_xlabel("step")
    axes[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("mean reward (higher is better)")
    axes[0].set_title("Reward per step: fraction of generated tokens in the target set")
    axes[0].grid(True, alpha=0.3)
    axes[0].legend()
    xmax = max((sum(st["wall"] for st in tl) for tl in timelines.values()), default=1.0)
    for ax, stack in zip(axes[1:], STACKS, strict=True):
        total = sum(st["wall"] for st in timelines.get(stack, []))
        _gantt(ax, timelines.get(stack, []), f"{stack}: {total:.2f} s for all steps", xmax)
    handles = [Patch(color=c, label=a) for a, c in COLORS.items()]
    fig.legend(handles=handles, loc="lower center", ncol=len(COLORS), fontsize=8)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def moving_ratio(records: Sequence[StepRecord]) -> float:
    """Data movement per step (rollouts + allreduce + weights), ray over p2p (0: no p2p time)."""
    p2p, ray = means(records, "p2p"), means(records, "ray")
    return ray["moving"] / p2p["moving"] if p2p["moving"] > 0 else 0.0
