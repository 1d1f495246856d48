"""``p2p-bench rl`` on four nodes (a head and three workers, every cable shaped to 1 Gbit/s).

One driver run (``runs``) runs ``p2p-bench rl`` twice on p2p, overlap off, same seeds:
once with every worker on node 0 (``--placement one-node``) and once spread (``spread``:
the two trainers on node 0, rollout worker i on node 1 + i). Batches are ordered by
rollout id, so the transport changes nothing but time: the spread run's reward and loss
of every step must equal the one-node run's bit for bit. The tests also check where the
workers ran, that every rollout id was trained on exactly once, and that each step's
weight sync recorded the bytes trainer 0 sent. Times are printed (the report's table,
with each step's weight sync against 1.5 x bytes / 1 Gbit/s), never asserted.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

STEPS = 8  # the fewest steps at which the run also checks that the reward rose
ROLLOUTS, BATCH = 3, 16
FLAGS = ["--quick", "--stack", "p2p", "--rollout-workers", str(ROLLOUTS), "--steps", str(STEPS)]
FLAGS += ["--batch", str(BATCH), "--timeout", "120"]
PLACEMENTS = ("one-node", "spread")


@pytest.fixture(scope="module")
def runs(four_node_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The driver's result: the nodes, and per placement what ``p2p-bench rl`` wrote."""
    driver = Path(__file__).resolve().parent / "drivers" / "rl_driver.py"
    out = tmp_path_factory.mktemp("rl4")
    start = time.perf_counter()
    argv = [str(driver), str(out), *PLACEMENTS, "--", *FLAGS]
    res = four_node_cluster.run_driver(argv, timeout=240)
    result: dict[str, Any] = res.check()
    print(f"\nfour-node rl driver: {time.perf_counter() - start:.1f} s")
    for placement in PLACEMENTS:
        run = result[placement]
        if "report" in run:
            print(f"--- {placement} ({run['wall_seconds']:.1f} s)\n{run['report']}")
    return result


def _run(runs: dict[str, Any], placement: str) -> dict[str, Any]:
    run: dict[str, Any] = runs[placement]
    assert "records" in run, run  # the driver wrote nothing: its output says why
    return run


def _curve(run: dict[str, Any]) -> list[tuple[float, float]]:
    return [(r["reward"], r["loss"]) for r in sorted(run["records"], key=lambda r: r["step"])]


def test_spread_over_four_nodes_the_reward_curve_is_the_one_node_run_s_bit_for_bit(
    runs: dict[str, Any],
) -> None:
    one, spread = _run(runs, "one-node"), _run(runs, "spread")
    assert len(_curve(one)) == STEPS
    assert _curve(spread) == _curve(one)  # floats equal bit for bit, not approximately
    rewards = [reward for reward, _ in _curve(one)]
    k = STEPS // 4
    assert sum(rewards[-k:]) > sum(rewards[:k])  # and the loop learned
    for run in (one, spread):
        # weights bit-equal on every worker, ids once each, the reward rose, and spread:
        # no rollout worker on the trainers' node
        assert all(run["checks"].values()), run["checks"]
        assert run["status"] == 0
    assert "p2p: no rollout worker on the trainers' node" in spread["checks"]


def test_the_workers_ran_where_the_placement_put_them(
    four_node_cluster: Any, runs: dict[str, Any]
) -> None:
    ips = [n.ip for n in four_node_cluster.hosts]
    assert runs["nodes"] == ips  # node rank i is the i-th address
    trainers = {"trainer 0": ips[0], "trainer 1": ips[0]}
    assert _run(runs, "one-node")["nodes"]["p2p"] == {
        **trainers,
        **{f"rollout {i}": ips[0] for i in range(ROLLOUTS)},
    }
    assert _run(runs, "spread")["nodes"]["p2p"] == {
        **trainers,
        **{f"rollout {i}": ips[1 + i] for i in range(ROLLOUTS)},
    }


def test_every_rollout_id_was_trained_on_exactly_once(runs: dict[str, Any]) -> None:
    due = STEPS * ROLLOUTS * BATCH
    for placement in PLACEMENTS:
        run = _run(runs, placement)
        tally = run["accounting"]["p2p"]
        assert {k: tally[k] for k in ("due", "trained", "lost", "twice", "unknown")} == {
            "due": due,
            "trained": due,
            "lost": 0,
            "twice": 0,
            "unknown": 0,
        }, placement
        assert tally["dropped"] == tally["resampled"] == 0
        assert [r["sequences"] for r in run["records"]] == [ROLLOUTS * BATCH] * STEPS


def test_each_step_records_the_bytes_of_its_weight_sync(runs: dict[str, Any]) -> None:
    full = None
    for placement in PLACEMENTS:
        run = _run(runs, placement)
        for r in run["records"]:
            full = full or r["weights_full_bytes"]
            assert r["weights_full_bytes"] == full >= 4 * 100_000  # fp32, about 0.1 M values
            # no deltas: one full copy out of trainer 0, over the link to the first rollout
            # node when spread; through its shared arena, on one node
            if placement == "spread":
                assert (r["weights_sent_bytes"], r["weights_shared_bytes"]) == (full, 0)
            else:
                assert (r["weights_sent_bytes"], r["weights_shared_bytes"]) == (0, full)
            assert r["weights"] > 0
        assert "| 2 | p2p | " in run["report"]  # each step against 1.5 x bytes / rate
