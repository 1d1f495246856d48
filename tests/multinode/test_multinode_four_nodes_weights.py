"""``p2p-bench weights`` on four nodes (a head and three workers, every cable 1 Gbit/s).

One driver run (``run``) runs ``p2p-bench weights --placement spread`` with every method:
the trainer on node 0, rollout worker i on node 1 + i, the small model, a few steps. A
second one (``run_six``) runs p2p's methods to six targets, two on each worker node:
one of each pair is relayed, the other reads each bucket from its node-mate's shared
memory (with ``p2p-packed`` too: each relay unpacks the buckets it forwards packed, and
lends its node-mate the plain bits). The
tests check that every method left every target holding exactly the trainer's version,
that the targets ran on the other nodes, that the JSON records are complete, that the
wire bytes are plausible (p2p-full sends one copy, p2p-delta less) and, as a check that
the shaping is real, that no method moved a copy faster than 1 Gbit/s allows. Times are
printed (the report's table, p2p-delta against 1.5 x its bytes at 1 Gbit/s, p2p-full
against the fastest Ray method), never asserted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(240)]

TARGETS = 3
STEPS, WARMUP = 3, 1
LINK_MBPS = 1000.0
METHODS = (
    "p2p-delta",
    "p2p-full",
    "sends",
    "ray-object-store",
    "gloo-broadcast",
    "ray-collective-broadcast",
    "ray-direct-transport",
)
FLAGS = ["--model", "small", "--targets", str(TARGETS), "--lrs", "1e-5"]
FLAGS += ["--steps", str(STEPS), "--warmup", str(WARMUP), "--methods", ",".join(METHODS)]
FLAGS += ["--timeout", "120"]


SIX = 6
FLAGS_SIX = ["--model", "small", "--targets", str(SIX), "--lrs", "1e-5"]
SIX_METHODS = ["p2p-delta", "p2p-full", "p2p-packed"]
FLAGS_SIX += ["--steps", str(STEPS), "--warmup", str(WARMUP), "--methods", ",".join(SIX_METHODS)]
FLAGS_SIX += ["--timeout", "120"]


def _drive(cluster: Any, out: Path, flags: list[str]) -> dict[str, Any]:
    """The driver's result: the nodes and what ``p2p-bench weights`` wrote."""
    driver = Path(__file__).resolve().parent / "drivers" / "weights_driver.py"
    start = time.perf_counter()
    argv = [str(driver), str(out), f"{LINK_MBPS:g}", "--", *flags]
    res = cluster.run_driver(argv, timeout=180)
    result: dict[str, Any] = res.check()
    print(f"\nfour-node weights driver: {time.perf_counter() - start:.1f} s")
    print(result.get("report", "(no report)"))
    assert "error" not in result, result["error"]
    assert "records" in result, result  # the bench wrote nothing: its output says why
    return result


@pytest.fixture(scope="module")
def run(four_node_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every method to three targets, one per worker node."""
    return _drive(four_node_cluster, tmp_path_factory.mktemp("weights4"), FLAGS)


@pytest.fixture(scope="module")
def run_six(four_node_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """p2p's methods to six targets, two per worker node."""
    return _drive(four_node_cluster, tmp_path_factory.mktemp("weights6"), FLAGS_SIX)


def _records(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["method"]: r for r in run["records"]}


def test_every_method_left_every_target_exact(run: dict[str, Any]) -> None:
    assert run["status"] == 0
    records = _records(run)
    assert sorted(records) == sorted(METHODS)
    assert {m: r["exact"] for m, r in records.items()} == dict.fromkeys(METHODS, True)
    versions = run["versions"]
    assert [v["version"] for v in versions] == list(range(1, STEPS + 1))


def test_the_trainer_is_on_node_0_and_every_target_on_another_node(
    four_node_cluster: Any, run: dict[str, Any]
) -> None:
    ips = [n.ip for n in four_node_cluster.hosts]
    assert run["nodes"] == ips
    for method, r in _records(run).items():
        assert r["source_node"] == ips[0], method
        assert r["target_nodes"] == ips[1 : 1 + TARGETS], method


def test_the_records_are_complete(run: dict[str, Any]) -> None:
    assert run["meta"]["placement"] == "spread"
    assert run["meta"]["link_mbps"] == LINK_MBPS
    for method, r in _records(run).items():
        assert (r["link"], r["targets"], r["lr"]) == ("network", TARGETS, 1e-5), method
        assert r["steps"] == len(r["seconds_each"]) == STEPS - WARMUP, method
        assert r["seconds"] > 0, method
        assert r["gbps"] > 0, method
        assert 0 < r["changed"] <= 1, method
    assert "## network, lr 1e-05" in run["report"]
    assert "p2p-delta" in run["report"]
    assert "1.5 x" in run["report"]
    assert "the fastest Ray method" in run["report"]


def test_the_wire_bytes_are_plausible(run: dict[str, Any]) -> None:
    records = _records(run)
    full = records["p2p-full"]["full_bytes"]
    assert full == 2 * 4_919_040  # the small model in bf16
    # p2p relays: the trainer sends one copy; within 5 % of the model's bf16 bytes
    assert 0.95 * full <= records["p2p-full"]["wire_bytes"] <= 1.05 * full
    assert 0 < records["p2p-delta"]["wire_bytes"] < records["p2p-full"]["wire_bytes"]
    for method in METHODS[2:]:
        assert records[method]["wire_bytes"] == TARGETS * full, method


def test_no_method_beat_the_shaped_link(run: dict[str, Any]) -> None:
    # Every method moves at least one copy through the trainer's 1 Gbit/s cable, so each
    # sync takes at least that copy's bytes at the link rate (0.8: a shaper's burst).
    records = _records(run)
    for method, r in records.items():
        one_copy = r["wire_bytes"] if method.startswith("p2p-") else r["full_bytes"]
        floor = 0.8 * one_copy * 8 / (LINK_MBPS * 1e6)
        assert min(r["seconds_each"]) >= floor, (method, r["seconds_each"], floor)


def test_a_second_target_on_a_node_reads_its_node_mates_shared_memory(
    four_node_cluster: Any, run_six: dict[str, Any]
) -> None:
    assert run_six["status"] == 0
    ips = [n.ip for n in four_node_cluster.hosts]
    records = _records(run_six)
    assert sorted(records) == SIX_METHODS
    for method, r in records.items():
        assert r["exact"], method
        assert r["target_nodes"] == [ips[1 + i % 3] for i in range(SIX)], method
    full = records["p2p-full"]
    # one target per node is relayed; the other three read every bucket of a full push
    # from their node-mate's arena, so no byte crosses a cable twice for them
    assert full["buckets"] > 0
    assert full["lent_buckets"] == 3 * full["buckets"]
    model = 2 * 4_919_040  # the small model in bf16
    assert 0.95 * model <= full["wire_bytes"] <= 1.05 * model
    # packed: the same relay with about 2/3 of the bytes on the cables (the lent
    # node-mates read their relay's unpacked copy)
    packed = records["p2p-packed"]
    assert packed["lent_buckets"] == 3 * packed["buckets"] > 0
    assert 0.5 * model <= packed["wire_bytes"] <= 0.8 * model
