"""The RL loop of ``p2p-bench rl`` end to end, on both stacks, checked by its outputs.

A real embedded Ray cluster on 127.0.0.1: per stack two trainers and two rollout
workers in their own processes, p2p's channel, allreduce and weight sync against
``ray.util.queue``, ``ray.util.collective`` (gloo) and ``ray.put`` / ``ray.get``. A tiny
policy runs a few steps; the test reads the JSON, Markdown and PNG the run wrote and
checks their values: a record per stack and step with every phase, equal reward curves
(same seeds, batches ordered by rollout id: the transport changes nothing but time),
and every rollout worker holding the trainers' weights bit for bit.

The run is ``--kill-rollout 2``: during step 2 the p2p loop SIGKILLs its rollout worker 1
and a replacement takes its place (the Ray baseline runs without the kill, and one run
serves both the plain loop's checks and the lost worker's, to keep CI's time). The
replacement samples the lost sequences again from the same weights and seeds, so the
p2p reward curve still equals Ray's bit for bit; every rollout id is trained on exactly
once, and the replacement holds the trainers' weights at the end of step 2.
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
KILL = 2
BATCH = 4
PHASES = ("generate", "rollouts", "train", "allreduce", "weights", "idle")
JSON_NAME, MARKDOWN_NAME, PLOT_NAME = (f"p2p-bench-rl.{ext}" for ext in ("json", "md", "png"))
WORKERS = {"trainer 0", "trainer 1", "rollout 0", "rollout 1"}
REPLACEMENT = "rollout 1 (replacement)"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("P2P_RAY_TMPDIR", tempfile.mkdtemp(prefix="p2prl", dir="/tmp"))
    out = tmp_path_factory.mktemp("rl")
    argv = ["--quick", "--steps", str(STEPS), "--batch", str(BATCH), "--out", str(out)]
    argv += ["--kill-rollout", str(KILL)]
    status = main(["rl", *argv, "--timeout", "120"])
    return status, out


def _payload(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / JSON_NAME).read_text(encoding="utf-8"))
    return data


def test_every_check_held(run: tuple[int, Path]) -> None:
    status, out = run
    checks = _payload(out)["checks"]
    assert len(checks) == 6, checks  # too short a run to ask whether the reward rose
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
            workers = WORKERS
            if stack == "p2p" and tl["step"] >= KILL:  # the dead worker's spans died with it
                workers = WORKERS - {"rollout 1"} | {REPLACEMENT}
            assert {s[0] for s in tl["spans"]} == workers
            for rank in (0, 1):
                rollout = REPLACEMENT if f"rollout {rank}" not in workers else f"rollout {rank}"
                if (stack, tl["step"]) != ("p2p", KILL) or rollout != REPLACEMENT:
                    assert {(rollout, a) for a in ("generate", "put", "pull")} <= seen
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


def test_a_lost_rollout_worker_is_replaced_and_no_rollout_is_lost_or_trained_twice(
    run: tuple[int, Path],
) -> None:
    data = _payload(run[1])
    killed, replaced = data["events"]
    assert (killed["event"], killed["step"], killed["slot"], killed["how"]) == (
        "killed",
        KILL,
        1,
        "SIGKILL",
    )
    assert killed["pid"] > 0
    assert (replaced["event"], replaced["step"], replaced["slot"]) == ("replaced", KILL, 1)
    # trainer 0 still waited for the lost sequences (version 1), or had trained step 2
    # already when the kill came after the dead worker's put (version 2)
    assert replaced["joined_version"] in (KILL - 1, KILL)
    assert replaced["resampled"] == (replaced["joined_version"] == KILL - 1)
    assert replaced["held_at_end"] == KILL
    assert replaced["caught_up"] is True
    assert 0 < replaced["launch_s"] < 120
    assert 0 < replaced["catch_up_s"] < 120
    due = STEPS * 2 * BATCH
    for stack, resampled in (("p2p", BATCH if replaced["resampled"] else 0), ("ray", 0)):
        tally = data["accounting"][stack]
        assert {k: tally[k] for k in ("due", "trained", "lost", "twice", "unknown")} == {
            "due": due,
            "trained": due,
            "lost": 0,
            "twice": 0,
            "unknown": 0,
        }, stack
        assert tally["resampled"] == resampled
        assert tally["dropped"] in (0, BATCH)  # the dead worker's item, had it arrived
    records = data["records"]
    assert [r["sequences"] for r in records] == [2 * BATCH] * len(records)
    assert [r["step"] for r in records if r.get("lost_worker")] == [KILL]
    timeline = data["timelines"]["p2p"][KILL - 1]["spans"]
    assert {(REPLACEMENT, "join"), ("trainer 0", "catchup")} <= {(s[0], s[1]) for s in timeline}
    report = (run[1] / MARKDOWN_NAME).read_text(encoding="utf-8")
    assert f"- p2p rollout accounting: {due} rollout ids due, {due} trained, 0 lost" in report
    assert f"killed with SIGKILL during step {KILL}" in report
