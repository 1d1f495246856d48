"""p2p-worker and p2p-collective on two Ray nodes joined by a veth link.

Workers on different nodes talk over the node addresses (10.231.0.1 <-> 10.231.0.2): the
test checks the worker's established TCP connections and the veth byte counters.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.timeout(420),
]


def test_placement_puts_one_group_on_each_node(netns_cluster: Any, drive: Any) -> None:
    res = drive("p2p_driver.py", "placement")
    (a,), (b,) = res["a"], res["b"]
    assert a["node_ip"] == netns_cluster.head.ip
    assert b["node_ip"] == netns_cluster.worker.ip
    assert a["node_id"] != b["node_id"]
    assert a["ray_node_id"] != b["ray_node_id"]
    ray_ids = {n["ip"]: n["node_id"] for n in netns_cluster.nodes}
    assert a["ray_node_id"] == ray_ids[a["node_ip"]]
    assert b["ray_node_id"] == ray_ids[b["node_ip"]]
    assert sorted(n["ip"] for n in res["nodes"]) == sorted(ray_ids)


def test_every_payload_kind_crosses_the_link_both_ways(netns_cluster: Any, drive: Any) -> None:
    before = {r: netns_cluster.link_stats(r) for r in ("head", "worker")}
    res = drive("p2p_driver.py", "payloads")
    after = {r: netns_cluster.link_stats(r) for r in ("head", "worker")}
    head_ip, worker_ip = netns_cluster.head.ip, netns_cluster.worker.ip
    for direction, receiver_peer in (("mn_a->mn_b", head_ip), ("mn_b->mn_a", worker_ip)):
        got = res[direction]["received"]
        assert all(got["ok"].values()), (direction, got["ok"])
        assert set(res[direction]["sent"]) <= set(got["ok"])
        # The receiver holds TCP connections to the sender's node address (gloo), and
        # none of the transfer could have gone over loopback between namespaces.
        assert receiver_peer in got["tcp_peers"], got["tcp_peers"]
    assert res["ping_pong"] == [[True], [True]]
    big = 16 * 1024**2
    for role in ("head", "worker"):
        assert after[role]["tx_bytes"] - before[role]["tx_bytes"] >= big


def test_channels_across_nodes(netns_cluster: Any, drive: Any) -> None:
    before = {r: netns_cluster.link_stats(r)["tx_bytes"] for r in ("head", "worker")}
    res = drive("p2p_driver.py", "channels")
    sent = {r: netns_cluster.link_stats(r)["tx_bytes"] - before[r] for r in before}
    for name in ("mn_to1", "mn_to0"):
        assert res[name]["put"] == 12
        assert res[name]["got"]["ok"] == [True] * 12
    assert res["mn_drv"]["got"]["ok"] == [True] * 6  # used from the driver
    # Four 8 MiB tensors per channel went from the producer's node to the channel's node.
    assert min(sent.values()) >= 4 * 8 * 1024**2, sent


def test_group_calls_across_nodes(netns_cluster: Any, drive: Any) -> None:
    res = drive("p2p_driver.py", "group-calls")
    assert [w["rank"] for w in res["all"]] == [0, 1]
    assert [w["node_ip"] for w in res["all"]] == [netns_cluster.head.ip, netns_cluster.worker.ip]
    assert {"work", "inner"} <= set(res["durations"])
    assert [w["rank"] for w in res["only_1"]] == [1]
    assert res["error"] is not None
    assert "boom on rank 1" in res["error"]["message"]
    assert res["after_error"] == [0, 1]
