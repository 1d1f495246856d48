"""Four Ray nodes (a head and three workers) behind a switch, every cable shaped to 1 Gbit/s.

One cluster for the module (``four_node_cluster``) and one driver run (``scenario``): a
trainer on node 0 and one rollout worker on each of nodes 1..3 sync weights, run
collectives over all four, and pass keyed items through a channel that lives on node 2.
Each worker reads its own node's cable counters around each operation, so the tests check
what crossed which cable, besides the values.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(600)]

MODEL_BYTES = 32 * 1024**2  # fp32: about 8.4 M parameters
ITEM_TENSOR = 8 * 1024**2  # channel_items: every third item is a 1 M int64 tensor


@pytest.fixture(scope="module")
def scenario(four_node_cluster: Any) -> dict[str, Any]:
    """The driver's result for every part (weights, collectives, channel)."""
    driver = Path(__file__).resolve().parent / "drivers" / "nodes_driver.py"
    start = time.perf_counter()
    res = four_node_cluster.run_driver([str(driver), str(MODEL_BYTES)], timeout=420)
    out: dict[str, Any] = res.check()
    print(f"four-node driver: {time.perf_counter() - start:.1f} s")
    return out


def _part(scenario: dict[str, Any], name: str) -> dict[str, Any]:
    part: dict[str, Any] = scenario[name]
    assert "error" not in part, f"{part['error']}\n{part['traceback']}"
    return part


def test_one_node_per_namespace_each_cable_shaped(
    four_node_cluster: Any, scenario: dict[str, Any]
) -> None:
    cluster = four_node_cluster
    ips = [n.ip for n in cluster.hosts]
    assert sorted(str(n["ip"]) for n in cluster.nodes) == ips
    assert len({n["node_id"] for n in cluster.nodes}) == 4
    assert [n["ip"] for n in scenario["nodes"]] == ips  # node rank i is the i-th address
    for node in cluster.hosts:
        assert " tbf " in cluster.qdisc_stats(node.role)
        assert "rate 1Gbit" in cluster.qdisc_stats(node.role)
    # The trainer is on the head, rollout rank r on the node of rank r + 1.
    assert [w["node_ip"] for w in scenario["trainer"]] == ips[:1]
    assert [w["node_ip"] for w in scenario["rollout"]] == ips[1:]


def test_weight_sync_from_the_trainer_node_to_three_rollout_nodes(
    four_node_cluster: Any, scenario: dict[str, Any]
) -> None:
    weights = _part(scenario, "weights")
    rate_bytes = four_node_cluster.rate_bps / 8
    burst = max(64 * 1024, four_node_cluster.rate_bps // 8 // 100)  # shape()'s default
    digests = set()
    pairs = zip(weights["pushes"], weights["pulls"], strict=True)
    for version, (push, pulls) in enumerate(pairs, 1):
        assert push["failed"] == {}, push
        assert push["targets"] == {f"mn4_rollout:{r}": version for r in range(3)}
        full = push["full_bytes"]
        assert full == push["sent_bytes"] == weights["model_bytes"] >= MODEL_BYTES
        # Every rollout worker holds exactly the trainer's values of this version.
        for pull in pulls:
            assert pull["version"] == version
            assert pull["digest"] == push["digest"]
            assert pull["net"]["rx_bytes"] >= full  # all of it came over its own cable
        digests.add(push["digest"])
        # The trainer's node sent one copy, not three: the rollouts relay it.
        sent = push["net"]["tx_bytes"]
        assert full <= sent < 1.25 * full, (sent, full)
        assert sum(p["net"]["tx_bytes"] for p in pulls) >= 2 * full  # two of them forward
        # No byte can beat the token bucket: what it lets through at once is one burst.
        assert push["seconds"] >= 0.95 * (full - burst) / rate_bytes, push
    assert len(digests) == len(weights["pushes"])  # every version changed every value
    ideal = full / rate_bytes
    steady = [p["seconds"] for p in weights["pushes"][1:]]  # the first one also connects
    print(
        f"weight sync, trainer node -> 3 rollout nodes over 1 Gbit/s cables: {full / 1e6:.1f} MB"
        f" per copy, bytes/bandwidth {ideal:.3f} s; pushes "
        + ", ".join(f"{p['seconds']:.3f} s" for p in weights["pushes"])
        + f"; best steady {min(steady):.3f} s = {min(steady) / ideal:.2f}x bytes/bandwidth"
    )
    assert min(steady) < 20 * ideal  # loose: a busy 2-core machine, not a benchmark


def test_the_same_copy_by_ray_object_store_and_by_three_sends(
    four_node_cluster: Any, scenario: dict[str, Any]
) -> None:
    weights = _part(scenario, "weights")
    full = weights["pushes"][0]["full_bytes"]
    methods = weights["methods"]
    for name, method in methods.items():
        assert method["held"] == [weights["methods_digest"]] * 3, name  # exact, everywhere
        for node in (1, 2, 3):
            assert method["net"][node]["rx_bytes"] >= full, (name, method["net"])
    # p2p's source sends one copy; three sends put three through the trainer's cable (Ray's
    # object store may serve a pull from a node that already holds the object).
    assert methods["p2p-push"]["net"][0]["tx_bytes"] < 1.25 * full, methods["p2p-push"]
    assert methods["three-sends"]["net"][0]["tx_bytes"] >= 3 * full, methods["three-sends"]
    ideal = full / (four_node_cluster.rate_bps / 8)
    p2p = methods["p2p-push"]["seconds"]
    print(
        f"one {full / 1e6:.1f} MB copy from node 0 to nodes 1-3 (bytes/bandwidth {ideal:.3f} s),"
        " timed by the driver: "
        + ", ".join(
            f"{name} {m['seconds']:.3f} s ({m['seconds'] / p2p:.2f}x p2p,"
            f" {m['net'][0]['tx_bytes'] / full:.2f} copies out of node 0)"
            for name, m in methods.items()
        )
    )


def test_collectives_over_four_members_on_four_nodes(
    four_node_cluster: Any, scenario: dict[str, Any]
) -> None:
    members = _part(scenario, "collectives")["members"]
    ips = [n.ip for n in four_node_cluster.hosts]
    assert sorted(m["rank"] for m in members) == [0, 1, 2, 3]
    assert sorted(m["node_ip"] for m in members) == ips
    by_rank = sorted(members, key=lambda m: m["rank"])
    expected = [[m["rank"], int(m["node_ip"].rsplit(".", 1)[1])] for m in by_rank]
    for m in members:
        assert m["world_size"] == 4
        assert m["members"] == by_rank[0]["members"]
        assert all(m["ok"].values()), m["ok"]
        assert m["gathered"] == expected
        # Whatever the algorithm, each member's share crosses its own cable.
        assert m["net"]["tx_bytes"] >= m["allreduce_bytes"] / 2, m
        assert m["net"]["rx_bytes"] >= m["allreduce_bytes"] / 2, m
    seconds = max(m["allreduce_seconds"] for m in members)
    print(
        f"allreduce of {members[0]['allreduce_bytes'] / 1e6:.1f} MB over 4 nodes: {seconds:.3f} s"
    )


def test_keyed_channel_on_a_third_node(scenario: dict[str, Any]) -> None:
    channel = _part(scenario, "channel")
    count = channel["count"]
    assert channel["got"]["ok"] == {"from_node1": [True] * count, "from_node3": [True] * count}
    assert [p["put"] for p in channel["put"]] == [count, count]
    per_producer = (count + 2) // 3 * ITEM_TENSOR
    net = channel["net"]  # by node rank
    assert net[1]["tx_bytes"] >= per_producer, net
    assert net[3]["tx_bytes"] >= per_producer, net
    # The items went through the channel's node (2) to the consumer's (0).
    assert net[2]["rx_bytes"] >= 2 * per_producer, net
    assert net[2]["tx_bytes"] >= 2 * per_producer, net
    assert net[0]["rx_bytes"] >= 2 * per_producer, net
