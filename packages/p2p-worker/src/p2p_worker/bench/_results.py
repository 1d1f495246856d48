"""Samples, per-cell summaries and the ratio math of a benchmark run (pure Python).

A *sample* is one timed transfer: the sender starts the clock, sends the payload,
the receiver receives and materialises it and answers with a tiny acknowledgement,
the sender stops the clock on the acknowledgement. Throughput is the payload's
logical (uncompressed) bytes divided by that time, so compression shows up as
higher throughput, never as fewer bytes counted.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from p2p_worker.bench._spec import BASELINES, Cell, series_name


@dataclass(frozen=True)
class Sample:
    """One timed transfer.

    Attributes:
        method: ``p2p``, ``gloo`` or ``ray``.
        codec: ``raw``, ``lz4`` or ``zstd``.
        link: link profile name.
        kind: payload kind.
        size: nominal size of the cell in bytes.
        nbytes: logical bytes of the payload actually sent.
        rep: repetition index, from 0.
        seconds: send start to acknowledgement, in seconds (> 0).
        wire_bytes: bytes that went on the wire when the transport reports it, else ``None``.
    """

    method: str
    codec: str
    link: str
    kind: str
    size: int
    nbytes: int
    rep: int
    seconds: float
    wire_bytes: int | None = None

    @property
    def throughput(self) -> float:
        """Logical bytes per second."""
        return self.nbytes / self.seconds

    def cell(self) -> Cell:
        """The matrix cell this sample belongs to."""
        return Cell(self.method, self.codec, self.link, self.kind, self.size)

    def to_dict(self) -> dict[str, object]:
        """JSON-friendly dict, with the derived throughput in bytes/s."""
        out: dict[str, object] = asdict(self)
        out["throughput_Bps"] = self.throughput
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Sample:
        """Inverse of :meth:`to_dict` (derived keys are ignored)."""
        keys = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in keys})


def samples_from_timings(
    cell: Cell, nbytes: int, seconds: Sequence[float], wire_bytes: int | None = None
) -> list[Sample]:
    """Turn a list of timings of one cell into samples.

    Raises:
        ValueError: a timing is not a positive finite number.
    """
    out = []
    for rep, sec in enumerate(seconds):
        if not (sec > 0 and math.isfinite(sec)):
            raise ValueError(f"seconds[{rep}]: got {sec!r}; allowed: a positive finite time")
        out.append(
            Sample(
                cell.method,
                cell.codec,
                cell.link,
                cell.kind,
                cell.size,
                nbytes,
                rep,
                float(sec),
                wire_bytes,
            )
        )
    return out


@dataclass(frozen=True)
class Summary:
    """Aggregate of one cell's samples.

    Attributes:
        cell: the cell.
        nbytes: logical payload bytes.
        n: number of samples.
        median_s / min_s / max_s: transfer time statistics in seconds.
        wire_bytes: bytes on the wire when known.
    """

    cell: Cell
    nbytes: int
    n: int
    median_s: float
    min_s: float
    max_s: float
    wire_bytes: int | None

    @property
    def throughput(self) -> float:
        """Logical bytes per second at the median time."""
        return self.nbytes / self.median_s

    @property
    def series(self) -> str:
        """Series name of the cell."""
        return self.cell.series

    @property
    def wire_ratio(self) -> float | None:
        """Logical bytes / wire bytes (the compression ratio), when wire bytes are known."""
        if self.wire_bytes is None or self.wire_bytes <= 0:
            return None
        return self.nbytes / self.wire_bytes


def summarize(samples: Iterable[Sample]) -> list[Summary]:
    """Group samples by cell (first-seen order) and aggregate them.

    Example:
        >>> c = Cell("p2p", "raw", "loopback", "tensor", 1000)
        >>> s = summarize(samples_from_timings(c, 1000, [0.001, 0.002, 0.004]))[0]
        >>> s.median_s, round(s.throughput)
        (0.002, 500000)
    """
    groups: dict[Cell, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(sample.cell(), []).append(sample)
    out = []
    for cell, group in groups.items():
        secs = [s.seconds for s in group]
        wires = [s.wire_bytes for s in group if s.wire_bytes is not None]
        out.append(
            Summary(
                cell=cell,
                nbytes=group[0].nbytes,
                n=len(group),
                median_s=statistics.median(secs),
                min_s=min(secs),
                max_s=max(secs),
                wire_bytes=wires[-1] if wires else None,
            )
        )
    return out


@dataclass(frozen=True)
class Ratio:
    """Throughput of ``series`` divided by that of ``against`` at one (kind, size, link).

    A value above 1 means ``series`` is faster.
    """

    kind: str
    size: int
    link: str
    series: str
    against: str
    value: float
    nbytes: int = 0
    """Logical payload bytes at this point (the ``object`` kind's real size)."""


def ratios(summaries: Sequence[Summary]) -> list[Ratio]:
    """Every ratio the report prints.

    * each p2p series on loopback against each baseline measured at the same kind and size;
    * each compressed p2p series against ``p2p raw`` on the same link, kind and size.

    Example:
        >>> mk = lambda m, c, sec: summarize(samples_from_timings(
        ...     Cell(m, c, "loopback", "tensor", 10), 10, [sec]))[0]
        >>> [(r.series, r.against, r.value) for r in ratios(
        ...     [mk("gloo", "raw", 1.0), mk("p2p", "raw", 2.0)])]
        [('p2p raw', 'torch.distributed gloo', 0.5)]
    """
    index = {s.cell: s for s in summaries}
    out: list[Ratio] = []
    for s in summaries:
        c = s.cell
        if c.method != "p2p":
            continue
        if c.link == "loopback":
            for base in BASELINES:
                other = index.get(Cell(base, "raw", "loopback", c.kind, c.size))
                if other is not None:
                    out.append(
                        Ratio(
                            c.kind,
                            c.size,
                            c.link,
                            s.series,
                            other.series,
                            s.throughput / other.throughput,
                            s.nbytes,
                        )
                    )
        if c.codec != "raw":
            raw = index.get(Cell("p2p", "raw", c.link, c.kind, c.size))
            if raw is not None:
                value = s.throughput / raw.throughput
                out.append(Ratio(c.kind, c.size, c.link, s.series, raw.series, value, s.nbytes))
    return out


def geomean(values: Iterable[float]) -> float:
    """Geometric mean of positive values.

    Raises:
        ValueError: no values, or a value that is not positive.

    Example:
        >>> geomean([0.5, 2.0, 1.0])
        1.0
    """
    vals = list(values)
    if not vals or any(v <= 0 for v in vals):
        raise ValueError(f"values: got {vals!r}; allowed: one or more positive numbers")
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


@dataclass(frozen=True)
class RatioSummary:
    """Ratios of one (series, against) pair, over every kind and size measured."""

    series: str
    against: str
    geomean: float
    low: float
    high: float
    n: int
    largest_size: int
    at_largest: float
    """Geometric mean over kinds at the largest size measured (bandwidth-bound regime)."""


def summarize_ratios(items: Sequence[Ratio]) -> list[RatioSummary]:
    """Collapse ratios per (series, against), in first-seen order."""
    groups: dict[tuple[str, str], list[Ratio]] = {}
    for r in items:
        groups.setdefault((r.series, r.against), []).append(r)
    out = []
    for (series, against), group in groups.items():
        vals = [r.value for r in group]
        largest = max(r.size for r in group)
        out.append(
            RatioSummary(
                series=series,
                against=against,
                geomean=geomean(vals),
                low=min(vals),
                high=max(vals),
                n=len(vals),
                largest_size=largest,
                at_largest=geomean(r.value for r in group if r.size == largest),
            )
        )
    return out


def baseline_series() -> list[str]:
    """Series names of the baselines."""
    return [series_name(b, "raw") for b in BASELINES]
