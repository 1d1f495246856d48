"""The harness itself, with plain Ray: two nodes, one actor per node, data over the veth link."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]


def test_two_nodes_with_their_own_addresses(netns_cluster: Any) -> None:
    ips = sorted(str(n["ip"]) for n in netns_cluster.nodes)
    assert ips == [netns_cluster.head.ip, netns_cluster.worker.ip]
    assert len({n["node_id"] for n in netns_cluster.nodes}) == 2


def test_one_actor_per_node_and_a_tensor_crosses_the_link(netns_cluster: Any, drive: Any) -> None:
    before = netns_cluster.link_stats("worker")
    res = drive("ray_driver.py", "placement")
    after = netns_cluster.link_stats("worker")
    head, other = res["actors"]
    assert head["ip"] == netns_cluster.head.ip
    assert other["ip"] == netns_cluster.worker.ip
    assert head["node_id"] != other["node_id"]
    assert res["driver_node_id"] == head["node_id"]  # the driver runs on the head node
    assert res["checksum_ok"]
    # The 32 MiB object was made on the worker node and pulled to the head over the veth.
    assert after["tx_bytes"] - before["tx_bytes"] >= res["nbytes"]


def test_gloo_over_the_link_follows_the_shaped_rate(netns_cluster: Any, drive: Any) -> None:
    rate = netns_cluster.shape("200mbit")
    try:
        sent_before = netns_cluster.link_stats("head")["tx_bytes"]
        res = drive("ray_driver.py", "gloo", str(8 * 1024**2), "4")
        sent = netns_cluster.link_stats("head")["tx_bytes"] - sent_before
        qdisc = netns_cluster.qdisc_stats("head")
    finally:
        netns_cluster.unshape()
    assert "tbf" in qdisc
    assert sent >= res["nbytes"]
    ratio = res["bytes_per_s"] * 8 / rate
    got = res["bytes_per_s"] * 8 / 1e6
    print(f"gloo over tbf {rate / 1e6:.0f} Mbit/s: {got:.1f} Mbit/s ({ratio:.2f}x)")
    # An upper bound only: the token bucket must hold the sender back (a slow, shared
    # machine may stay below the rate, never above it by more than the bucket allows).
    assert ratio <= 1.15


def test_p2p_collective_alone_crosses_the_link(netns_cluster: Any, drive: Any) -> None:
    before = netns_cluster.link_stats("head")["tx_bytes"]
    res = drive("ray_driver.py", "collective")
    sent = netns_cluster.link_stats("head")["tx_bytes"] - before
    ips = [netns_cluster.head.ip, netns_cluster.worker.ip]
    for rank, peer in enumerate(res["peers"]):
        assert peer["host"] == ips[rank]
        assert all(peer["ok"].values()), peer["ok"]
        assert ips[1 - rank] in peer["tcp_peers"], peer["tcp_peers"]
    assert sent >= 16 * 1024**2  # the large tensor went over the veth, not loopback
