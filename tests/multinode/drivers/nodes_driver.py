"""Four-node driver: a trainer on node 0, one rollout worker on each of nodes 1..3.

Usage: python nodes_driver.py NBYTES [weights] [collectives] [channel]

Runs the named parts (default all) with the same two groups and prints one
``P2PMN-RESULT <json>``: per part either its results or ``{"error": ...}``, so one
part failing does not hide what the others did. Node ranks are ``Cluster``'s: the
driver's node (the head) first, then by address, so node rank ``i`` is ``10.231.0.<i+1>``.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from mn_nodes import NodePeer, net_counters

from p2p_worker import Cluster, NodePlacementStrategy, create_channel

RESULT_PREFIX = "P2PMN-RESULT "
TRAINER, ROLLOUT = "mn4_trainer", "mn4_rollout"
CHANNEL = "mn4_rollouts"
VERSIONS = 4
CHANNEL_ITEMS = 9  # per producer; every third one an 8 MiB tensor


def part_weights(trainer: Any, rollout: Any, nbytes: int) -> dict[str, Any]:
    trainer.init_model(nbytes, 7, True).wait()
    sizes = rollout.init_model(nbytes, 7, False).wait()
    pushes, pulls = [], []
    for version in range(1, VERSIONS + 1):
        pulling = rollout.pull(TRAINER)  # every rank, asynchronously
        pushes.append(trainer.push(version, ROLLOUT).wait()[0])
        pulls.append(pulling.wait())
    out = {"model_bytes": sizes[0], "pushes": pushes, "pulls": pulls}
    # The last version once more, each way: timed here, the same way for every method.
    methods: dict[str, Callable[[], list[str]]] = {
        "p2p-push": lambda: last(rollout.pull(TRAINER), trainer.push(VERSIONS + 1, ROLLOUT)),
        "ray-object-store": lambda: rollout.get_state(trainer.put_state().wait()[0]).wait(),
        "three-sends": lambda: last(rollout.recv_state(TRAINER), trainer.send_state(ROLLOUT, 3)),
    }
    out["methods"] = {}
    for name, run in methods.items():
        before = node_counters(trainer, rollout)
        start = time.perf_counter()
        held = run()
        seconds = time.perf_counter() - start
        after = node_counters(trainer, rollout)
        net = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
        out["methods"][name] = {"seconds": seconds, "held": held, "net": net}
    out["methods_digest"] = trainer.state_digest().wait()[0]
    return out


def last(receiving: Any, sending: Any) -> list[str]:
    """Wait for the sender, then return each receiver's digest."""
    sending.wait()
    return [r if isinstance(r, str) else r["digest"] for r in receiving.wait()]


def part_collectives(trainer: Any, rollout: Any) -> dict[str, Any]:
    members = [TRAINER, ROLLOUT]
    numel = 2 * 1024**2  # float64: 16 MiB per member
    calls = [trainer.collectives(members, numel), rollout.collectives(members, numel)]
    return {"members": [w for call in calls for w in call.wait()]}


def node_counters(trainer: Any, rollout: Any) -> list[dict[str, int]]:
    """Each node's cable counters, by node rank (one worker per node reads its own)."""
    return [*trainer.counters().wait(), *rollout.counters().wait()]


def part_channel(cluster: Any, trainer: Any, rollout: Any) -> dict[str, Any]:
    # The channel lives on node 2; rollouts on nodes 1 and 3 put, the trainer on node 0
    # gets each key's items in order: every item crosses cables between nodes.
    create_channel(cluster, CHANNEL, node_id=2)
    keys = {"from_node1": 0, "from_node3": 2}  # key -> producing rollout rank
    seeds = {key: 40 + rank for key, rank in keys.items()}
    before = node_counters(trainer, rollout)
    puts = [
        rollout.execute_on(rank).put_keyed(CHANNEL, key, seeds[key], CHANNEL_ITEMS)
        for key, rank in keys.items()
    ]
    got = trainer.get_keyed(CHANNEL, seeds, CHANNEL_ITEMS).wait()[0]
    put = [p.wait()[0] for p in puts]
    after = node_counters(trainer, rollout)
    net = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]
    return {"got": got, "put": put, "count": CHANNEL_ITEMS, "net": net}


def main() -> None:
    nbytes = int(sys.argv[1])
    parts = sys.argv[2:] or ["weights", "collectives", "channel"]
    config = json.loads(os.environ.get("P2PMN_CONFIG", "null"))
    start = time.perf_counter()
    cluster = Cluster(num_nodes=int(os.environ["P2PMN_NUM_NODES"]), config=config)
    nodes = [{"node_rank": n.node_rank, "ip": n.ip} for n in cluster.nodes]
    place = NodePlacementStrategy
    trainer = NodePeer.create_group().launch(
        cluster, placement_strategy=place([0], cpus_per_worker=0), name=TRAINER
    )
    rollout = NodePeer.create_group().launch(
        cluster, placement_strategy=place([1, 2, 3], cpus_per_worker=0), name=ROLLOUT
    )
    out: dict[str, Any] = {
        "nodes": nodes,
        "trainer": trainer.where().wait(),
        "rollout": rollout.where().wait(),
        "driver_net": net_counters(),
        "launch_seconds": time.perf_counter() - start,
    }
    runs: dict[str, Callable[[], dict[str, Any]]] = {
        "weights": lambda: part_weights(trainer, rollout, nbytes),
        "collectives": lambda: part_collectives(trainer, rollout),
        "channel": lambda: part_channel(cluster, trainer, rollout),
    }
    for part in parts:
        began = time.perf_counter()
        try:
            out[part] = runs[part]()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"[:3000]
            out[part] = {"error": error, "traceback": traceback.format_exc()[-3000:]}
        out[part]["wall_seconds"] = time.perf_counter() - began
    print(RESULT_PREFIX + json.dumps(out), flush=True)
    cluster.shutdown(timeout=60)


if __name__ == "__main__":
    main()
