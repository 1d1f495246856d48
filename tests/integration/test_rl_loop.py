"""The RL loop of ``p2p-bench rl`` end to end, on both stacks, checked by its outputs.

A real embedded Ray cluster on 127.0.0.1: per stack two trainers and two rollout
workers in their own processes, p2p's channel, allreduce and weight sync against
``ray.util.queue``, ``ray.util.collective`` (gloo) and ``ray.put`` / ``ray.get``. A tiny
policy runs a few steps; the test reads the JSON, Markdown and PNG the run wrote and
checks their values: a record per stack and step with every phase, equal reward curves
(same seeds, batches ordered by rollout id: the transport changes nothing but time),
and every rollout worker holding the trainers' weights bit for bit.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from p2p_worker.bench import main

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]

STEPS = 3
PHASES = ("generate", "rollouts", "train", "allreduce", "weights", "idle")
JSON_NAME, MARKDOWN_NAME, PLOT_NAME = (f"p2p-bench-rl.{ext}" for ext in ("json", "md", "png"))
WORKERS = {"trainer 0", "trainer 1", "rollout 0", "rollout 1"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("P2P_RAY_TMPDIR", tempfile.mkdtemp(prefix="p2prl", dir="/tmp"))
    out = tmp_path_factory.mktemp("rl")
    argv = ["--quick", "--steps", str(STEPS), "--batch", "4", "--out", str(out)]
    status = main(["rl", *argv, "--timeout", "120"])
    return status, out


def _payload(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / JSON_NAME).read_text(encoding="utf-8"))
    return data


def test_every_check_held(run: tuple[int, Path]) -> None:
    status, out = run
    checks = _payload(out)["checks"]
    assert len(checks) == 3, checks  # too short a run to ask whether the reward rose
    assert all(checks.values()), checks
    assert status == 0


def test_a_record_per_stack_and_step_with_every_phase(run: tuple[int, Path]) -> None:
    records = _payload(run[1])["records"]
    assert sorted((r["stack"], r["step"]) for r in records) == [
        (stack, step) for stack in ("p2p", "ray") for step in range(1, STEPS + 1)
    ]
    for r in records:
        for phase in PHASES:
            assert r[phase] >= 0.0, (r["stack"], r["step"], phase)
        for phase in ("generate", "train", "weights"):
            assert r[phase] > 0, (r["stack"], r["step"], phase)
        assert r["moving"] == pytest.approx(r["rollouts"] + r["allreduce"] + r["weights"])
        assert sum(r[p] for p in PHASES) >= r["step_s"] - 1e-9
        assert 0.0 <= r["reward"] <= 1.0


def test_the_transport_changes_nothing_but_time(run: tuple[int, Path]) -> None:
    records = _payload(run[1])["records"]
    by_stack = {
        stack: [
            (r["reward"], r["loss"])
            for r in sorted(records, key=lambda r: r["step"])
            if r["stack"] == stack
        ]
        for stack in ("p2p", "ray")
    }
    assert by_stack["p2p"] == by_stack["ray"]  # floats equal bit for bit, not approximately
    assert len(set(by_stack["p2p"])) > 1  # and the policy did change from step to step


def test_every_worker_recorded_its_activities(run: tuple[int, Path]) -> None:
    timelines = _payload(run[1])["timelines"]
    for stack in ("p2p", "ray"):
        assert [t["step"] for t in timelines[stack]] == list(range(1, STEPS + 1))
        for tl in timelines[stack]:
            seen = {(s[0], s[1]) for s in tl["spans"]}
            assert {s[0] for s in tl["spans"]} == WORKERS
            for rank in (0, 1):
                assert {(f"rollout {rank}", a) for a in ("generate", "put", "pull")} <= seen
                assert {(f"trainer {rank}", a) for a in ("get", "train", "allreduce")} <= seen
            assert ("trainer 0", "push") in seen
            for _, _, start, end in tl["spans"]:
                assert tl["start"] <= start <= end <= tl["start"] + tl["wall"] + 1e-3


def test_the_report_has_the_table_and_the_plot(run: tuple[int, Path]) -> None:
    out = run[1]
    report = (out / MARKDOWN_NAME).read_text(encoding="utf-8")
    assert "| phase | p2p | ray | ray / p2p |" in report
    for phase in PHASES:
        assert f"| {phase} |" in report
    assert "data movement (rollouts + allreduce + weights)" in report
    assert "reward curves of p2p and ray equal bit for bit: yes" in report
    assert (out / PLOT_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
