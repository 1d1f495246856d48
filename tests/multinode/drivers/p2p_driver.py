"""p2p driver for the netns cluster: runs inside the head namespace, prints JSON.

Usage: python p2p_driver.py placement | payloads | channels | group-calls | pending-recv

``Cluster(num_nodes=2)`` attaches to the cluster named by ``RAY_ADDRESS``. Group ``mn_a``
runs on node 0 (the head, where the driver is) and ``mn_b`` on node 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from mn_workers import Peer, channel_items

from p2p_worker import Cluster, NodePlacementStrategy, create_channel

RESULT_PREFIX = "P2PMN-RESULT "
EVENT_PREFIX = "P2PMN-EVENT "
A, B = "mn_a", "mn_b"


def emit(obj: Any) -> None:
    print(RESULT_PREFIX + json.dumps(obj), flush=True)


def event(name: str) -> None:
    print(EVENT_PREFIX + name, flush=True)


def on_node(cluster: Any, node_rank: int, name: str) -> Any:
    strategy = NodePlacementStrategy([node_rank], cpus_per_worker=0)
    return Peer.create_group().launch(cluster, placement_strategy=strategy, name=name)


def two_groups(cluster: Any) -> tuple[Any, Any]:
    return on_node(cluster, 0, A), on_node(cluster, 1, B)


def cmd_placement(cluster: Any) -> dict[str, Any]:
    a, b = two_groups(cluster)
    nodes = [
        {"node_rank": n.node_rank, "ip": n.ip, "ray_node_id": n.ray_node_id} for n in cluster.nodes
    ]
    return {"nodes": nodes, "a": a.where().wait(), "b": b.where().wait()}


def cmd_payloads(cluster: Any) -> dict[str, Any]:
    a, b = two_groups(cluster)
    where = {"a": a.where().wait()[0], "b": b.where().wait()[0]}
    out: dict[str, Any] = {"where": where}
    # a -> b, then b -> a: both directions of the link, both directions of the group.
    for src, dst, sname, dname, seed in ((a, b, A, B, 1), (b, a, B, A, 2)):
        send = src.send_all(dname, 0, seed)
        recv = dst.recv_all(sname, 0, seed)
        out[f"{sname}->{dname}"] = {"sent": send.wait()[0], "received": recv.wait()[0]}
    # Rank 0 (node 0) and rank 1 (node 1) of one group spanning both nodes talk too.
    strategy = NodePlacementStrategy([0, 1], cpus_per_worker=0)
    group = Peer.create_group().launch(cluster, placement_strategy=strategy, name="mn_ab")
    ping, pong = group.execute_on(0).ping("mn_ab", 1), group.execute_on(1).pong("mn_ab", 0)
    out["ping_pong"] = [ping.wait(), pong.wait()]
    return out


def cmd_channels(cluster: Any) -> dict[str, Any]:
    a, b = two_groups(cluster)
    out = {}
    # The channel lives on the other node than its producer: items cross the link.
    for prod, cons, name, node, seed in ((a, b, "mn_to1", 1, 3), (b, a, "mn_to0", 0, 4)):
        put = prod.channel_put(name, node, seed, 12)
        got = cons.channel_get(name, seed, 12)
        out[name] = {"put": put.wait()[0], "got": got.wait()[0]}
    # From the driver (node 0) through a channel on node 1 to the worker on node 0.
    channel = create_channel(cluster, "mn_drv", node_id=1, maxsize=2)
    got = a.channel_get("mn_drv", 5, 6)
    for item in channel_items(5, 6):
        channel.put(item, timeout=120)
    out["mn_drv"] = {"put": 6, "got": got.wait()[0]}
    return out


def cmd_group_calls(cluster: Any) -> dict[str, Any]:
    strategy = NodePlacementStrategy([0, 1], cpus_per_worker=0)
    group = Peer.create_group().launch(cluster, placement_strategy=strategy, name="mn_ab")
    out: dict[str, Any] = {}
    handle = group.work()
    out["all"] = handle.wait()
    out["durations"] = handle.consume_durations()
    out["only_1"] = group.execute_on(1).work().wait()
    try:
        group.work(fail_rank=1).wait()
        out["error"] = None
    except Exception as exc:
        out["error"] = {"type": type(exc).__name__, "message": str(exc)[:2000]}
    out["after_error"] = [w["rank"] for w in group.work().wait()]
    return out


def cmd_pending_recv(cluster: Any) -> dict[str, Any]:
    a, b = two_groups(cluster)
    # One round trip first, so the groups and their gloo connections exist.
    ping, pong = a.ping(B, 0), b.pong(A, 0)
    warm = [ping.wait()[0], pong.wait()[0]]
    a.post_recv(B, 0).wait()
    time.sleep(0.5)
    event("posted")
    res: dict[str, Any] = a.wait_pending(60.0).wait()[0]
    res["warm"] = warm
    res["send_after"] = a.send_after_peer_death(B, 0, 30.0).wait()[0]
    return res


COMMANDS = {
    "placement": cmd_placement,
    "payloads": cmd_payloads,
    "channels": cmd_channels,
    "group-calls": cmd_group_calls,
    "pending-recv": cmd_pending_recv,
}


def main() -> None:
    cmd = COMMANDS[sys.argv[1]]
    config = json.loads(os.environ.get("P2PMN_CONFIG", "null"))
    cluster = Cluster(num_nodes=2, config=config)
    result = cmd(cluster)
    emit(result)
    if sys.argv[1] == "pending-recv":
        sys.stdout.flush()
        os._exit(0)  # a node is gone: do not wait for Ray to notice while shutting down
    cluster.shutdown(timeout=60)


if __name__ == "__main__":
    main()
