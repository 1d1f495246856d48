"""The runner's orchestration with the Ray side replaced by fakes (no cluster needed).

What is real here: the matrix, the block order, progress accounting, failure and gap
recording, the probe verdicts. What is fake: the Ray session, the baseline actors and
the p2p jobs (their real counterparts run in tests/integration/test_bench_smoke.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from p2p_worker.bench import _p2p, _runner
from p2p_worker.bench._p2p import codec_gap, emulation_gap
from p2p_worker.bench._results import Sample, samples_from_timings
from p2p_worker.bench._runner import COMPRESSION_SECTIONS, Options, job_config, run_matrix
from p2p_worker.bench._spec import LINK_PROFILES, Cell, Skipped


class Progress:
    def __init__(self) -> None:
        self.total = -1
        self.done: list[tuple[Cell, int]] = []
        self.notes: list[str] = []
        self.blocks: list[str] = []

    def start(self, total: int) -> None:
        self.total = total

    def block(self, text: str) -> None:
        self.blocks.append(text)

    def cell_done(self, cell: Cell, samples: Sequence[Sample]) -> None:
        self.done.append((cell, len(samples)))

    def note(self, text: str) -> None:
        self.notes.append(text)


class FakeSession:
    description = "fake"
    real_link = "loopback"
    sender_node = receiver_node = None

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakePair:
    def __init__(self, fail_on: str | None = None) -> None:
        self.fail_on = fail_on
        self.closed = 0

    def run_cell(self, cell: Cell, reps: int) -> list[Sample]:
        if cell.method == self.fail_on:
            raise RuntimeError(f"{cell.method} broke")
        return samples_from_timings(cell, 100, [0.01] * reps)

    def close(self) -> None:
        self.closed += 1


def options(**kw: Any) -> Options:
    base: dict[str, Any] = {
        "sizes": [1024],
        "kinds": ["tensor", "object"],
        "codecs": ["raw", "lz4"],
        "links": [LINK_PROFILES["loopback"], LINK_PROFILES["100mbit"]],
        "reps": 2,
        "out": Path("unused"),
    }
    base.update(kw)
    return Options(**base)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"session": FakeSession(), "pairs": [], "jobs": []}

    def open_cluster(address: str | None, *, timeout: float) -> FakeSession:
        return state["session"]

    def baseline_pair(session: Any, opts: Options) -> FakePair:
        pair = FakePair(state.get("baseline_fail"))
        state["pairs"].append(pair)
        return pair

    def run_p2p_block(session, codec, link, cells, opts, result, progress) -> None:  # type: ignore[no-untyped-def]
        state["jobs"].append((codec, link.name))
        if link.emulated:
            if not result.unavailable:
                result.unavailable.append(Skipped(f"link {link.name}", "no pacing"))
            for cell in cells:
                progress.cell_done(cell, [])
            return
        if codec == state.get("p2p_fail"):
            progress.cell_done(cells[0], [])
            raise RuntimeError("worker died")
        for cell in cells:
            samples = samples_from_timings(cell, 100, [0.02] * opts.reps)
            result.samples.extend(samples)
            progress.cell_done(cell, samples)

    monkeypatch.setattr(_p2p, "open_cluster", open_cluster)
    monkeypatch.setattr(_p2p, "run_p2p_block", run_p2p_block)
    monkeypatch.setattr(_runner, "_baseline_pair", baseline_pair)
    return state


def test_runs_every_block_in_order_and_accounts_every_cell(fakes: dict[str, Any]) -> None:
    progress = Progress()
    result = run_matrix(options(), progress)
    assert fakes["jobs"] == [
        ("raw", "loopback"),
        ("lz4", "loopback"),
        ("raw", "100mbit"),
        ("lz4", "100mbit"),
    ]
    assert len(fakes["pairs"]) == 1
    assert fakes["pairs"][0].closed == 1
    assert fakes["session"].closed
    assert progress.total == len(progress.done) == 2 * 2 + 4 * 2
    methods = {s.method for s in result.samples}
    assert methods == {"gloo", "ray", "p2p"}
    assert result.failures == []
    assert result.unavailable == [Skipped("link 100mbit", "no pacing")]
    assert result.compression == {"lz4": COMPRESSION_SECTIONS["lz4"]}
    assert result.meta["cluster"] == "fake"
    assert result.meta["links"] == {
        "100mbit": {"enabled": True, "bandwidth_mbps": 100.0, "delay_ms": 1.0}
    }
    assert result.meta["wall_s"] >= 0


def test_a_failing_block_is_recorded_and_the_rest_still_runs(fakes: dict[str, Any]) -> None:
    fakes["p2p_fail"] = "raw"
    fakes["baseline_fail"] = "ray"
    progress = Progress()
    result = run_matrix(options(links=[LINK_PROFILES["loopback"]]), progress)
    assert [f.what for f in result.failures] == ["Ray object store", "p2p raw"]
    assert "RuntimeError: worker died" in result.failures[1].reason
    assert any("FAILED" in n for n in progress.notes)
    # every cell reported exactly once, failed ones without samples
    assert len(progress.done) == progress.total == 4 * 2
    assert len({c for c, _ in progress.done}) == progress.total
    assert {s.cell().series for s in result.samples} == {"torch.distributed gloo", "p2p lz4"}
    assert fakes["pairs"][0].closed == 1


def test_skipped_cells_of_an_unavailable_link_are_not_listed(fakes: dict[str, Any]) -> None:
    opts = options(sizes=[1024, 64 << 20], kinds=["tensor"], codecs=["raw"])
    result = run_matrix(opts, Progress())
    assert result.unavailable == [Skipped("link 100mbit", "no pacing")]
    assert result.skipped == []


def test_job_config_per_codec_and_link() -> None:
    assert job_config("raw", LINK_PROFILES["loopback"]) == {
        "cluster": {"collective": {"init_timeout": 120.0}}
    }
    cfg = job_config("zstd", LINK_PROFILES["1gbit"])["cluster"]
    assert cfg["collective"]["tensor_compression"]["codec"] == "zstd"
    assert cfg["collective"]["tensor_compression"]["excluded_dtypes"] == []
    assert cfg["net_emulation"] == {"enabled": True, "bandwidth_mbps": 1000.0, "delay_ms": 0.1}


def test_job_configs_are_valid_cluster_configs() -> None:
    from p2p_worker import parse_cluster_config

    for codec in ("raw", "lz4", "zstd"):
        for link in LINK_PROFILES.values():
            cfg = parse_cluster_config(job_config(codec, link))
            assert cfg.codec_name == (None if codec == "raw" else codec)
            assert (cfg.net_emulation is None) == (not link.emulated)


def test_probe_verdicts() -> None:
    assert codec_gap("lz4", 4000, 1 << 20) is None
    gap = codec_gap("zstd", (1 << 20) + 72, 1 << 20)
    assert gap is not None
    assert "(zstd) is accepted" in gap
    assert "1048648 wire bytes" in gap
    # 1 MiB at 8 Mbit/s needs ~1.05 s; half of that passes, far less does not
    assert emulation_gap(0.9, 1 << 20, 8.0) is None
    slow = emulation_gap(0.0017, 1 << 20, 8.0)
    assert slow is not None
    assert "took 1.7 ms where the link needs 1049 ms" in slow
