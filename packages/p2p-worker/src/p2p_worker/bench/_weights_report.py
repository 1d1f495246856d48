"""The records of ``p2p-bench weights`` and its report: Markdown tables and a plot.

One :class:`Record` per cell (method, targets, link, lr). The Markdown report has one
table per (link, lr), methods by number of targets, each cell against N full sends. When
the run knows the real link rate (``--link-mbps``, a multi-node cluster), each table is
followed by two lines per number of targets: p2p's delta sync against 1.5 x its wire
bytes at that rate, and p2p's full sync against the fastest of Ray's and gloo's methods.

Example:
    >>> r = Record("p2p-delta", 3, "network", 1e-6, 0.3, 25_000_000, 100_000_000, 0.1, True, 3)
    >>> round(delta_bound(r, 1000.0), 3)
    0.3
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

JSON_NAME = "p2p-bench-weights.json"
MARKDOWN_NAME = "p2p-bench-weights.md"
PLOT_NAME = "p2p-bench-weights.png"
RAY_METHODS = (
    "ray-object-store",
    "gloo-broadcast",
    "ray-collective-broadcast",
    "ray-direct-transport",
)
"""The methods p2p's full sync is compared with when the link rate is known."""
DELTA_SLACK = 1.5
"""p2p's delta sync is held against this many times its wire bytes at the link rate."""


@dataclass
class Record:
    """One cell: a method moving each version to ``targets`` rollout workers on ``link``.

    ``source_node`` and ``target_nodes`` are the node addresses of the trainer and of each
    rollout worker the method used (empty where not recorded). For p2p's methods,
    ``buckets`` is the push's bucket count and ``lent_buckets`` how many buckets the
    targets together read from a same-node holder's shared memory (the source's, or
    their node's first target's), both of the last measured step; 0 for the others.
    """

    method: str
    targets: int
    link: str
    lr: float
    seconds: float
    wire_bytes: int
    full_bytes: int
    changed: float
    exact: bool
    steps: int
    seconds_each: list[float] = field(default_factory=list)
    source_node: str = ""
    target_nodes: list[str] = field(default_factory=list)
    buckets: int = 0
    lent_buckets: int = 0

    @property
    def gbps(self) -> float:
        """Effective GB/s: the model's bytes delivered to every target, per second."""
        return self.full_bytes * self.targets / self.seconds / 1e9 if self.seconds else 0.0


def delta_bound(record: Record, link_mbps: float) -> float:
    """Seconds :data:`DELTA_SLACK` x ``record``'s wire bytes take at ``link_mbps``."""
    return DELTA_SLACK * record.wire_bytes * 8 / (link_mbps * 1e6)


def link_lines(cells: Sequence[Record], link_mbps: float) -> list[str]:
    """Per number of targets: p2p-delta against its bound, p2p-full against Ray's fastest."""
    lines: list[str] = []
    for n in sorted({r.targets for r in cells}):
        at = {r.method: r for r in cells if r.targets == n}
        delta, full = at.get("p2p-delta"), at.get("p2p-full")
        if delta is not None:
            bound = delta_bound(delta, link_mbps)
            verdict = "within" if delta.seconds <= bound else "over"
            lines.append(
                f"- {n} target(s): p2p-delta {delta.seconds:.3f} s against"
                f" {DELTA_SLACK} x {delta.wire_bytes / 1e6:.1f} MB / {link_mbps:g} Mbit/s"
                f" = {bound:.3f} s ({verdict})"
            )
        rays = [at[m] for m in RAY_METHODS if m in at]
        if full is not None and rays:
            best = min(rays, key=lambda r: r.seconds)
            lines.append(
                f"- {n} target(s): p2p-full {full.seconds:.3f} s,"
                f" {best.seconds / full.seconds:.2f}x the speed of the fastest Ray method"
                f" ({best.method}, {best.seconds:.3f} s)"
            )
    return lines


class WeightsMeta(TypedDict, total=False):
    """The setup of a ``p2p-bench weights`` run, as the report shows it."""

    command: str
    model: str
    parameters: int
    steps: int
    warmup: int
    placement: str
    link_mbps: float
    wall_s: float
    out: str


def render_markdown(records: Sequence[Record], meta: WeightsMeta) -> str:
    """The report: one table per (link, lr), methods by targets, and the ratios to sends."""
    lines = ["# p2p-bench weights", ""]
    lines += [" · ".join(f"{k}: {v}" for k, v in meta.items()), ""]
    if (Path(meta.get("out", ".")) / PLOT_NAME).exists():
        lines += [f"![weight sync]({PLOT_NAME})", ""]
    keys = sorted({(r.link, r.lr) for r in records})
    for link, lr in keys:
        cells = [r for r in records if r.link == link and r.lr == lr]
        targets = sorted({r.targets for r in cells})
        lines += [f"## {link}, lr {lr:g}", ""]
        head = "| method | " + " | ".join(f"{n} target(s)" for n in targets) + " | exact |"
        lines += [head, "|---" * (len(targets) + 2) + "|"]
        for method in dict.fromkeys(r.method for r in cells):
            row = [f"| {method} "]
            ok = True
            for n in targets:
                r = next((c for c in cells if c.method == method and c.targets == n), None)
                if r is None:
                    row.append("| - ")
                    continue
                ok = ok and r.exact
                sends = next((c for c in cells if c.method == "sends" and c.targets == n), None)
                ratio = ""
                if sends is not None and r is not sends:
                    ratio = f", {sends.seconds / r.seconds:.2f}x the speed of sends"
                wire = r.wire_bytes / r.full_bytes
                row.append(
                    f"| {r.seconds:.3f} s ({r.gbps:.2f} GB/s, wire {wire:.2f}x model{ratio}) "
                )
            row.append(f"| {ok} |")
            lines.append("".join(row))
        changed = [r.changed for r in cells]
        lines += [
            "",
            f"Changed fraction of bf16 values per step: {statistics.mean(changed):.2%}",
            "",
        ]
        link_mbps = meta.get("link_mbps")
        if link_mbps:
            lines += [*link_lines(cells, float(link_mbps)), ""]
    return "\n".join(lines) + "\n"


def plot(records: Sequence[Record], path: Path) -> bool:
    """Seconds per sync against the number of targets, one panel per (link, lr)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    keys = sorted({(r.link, r.lr) for r in records})
    if not keys:
        return False
    fig, axes = plt.subplots(1, len(keys), figsize=(5 * len(keys), 4), squeeze=False)
    for ax, (link, lr) in zip(axes[0], keys, strict=True):
        cells = [r for r in records if r.link == link and r.lr == lr]
        for method in dict.fromkeys(r.method for r in cells):
            pts = sorted((r.targets, r.seconds) for r in cells if r.method == method)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=method)
        ax.set_title(f"{link}, lr {lr:g}")
        ax.set_xlabel("rollout workers")
        ax.set_ylabel("seconds per sync (lower is better)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
