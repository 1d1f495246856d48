"""A worker group on an embedded local Ray cluster: group calls, ranks, timers.

Runs on its own: ``python docs/examples/workers_quickstart.py``. With no Ray cluster
running (and no ``RAY_ADDRESS``), ``Cluster`` starts an embedded one bound to loopback.
"""

from __future__ import annotations

import os
import time
from typing import Any

from p2p_worker import Cluster, PackedPlacementStrategy, Worker


class Trainer(Worker):
    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale

    def describe(self) -> dict[str, Any]:
        info = self.worker_info  # a WorkerInfo
        return {
            "rank": self._rank,
            "world_size": self._world_size,
            "env_rank": int(os.environ["RANK"]),  # set before __init__ ran
            "address": info.address.get_name(),
            "child": info.address.get_child_address(0).get_name(),
            "node_ip": info.node_ip,
        }

    @Worker.timer("step")
    def step(self, x: int) -> int:
        with self.worker_timer("compute"):  # nested tags are reported too
            time.sleep(0.01)
            return x * self.scale + self._rank


def main() -> None:
    cluster = Cluster(num_nodes=1)
    # Two CPU-only workers; cpus_per_worker=0 reserves no CPU, so they fit a small
    # machine. `10` goes to every worker's __init__.
    placement = PackedPlacementStrategy(2, cpus_per_worker=0)
    trainers = Trainer.create_group(10).launch(
        cluster, placement_strategy=placement, name="trainer"
    )

    # A method called on the group runs on every worker in parallel; wait() returns
    # the per-rank results as a list.
    infos = trainers.describe().wait()
    assert [i["rank"] for i in infos] == [0, 1]
    assert [i["env_rank"] for i in infos] == [0, 1]
    assert [i["address"] for i in infos] == ["trainer:0", "trainer:1"]
    assert [i["child"] for i in infos] == ["trainer:0:0", "trainer:1:0"]
    assert infos[0]["node_ip"] == "127.0.0.1"  # the embedded cluster is on loopback
    assert all(i["world_size"] == 2 for i in infos)

    handle = trainers.step(4)
    assert handle.wait() == [40, 41]
    durations = handle.consume_durations()  # tag -> seconds, max over the ranks
    assert {"step", "compute"} <= set(durations)
    assert durations["step"] >= durations["compute"] > 0

    # execute_on restricts the next call to some ranks.
    assert trainers.execute_on(1).step(1).wait() == [11]
    print("workers_quickstart: ok")


if __name__ == "__main__":
    main()
