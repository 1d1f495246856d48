"""Running the matrix: cluster lifecycle, the baselines, one p2p job per codec and link."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import p2p_worker.bench._p2p as _p2p
from p2p_worker.bench._baselines import BaselinePair
from p2p_worker.bench._jobconfig import COMPRESSION_SECTIONS, job_config, net_emulation_section
from p2p_worker.bench._report import RunResult
from p2p_worker.bench._results import Sample
from p2p_worker.bench._spec import (
    LINK_PROFILES,
    Cell,
    LinkProfile,
    Skipped,
    build_matrix,
    link_groups,
    series_name,
)

Runner = _p2p.P2PJob | BaselinePair
"""What measures the cells of a series: a p2p job, or the baselines' actor pair."""
OBJECT_KIND_SIZE = 0
"""Nominal ``size`` of ``object`` cells: the ladder does not apply to them."""


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
        baselines: whether to measure the baselines.
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

    Starts (or attaches to) the Ray cluster. Then, link by link, it starts everything
    that runs over that link at once (the two baseline actors, and a sender and a
    receiver worker group per codec) and measures the methods side by side: for each
    (kind, size), every method in turn. A dimension the installed stack cannot
    provide is recorded in ``RunResult.unavailable``; its cells are not run. A method
    that fails to start or fails a cell is recorded in ``RunResult.failures`` with its
    error and dropped; the other methods go on.

    Raises:
        p2p_asyncwork.P2PError: the Ray cluster could not be started or reached.
    """
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
    try:
        for link_name, group in link_groups(cells):
            link = next((lk for lk in options.links if lk.name == link_name), None)
            _LinkGroup(session, link or LINK_PROFILES[link_name], group, options, result, progress)
    finally:
        session.close()
    gone = [u.what.removeprefix("link ") for u in result.unavailable if u.what.startswith("link ")]
    result.skipped = [s for s in result.skipped if not any(f"@ {g} " in s.what for g in gone)]
    result.meta["wall_s"] = round(time.time() - started, 1)
    return result


class _LinkGroup:
    """Every series measured over one link, started together and measured interleaved."""

    def __init__(
        self,
        session: _p2p.P2PSession,
        link: LinkProfile,
        cells: list[Cell],
        options: Options,
        result: RunResult,
        progress: ProgressSink,
    ) -> None:
        self.session, self.link, self.cells, self.options = session, link, cells, options
        self.result, self.progress = result, progress
        self.done: set[Cell] = set()
        self.runners: dict[tuple[str, str], Runner] = {}
        self._owned: list[Runner] = []
        try:
            if self._start():
                self._measure()
        finally:
            for runner in self._owned:
                with contextlib.suppress(Exception):
                    runner.close()
            for cell in self.cells:  # whatever did not run is accounted for
                if cell not in self.done:
                    self._mark(cell, [])

    def _mark(self, cell: Cell, samples: list[Sample]) -> None:
        self.done.add(cell)
        self.result.samples.extend(samples)
        self.progress.cell_done(cell, samples)

    def _drop(self, key: tuple[str, str], what: str, reason: str, *, failed: bool) -> None:
        """Take a series out of this group, record why, and account for its cells."""
        self.runners.pop(key, None)
        if failed:
            self.result.failures.append(Skipped(what, reason))
            self.progress.note(f"{what}: FAILED — {reason}")
        elif not any(u.what == what for u in self.result.unavailable):
            self.result.unavailable.append(Skipped(what, reason))
            self.progress.note(f"{what}: unavailable — {reason}")
        for cell in self.cells:
            if (cell.method, cell.codec) == key and cell not in self.done:
                self._mark(cell, [])

    def _start(self) -> bool:
        """Start every runner of the group at once; False when nothing is left to measure."""
        series = list(dict.fromkeys((c.method, c.codec) for c in self.cells))
        starters: dict[tuple[tuple[str, str], ...], Callable[[], Runner]] = {}
        probe: _p2p.P2PJob | None = None
        if self.link.emulated and self.session.emulation_checked:
            if self.session.emulation_gap is not None:
                for key in series:
                    self._drop(
                        key, f"link {self.link.name}", self.session.emulation_gap, failed=False
                    )
                return False
        elif self.link.emulated:
            # Is emulation applied at all? The probe job starts with the link's jobs.
            probe = _p2p.emulation_probe_job(self.session, self.options.timeout)
            self._owned.append(probe)
            starters[(("probe", "raw"),)] = probe.launch
        baselines = tuple(k for k in series if k[0] != "p2p")
        if baselines:
            starters[baselines] = lambda: _baseline_pair(self.session, self.options)
        for key in series:
            if key[0] != "p2p":
                continue
            gap = self.session.codec_gaps.get(key[1])
            if gap is not None:
                self._drop(key, f"codec {key[1]}", gap, failed=False)
                continue
            label = series_name("p2p", key[1], self.link.name)
            try:
                job = _p2p.P2PJob(self.session, job_config(key[1], self.link), self.options.timeout)
            except Exception as exc:
                self._drop(key, label, f"{type(exc).__name__}: {exc}", failed=True)
                continue
            self._owned.append(job)
            starters[(key,)] = job.launch
        if not starters:
            return False
        names = ", ".join(
            series_name(m, c, self.link.name) for ks in starters for m, c in ks if m != "probe"
        )
        self.progress.block(f"starting {names}")
        with ThreadPoolExecutor(len(starters), thread_name_prefix="p2p-bench") as pool:
            futures = {keys: pool.submit(start) for keys, start in starters.items()}
        if probe is not None:
            try:
                futures.pop((("probe", "raw"),)).result()
                gap = _p2p.check_emulation(self.session, probe)
            except Exception as exc:
                reason = f"the link-emulation probe failed: {type(exc).__name__}: {exc}"
                for key in series:
                    self._drop(key, series_name(*key, self.link.name), reason, failed=True)
                return False
            if gap is not None:
                for key in series:
                    self._drop(key, f"link {self.link.name}", gap, failed=False)
                return False
        for keys, future in futures.items():
            try:
                runner = future.result()
            except Exception as exc:
                for key in keys:
                    label = series_name(*key, self.link.name)
                    self._drop(key, label, f"{type(exc).__name__}: {exc}", failed=True)
                continue
            if runner not in self._owned:
                self._owned.append(runner)
            for key in keys:
                self.runners[key] = runner
        for key, runner in list(self.runners.items()):
            if (
                key[0] == "p2p"
                and isinstance(runner, _p2p.P2PJob)  # a p2p series' runner is its job
                and key[1] != "raw"
                and key[1] not in self.session.codec_gaps
            ):
                _, wire, logical = runner.probe()
                gap = _p2p.codec_gap(key[1], wire, logical)
                self.session.codec_gaps[key[1]] = gap
                if gap is not None:
                    self._drop(key, f"codec {key[1]}", gap, failed=False)
        return bool(self.runners)

    def _measure(self) -> None:
        left = len(self.cells) - len(self.done)
        self.progress.block(
            f"{self.link.name}: {left} cells, {len(self.runners)} methods side by side"
        )
        for cell in self.cells:
            key = (cell.method, cell.codec)
            runner = self.runners.get(key)
            if runner is None or cell in self.done:
                continue
            try:
                samples = runner.run_cell(cell, self.options.reps)
            except Exception as exc:  # recorded; the other series go on
                label = series_name(*key, self.link.name)
                self._drop(key, label, f"{type(exc).__name__}: {exc}", failed=True)
                continue
            self._mark(cell, samples)


def _baseline_pair(session: _p2p.P2PSession, options: Options) -> BaselinePair:
    return BaselinePair(
        timeout=options.timeout,
        sender_node=session.sender_node,
        receiver_node=session.receiver_node,
    )
