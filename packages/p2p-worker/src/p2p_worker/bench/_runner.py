"""Running the matrix: cluster lifecycle, the baselines, one p2p job per codec and link."""

from __future__ import annotations

import datetime
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from p2p_worker.bench._report import RunResult
from p2p_worker.bench._results import Sample
from p2p_worker.bench._spec import (
    Cell,
    LinkProfile,
    Skipped,
    build_matrix,
    job_blocks,
    series_name,
)

OBJECT_KIND_SIZE = 0
"""Nominal ``size`` of ``object`` cells: the ladder does not apply to them."""

COMPRESSION_SECTIONS: dict[str, dict[str, Any]] = {
    "lz4": {
        "enabled": True,
        "codec": "lz4",
        "min_bytes": 16384,
        "excluded_dtypes": [],
        "acceleration": 1,
    },
    "zstd": {
        "enabled": True,
        "codec": "zstd",
        "min_bytes": 16384,
        "excluded_dtypes": [],
        "level": 1,
        "max_inflight": 4,
    },
}
"""``tensor_compression`` per codec. ``excluded_dtypes: []`` lets the float32 fields of the
tensor_dict and dataclass payloads take part (the default ``[float32]`` would skip them)."""


def net_emulation_section(link: LinkProfile) -> dict[str, Any] | None:
    """The ``cluster.net_emulation`` section of a link profile (``None`` for loopback)."""
    if link.bandwidth_bps is None:
        return None
    return {
        "enabled": True,
        "bandwidth_mbps": link.bandwidth_bps / 1e6,
        "delay_ms": link.latency_s * 1e3,
    }


def job_config(codec: str, link: LinkProfile) -> dict[str, Any]:
    """The job configuration (``{"cluster": {...}}``) of one p2p block."""
    cluster: dict[str, Any] = {"collective": {"init_timeout": 120.0}}
    if codec != "raw":
        cluster["collective"]["tensor_compression"] = dict(COMPRESSION_SECTIONS[codec])
    net = net_emulation_section(link)
    if net is not None:
        cluster["net_emulation"] = net
    return {"cluster": cluster}


class ProgressSink(Protocol):
    """What the runner reports to while it works (the CLI draws it with rich)."""

    def start(self, total: int) -> None:
        """The number of cells about to run."""

    def block(self, text: str) -> None:
        """A new block (baselines, or one p2p job) begins."""

    def cell_done(self, cell: Cell, samples: Sequence[Sample]) -> None:
        """One cell finished (no samples: it could not run)."""

    def note(self, text: str) -> None:
        """A line for the user (e.g. something unavailable)."""


@dataclass
class Options:
    """Resolved command-line options.

    Attributes:
        sizes: payload sizes in bytes.
        kinds: payload kinds.
        codecs: codecs of the p2p method.
        links: link profiles of the p2p method.
        reps: timed repetitions per cell.
        out: output folder.
        address: Ray address to attach to, or ``None`` for an embedded local cluster.
        timeout: seconds any single step (a cell, a launch) may take.
        baselines: whether to measure the two baselines.
        argv: the command line, for the report.
    """

    sizes: list[int]
    kinds: list[str]
    codecs: list[str]
    links: list[LinkProfile]
    reps: int
    out: Path
    address: str | None = None
    timeout: float = 180.0
    baselines: bool = True
    argv: list[str] = field(default_factory=list)


def _versions() -> dict[str, str]:
    import ray
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
    }


def run_matrix(options: Options, progress: ProgressSink) -> RunResult:
    """Run every cell the options ask for and return the result.

    Starts (or attaches to) the Ray cluster, measures the baselines between two plain
    actors, then launches a sender and a receiver worker group per (codec, link) and
    measures the p2p cells. A dimension the installed stack cannot provide is recorded
    in ``RunResult.unavailable``; its cells are not run.

    A block (the baselines, or one p2p job) that fails is recorded in
    ``RunResult.failures`` with its error, and the run goes on with the next block.

    Raises:
        p2p_asyncwork.P2PError: the Ray cluster could not be started or reached.
    """
    from p2p_worker.bench import _p2p

    started = time.time()
    cells, skipped = build_matrix(
        options.sizes,
        options.kinds,
        options.codecs,
        options.links,
        reps=options.reps,
        object_size=OBJECT_KIND_SIZE,
        baselines=options.baselines,
    )
    result = RunResult(skipped=list(skipped))
    result.meta = {
        "command": " ".join(["p2p-bench", *options.argv]),
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"
        ),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "reps": options.reps,
        **_versions(),
    }
    result.compression = {c: COMPRESSION_SECTIONS[c] for c in options.codecs if c != "raw"}
    result.meta["links"] = {
        lk.name: net_emulation_section(lk) for lk in options.links if lk.emulated
    }
    progress.start(len(cells))
    session = _p2p.open_cluster(options.address, timeout=options.timeout)
    result.meta["cluster"] = session.description
    result.meta["real_link"] = session.real_link
    pair = None
    try:
        for method, codec, link_name, block in job_blocks(cells):
            counting = _Counting(progress)
            try:
                if method in ("gloo", "ray"):
                    if pair is None:
                        progress.block("baselines: torch.distributed gloo and Ray object store")
                        pair = _baseline_pair(session, options)
                    _run_cells(pair.run_cell, block, options, result, counting)
                    continue
                if pair is not None:
                    pair.close()
                    pair = None
                link = next(lk for lk in options.links if lk.name == link_name)
                _p2p.run_p2p_block(session, codec, link, block, options, result, counting)
            except Exception as exc:  # recorded; the rest of the matrix still runs
                label = series_name(method, codec, link_name)
                reason = f"{type(exc).__name__}: {exc}"
                result.failures.append(Skipped(label, reason))
                progress.note(f"{label}: FAILED — {reason}")
                for cell in block[counting.done :]:
                    progress.cell_done(cell, [])
                if pair is not None:
                    pair.close()
                    pair = None
    finally:
        if pair is not None:
            pair.close()
        session.close()
    gone = [u.what.removeprefix("link ") for u in result.unavailable if u.what.startswith("link ")]
    result.skipped = [s for s in result.skipped if not any(f"@ {g} " in s.what for g in gone)]
    result.meta["wall_s"] = round(time.time() - started, 1)
    return result


class _Counting:
    """Passes progress on and counts the cells of the current block reported done."""

    def __init__(self, inner: ProgressSink) -> None:
        self.inner = inner
        self.done = 0

    def start(self, total: int) -> None:
        self.inner.start(total)

    def block(self, text: str) -> None:
        self.inner.block(text)

    def cell_done(self, cell: Cell, samples: Sequence[Sample]) -> None:
        self.done += 1
        self.inner.cell_done(cell, samples)

    def note(self, text: str) -> None:
        self.inner.note(text)


def _baseline_pair(session: Any, options: Options) -> Any:
    from p2p_worker.bench._baselines import BaselinePair

    return BaselinePair(
        timeout=options.timeout,
        sender_node=session.sender_node,
        receiver_node=session.receiver_node,
    )


def _run_cells(
    run_cell: Callable[[Cell, int], list[Sample]],
    cells: Sequence[Cell],
    options: Options,
    result: RunResult,
    progress: ProgressSink,
) -> None:
    for cell in cells:
        samples = run_cell(cell, options.reps)
        result.samples.extend(samples)
        progress.cell_done(cell, samples)
