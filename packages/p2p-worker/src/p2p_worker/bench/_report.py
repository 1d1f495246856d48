"""Turning a finished run into the JSON, the Markdown report and the terminal table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from p2p_worker.bench._jobconfig import CompressionSection
from p2p_worker.bench._payloads import DATA_DESCRIPTION
from p2p_worker.bench._results import (
    Ratio,
    RatioSummary,
    Sample,
    Summary,
    ratios,
    summarize,
    summarize_ratios,
)
from p2p_worker.bench._spec import KINDS, LINK_PROFILES, Skipped, format_size

if TYPE_CHECKING:
    from rich.table import Table

SCHEMA = "p2p-bench/1"
JSON_NAME = "p2p-bench.json"
MARKDOWN_NAME = "p2p-bench.md"
PLOT_NAME = "p2p-bench.png"


@dataclass
class RunResult:
    """Everything a run produced.

    Attributes:
        samples: every timed transfer.
        meta: facts about the run (command, versions, CPUs, wall time, timestamps).
        unavailable: dimensions or methods that could not run, and why.
        skipped: cells left out on purpose (e.g. over the time budget), and why.
        failures: parts that should have run but failed, with the error.
        compression: codec name -> the ``tensor_compression`` section used for it.
    """

    samples: list[Sample] = field(default_factory=list)
    meta: dict[str, object] = field(default_factory=dict)
    unavailable: list[Skipped] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    compression: dict[str, CompressionSection] = field(default_factory=dict)
    failures: list[Skipped] = field(default_factory=list)

    def summaries(self) -> list[Summary]:
        """Per-cell aggregates, in run order."""
        return summarize(self.samples)

    def ratios(self) -> list[Ratio]:
        """Every ratio of this run."""
        return ratios(self.summaries())

    def to_json(self) -> dict[str, object]:
        """The JSON document written next to the report."""
        sums = self.summaries()
        return {
            "schema": SCHEMA,
            "meta": self.meta,
            "data": dict(DATA_DESCRIPTION),
            "compression": self.compression,
            "unavailable": [asdict(u) for u in self.unavailable],
            "skipped": [asdict(s) for s in self.skipped],
            "failures": [asdict(f) for f in self.failures],
            "samples": [s.to_dict() for s in self.samples],
            "summaries": [
                {
                    **asdict(s.cell),
                    "series": s.series,
                    "nbytes": s.nbytes,
                    "n": s.n,
                    "median_s": s.median_s,
                    "min_s": s.min_s,
                    "max_s": s.max_s,
                    "throughput_Bps": s.throughput,
                    "wire_bytes": s.wire_bytes,
                }
                for s in sums
            ],
            "ratios": [asdict(r) for r in ratios(sums)],
        }


def write_json(result: RunResult, path: Path) -> None:
    """Write :meth:`RunResult.to_json` to ``path``."""
    path.write_text(json.dumps(result.to_json(), indent=1) + "\n", encoding="utf-8")


def mbps(bytes_per_s: float) -> str:
    """Format a throughput in MB/s (10**6 bytes per second) with 3 significant digits.

    Example:
        >>> mbps(1.5e9), mbps(25e6), mbps(2.345e6), mbps(1234.0)
        ('1500', '25.0', '2.35', '0.00123')
    """
    value = bytes_per_s / 1e6
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def table_rows(
    summaries: Sequence[Summary], link: str, *, compact: bool = False
) -> tuple[list[str], list[list[str]]]:
    """A wide table for one link: one row per (kind, size), one column per series.

    Each cell reads ``<MB/s> (<median time>)``, plus ``wire:<ratio>x`` (logical / wire bytes)
    for compressed series when the transport reports wire bytes. ``compact`` (the
    terminal) gives MB/s alone under short column names.

    Returns:
        ``(header, rows)``.
    """
    on_link = [s for s in summaries if s.cell.link == link]
    series: list[str] = []
    for s in on_link:
        if s.series not in series:
            series.append(s.series)
    grid: dict[tuple[str, int], dict[str, Summary]] = {}
    for s in on_link:
        grid.setdefault((s.cell.kind, s.cell.size), {})[s.series] = s
    keys = sorted(grid, key=lambda k: (KINDS.index(k[0]), k[1]))
    header = ["kind", "size", *(_short(s) if compact else s for s in series)]
    rows = []
    for kind, size in keys:
        here = grid[(kind, size)]
        row = [kind, format_size(next(iter(here.values())).nbytes)]
        for name in series:
            found = here.get(name)
            if found is None:
                row.append("-")
                continue
            if compact:
                row.append(mbps(found.throughput))
                continue
            text = f"{mbps(found.throughput)} ({_fmt_time(found.median_s)})"
            if found.wire_ratio is not None and found.cell.codec != "raw":
                text += f" wire:{found.wire_ratio:.2f}x"
            row.append(text)
        rows.append(row)
    return header, rows


_SHORT = {
    "torch.distributed gloo": "gloo",
    "Ray object store": "Ray store",
    "ray.util.collective": "Ray collective",
}


def _short(series: str) -> str:
    base = series.split(" @ ")[0]
    return _SHORT.get(base, base)


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


def ratio_line(r: RatioSummary) -> str:
    """One headline ratio line, e.g. ``p2p raw vs torch.distributed gloo: 0.93x ...``.

    Example:
        >>> ratio_line(RatioSummary("p2p raw", "Ray object store", 2.0, 1.5, 3.0, 4, 1024, 2.5))
        '**p2p raw** vs **Ray object store**: 2.00x (geometric mean of 4 points, range 1.50x to 3.00x; 2.50x at 1 KiB)'
    """  # noqa: E501
    return (
        f"**{r.series}** vs **{r.against}**: {r.geomean:.2f}x (geometric mean of {r.n} points, "
        f"range {r.low:.2f}x to {r.high:.2f}x; "
        f"{r.at_largest:.2f}x at {format_size(r.largest_size)})"
    )


def render_markdown(result: RunResult, plot_name: str | None = PLOT_NAME) -> str:
    """The Markdown report: plot, headline ratios, gaps, data, tables, per-point ratios."""
    meta = result.meta
    real = str(meta.get("real_link", "loopback"))
    sums = result.summaries()
    all_ratios = ratios(sums)
    lines = ["# p2p-bench report", ""]
    facts = [
        f"{k}: {meta[k]}"
        for k in ("command", "started", "wall_s", "cpus", "python", "torch", "ray", "cluster")
        if k in meta
    ]
    lines += [" · ".join(facts), ""]
    if plot_name:
        lines += [f"![throughput against payload size]({plot_name})", ""]
    lines += ["## Headline ratios", ""]
    lines += [f"- {ratio_line(r)}" for r in summarize_ratios(all_ratios)] or [
        "- no ratio: a method and its baseline were not both measured in this run"
    ]
    lines += ["", "A ratio above 1 means the first method moves the payload faster.", ""]
    if result.failures:
        lines += ["## Failures", ""]
        lines += [f"- **{f.what}**: {f.reason}" for f in result.failures]
        lines.append("")
    if result.unavailable or result.skipped:
        lines += ["## Not measured in this run", ""]
        lines += [f"- **{u.what}**: unavailable — {u.reason}" for u in result.unavailable]
        lines += [f"- {s.what}: skipped — {s.reason}" for s in result.skipped]
        lines.append("")
    lines += ["## Data", ""]
    lines += _md_table(["kind", "what was sent"], [[k, v] for k, v in DATA_DESCRIPTION.items()])
    lines.append("")
    if result.compression:
        lines += ["Compression settings (`cluster.collective.tensor_compression`):", ""]
        lines += [f"- {name}: `{json.dumps(cfg)}`" for name, cfg in result.compression.items()]
        lines.append("")
    lines += [
        "## How it is measured",
        "",
        "Each sample is one round trip: the sender starts a clock, sends the payload; the",
        "receiver receives it, owns every tensor, and answers with a one-element",
        "acknowledgement; the sender stops the clock. Throughput = logical (uncompressed)",
        "payload bytes / median time, in MB/s (10^6 bytes/s). One warm-up transfer per cell",
        "is compared bit for bit with the payload sent and is not timed. Baselines: raw",
        "`torch.distributed` gloo send/recv into preallocated buffers (no header, no",
        "metadata), Ray's object store (`ray.put`, reference passed to the receiver",
        "actor, `ray.get`) and `ray.util.collective` send/recv (gloo backend, one call per",
        f"tensor, tensor payloads only), all between the same two Ray actors ({real}).",
        "",
    ]
    links = list(dict.fromkeys(s.cell.link for s in sums if s.cell.method == "p2p"))
    if not links and sums:
        links = ["loopback"]
    for link in links:
        profile = LINK_PROFILES.get(link)
        title = f"{real} (real link, no emulation)" if link == "loopback" else f"emulated {link}"
        if profile is not None and profile.bandwidth_bps is not None:
            title += (
                f" ({profile.bandwidth_bps / 8e6:.0f} MB/s, "
                f"{profile.latency_s * 1e3:g} ms delay per message)"
            )
        lines += [f"## Results: {title}", "", "MB/s (median time per transfer)", ""]
        lines += _md_table(*table_rows(sums, link))
        lines.append("")
    if all_ratios:
        lines += ["## Ratios", ""]
        for r in all_ratios:
            lines.append(
                f"- {r.kind} {format_size(r.nbytes or r.size)} ({r.link}): {r.series} = "
                f"{r.value:.2f}x {r.against}"
            )
        lines.append("")
    return "\n".join(lines)


def render_rich_tables(result: RunResult) -> list[Table]:
    """The tables of :func:`render_markdown` in compact form, as ``rich.table.Table`` s."""
    from rich.table import Table

    sums = result.summaries()
    links = list(dict.fromkeys(s.cell.link for s in sums if s.cell.method == "p2p")) or ["loopback"]
    out: list[Table] = []
    for link in links:
        header, rows = table_rows(sums, link, compact=True)
        real = str(result.meta.get("real_link", "loopback"))
        where = real if link == "loopback" else f"emulated {link}"
        table = Table(
            title=f"MB/s (median of {result.meta.get('reps', '?')}) — {where}",
            caption="median times and wire ratios: see p2p-bench.md",
            min_width=66,
        )
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i < 2 else "right")
        for row in rows:
            table.add_row(*row)
        out.append(table)
    return out
