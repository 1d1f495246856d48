"""The runner's orchestration with the Ray side replaced by fakes (no cluster needed).

What is real here: the matrix, the block order, progress accounting, failure and gap
recording, the probe verdicts. What is fake: the Ray session, the baseline actors and
the p2p jobs (their real counterparts run in tests/integration/test_bench_smoke.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from p2p_worker.bench import _p2p, _runner
from p2p_worker.bench._jobconfig import COMPRESSION_SECTIONS, job_config
from p2p_worker.bench._p2p import codec_gap, emulation_gap
from p2p_worker.bench._results import Sample, samples_from_timings
from p2p_worker.bench._runner import Options, run_matrix
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
        self.codec_gaps: dict[str, str | None] = {}
        self.emulation_checked = False
        self.emulation_gap: str | None = None

    def close(self) -> None:
        self.closed = True


class FakePair:
    def __init__(self, log: list[str], fail_on: str | None = None) -> None:
        self.log = log
        self.fail_on = fail_on
        self.closed = 0

    def run_cell(self, cell: Cell, reps: int) -> list[Sample]:
        self.log.append(f"{cell.method} {cell.kind}")
        if cell.method == self.fail_on:
            raise RuntimeError(f"{cell.method} broke")
        return samples_from_timings(cell, 100, [0.01] * reps)

    def close(self) -> None:
        self.closed += 1


class FakeJob:
    """Stands in for a P2PJob: the codec is read back from the job config."""

    state: ClassVar[dict[str, Any]] = {}

    def __init__(self, session: Any, config: dict[str, Any], timeout: float) -> None:
        comp = config["cluster"]["collective"].get("tensor_compression")
        self.codec = comp["codec"] if comp else "raw"
        self.link = "emulated" if "net_emulation" in config["cluster"] else "loopback"
        self.closed = False
        self.state["jobs"].append(self)

    def launch(self) -> FakeJob:
        if self.codec == self.state.get("launch_fail"):
            raise RuntimeError("worker did not start")
        return self

    def probe(self) -> tuple[float, int, int]:
        self.state["probes"].append(self.codec)
        wire = 4000 if self.codec in self.state.get("compressing", ("lz4", "zstd")) else 1 << 21
        return 0.01, wire, 1 << 20

    def run_cell(self, cell: Cell, reps: int) -> list[Sample]:
        self.state["log"].append(f"p2p-{self.codec} {cell.kind}")
        if self.codec == self.state.get("p2p_fail"):
            raise RuntimeError("worker died")
        return samples_from_timings(cell, 100, [0.02] * reps)

    def close(self) -> None:
        self.closed = True


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
    state: dict[str, Any] = {
        "session": FakeSession(),
        "pairs": [],
        "jobs": [],
        "probes": [],
        "log": [],
        "emulation": "no pacing",
        "probe_jobs": 0,
    }
    FakeJob.state = state

    def open_cluster(address: str | None, *, timeout: float) -> FakeSession:
        return state["session"]

    def baseline_pair(session: Any, opts: Options) -> FakePair:
        pair = FakePair(state["log"], state.get("baseline_fail"))
        state["pairs"].append(pair)
        return pair

    monkeypatch.setattr(_p2p, "open_cluster", open_cluster)
    monkeypatch.setattr(_p2p, "P2PJob", FakeJob)

    def probe_job(session: Any, timeout: float) -> FakeJob:
        state["probe_jobs"] += 1
        return FakeJob(session, {"cluster": {"collective": {}, "net_emulation": {}}}, timeout)

    def check_emulation(session: Any, job: FakeJob) -> str | None:
        job.close()
        session.emulation_checked, session.emulation_gap = True, state["emulation"]
        return state["emulation"]

    monkeypatch.setattr(_p2p, "emulation_probe_job", probe_job)
    monkeypatch.setattr(_p2p, "check_emulation", check_emulation)
    monkeypatch.setattr(_runner, "_baseline_pair", baseline_pair)
    return state


def test_methods_of_a_link_are_interleaved_and_every_cell_accounted(
    fakes: dict[str, Any],
) -> None:
    progress = Progress()
    result = run_matrix(options(), progress)
    # loopback: all series side by side, per kind (ray.util.collective: tensors only)
    assert fakes["log"] == [
        "gloo tensor",
        "ray tensor",
        "raycoll tensor",
        "p2p-raw tensor",
        "p2p-lz4 tensor",
        "gloo object",
        "ray object",
        "p2p-raw object",
        "p2p-lz4 object",
    ]
    assert fakes["probes"] == ["lz4"]  # the codec is probed once, raw never
    assert len(fakes["pairs"]) == 1
    assert fakes["pairs"][0].closed == 1
    assert all(job.closed for job in fakes["jobs"])
    # 100mbit: its jobs start with the emulation probe, which finds no pacing; none measures
    assert [job.link for job in fakes["jobs"]] == ["loopback"] * 2 + ["emulated"] * 3
    assert fakes["probe_jobs"] == 1
    assert not any(s.link == "100mbit" for s in result.samples)
    assert fakes["session"].closed
    assert progress.total == len(progress.done) == 5 + 4 + 2 * 2
    assert len({c for c, _ in progress.done}) == progress.total
    assert {s.method for s in result.samples} == {"gloo", "ray", "raycoll", "p2p"}
    assert result.failures == []
    assert result.unavailable == [Skipped("link 100mbit", "no pacing")]
    assert result.compression == {"lz4": COMPRESSION_SECTIONS["lz4"]}
    assert result.meta["cluster"] == "fake"
    assert result.meta["links"] == {
        "100mbit": {"enabled": True, "bandwidth_mbps": 100.0, "delay_ms": 1.0}
    }
    assert result.meta["wall_s"] >= 0


def test_emulated_links_run_when_emulation_works(fakes: dict[str, Any]) -> None:
    fakes["emulation"] = None
    result = run_matrix(options(codecs=["raw", "zstd"]), Progress())
    assert [(j.codec, j.link) for j in fakes["jobs"]] == [
        ("raw", "loopback"),
        ("zstd", "loopback"),
        ("raw", "emulated"),  # the probe job
        ("raw", "emulated"),
        ("zstd", "emulated"),
    ]
    assert fakes["probes"] == ["zstd"]
    assert {s.link for s in result.samples} == {"loopback", "100mbit"}
    assert result.unavailable == []


def test_a_codec_that_does_not_compress_is_unavailable_everywhere(
    fakes: dict[str, Any],
) -> None:
    fakes["compressing"] = ("zstd",)
    fakes["emulation"] = None
    progress = Progress()
    result = run_matrix(options(codecs=["raw", "lz4", "zstd"]), progress)
    assert [u.what for u in result.unavailable] == ["codec lz4"]
    assert "2097152 wire bytes" in result.unavailable[0].reason
    assert fakes["probes"] == ["lz4", "zstd"]  # probed once; not relaunched on 100mbit
    assert [(j.codec, j.link) for j in fakes["jobs"]].count(("lz4", "emulated")) == 0
    assert not any(s.codec == "lz4" for s in result.samples)
    assert len(progress.done) == progress.total


def test_failures_are_recorded_and_the_other_series_go_on(fakes: dict[str, Any]) -> None:
    fakes["p2p_fail"] = "raw"
    fakes["baseline_fail"] = "ray"
    fakes["launch_fail"] = "lz4"
    progress = Progress()
    result = run_matrix(options(links=[LINK_PROFILES["loopback"]]), progress)
    assert sorted(f.what for f in result.failures) == ["Ray object store", "p2p lz4", "p2p raw"]
    reasons = {f.what: f.reason for f in result.failures}
    assert reasons["p2p raw"] == "RuntimeError: worker died"
    assert reasons["p2p lz4"] == "RuntimeError: worker did not start"
    assert sum("FAILED" in n for n in progress.notes) == 3
    # a failed series is tried once, then dropped; gloo and ray.util.collective go on
    assert fakes["log"] == [
        "gloo tensor",
        "ray tensor",
        "raycoll tensor",
        "p2p-raw tensor",
        "gloo object",
    ]
    assert len(progress.done) == progress.total == 5 + 4
    assert len({c for c, _ in progress.done}) == progress.total
    assert {s.cell().series for s in result.samples} == {
        "torch.distributed gloo",
        "ray.util.collective",
    }
    assert fakes["pairs"][0].closed == 1
    assert all(job.closed for job in fakes["jobs"])


def test_the_emulation_probe_runs_once_per_run(fakes: dict[str, Any]) -> None:
    fakes["emulation"] = None
    links = [LINK_PROFILES[n] for n in ("loopback", "1gbit", "100mbit")]
    result = run_matrix(options(codecs=["raw"], links=links), Progress())
    assert fakes["probe_jobs"] == 1
    assert {s.link for s in result.samples} == {"loopback", "1gbit", "100mbit"}


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

    for codec in ("raw", "lz4", "zstd", "lz4_whole", "zstd_whole", "lz4_auto", "zstd_auto", "auto"):
        for link in LINK_PROFILES.values():
            cfg = parse_cluster_config(job_config(codec, link))
            job_codec = "zstd" if codec == "auto" else codec.split("_")[0]
            assert cfg.codec_name == (None if codec == "raw" else job_codec)
            assert (cfg.net_emulation is None) == (not link.emulated)
            chunk = cfg.collective.compression_pipeline.chunk_bytes
            assert chunk == (0 if codec.endswith("_whole") else 1 << 20)
            adaptive = cfg.collective.compression_pipeline.adaptive
            assert (adaptive is not None) == codec.endswith("auto")
            if adaptive is not None:
                want = ("lz4", "zstd", "sparse") if codec == "auto" else (codec.split("_")[0],)
                assert adaptive.codecs == want


def test_codec_modes_default_and_all() -> None:
    from p2p_worker.bench._spec import DEFAULT_CODECS, parse_codecs

    assert DEFAULT_CODECS == ("raw", "lz4", "zstd")
    assert parse_codecs("all") == [
        "raw",
        "lz4",
        "zstd",
        "lz4_whole",
        "zstd_whole",
        "lz4_auto",
        "zstd_auto",
        "auto",
    ]
    assert parse_codecs("zstd_whole,raw") == ["raw", "zstd_whole"]
    with pytest.raises(ValueError, match="lz5"):
        parse_codecs("lz5")


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
