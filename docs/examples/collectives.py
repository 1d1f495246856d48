"""Collectives over workers of two groups, and the ray.util.collective-style layer.

Runs on its own: ``python docs/examples/collectives.py``. A trainer group of one worker
broadcasts its weights to a rollout group of two; all three sum a tensor; then the
rollout workers use ``p2p_worker.compat`` the way Ray's collective library is used.
"""

from __future__ import annotations

import numpy as np
import torch

import p2p_worker.compat as col
from p2p_worker import Cluster, NodePlacementStrategy, Worker

MEMBERS = ["trainer", "rollout"]  # every worker of both groups


class Trainer(Worker):
    def sync(self) -> float:
        weights = {"w": torch.arange(4.0), "b": torch.ones(2)}
        self.broadcast(weights, MEMBERS, src_group_name="trainer", src_rank=0)
        group = self.create_collective(MEMBERS)
        total = torch.tensor([10.0])
        group.allreduce(total, op="sum")  # 10 + 1 + 2
        return float(total.item())


class Rollout(Worker):
    def sync(self) -> float:
        weights = self.broadcast(None, MEMBERS, src_group_name="trainer", src_rank=0)
        assert torch.equal(weights["w"], torch.arange(4.0))
        group = self.create_collective(MEMBERS)
        total = np.array([self._rank + 1.0], dtype=np.float32)  # reduced in place
        work = group.allreduce(total, op="sum", async_op=True)
        work.wait()
        return float(total[0])

    def ray_style(self) -> list[float]:
        col.init_collective_group(self._world_size, self._rank, "gloo", "rollouts")
        buf = torch.full((2,), float(self._rank + 1))
        col.allreduce(buf, "rollouts", op=col.ReduceOp.MAX)
        gathered = [torch.zeros(2) for _ in range(self._world_size)]
        col.allgather(gathered, buf, "rollouts")
        col.barrier("rollouts")
        col.destroy_collective_group("rollouts")
        return [float(t[0]) for t in gathered]


def main() -> None:
    cluster = Cluster(num_nodes=1)
    one = NodePlacementStrategy([0], cpus_per_worker=0)
    two = NodePlacementStrategy([0, 0], cpus_per_worker=0)
    trainer = Trainer.create_group().launch(cluster, placement_strategy=one, name="trainer")
    rollout = Rollout.create_group().launch(cluster, placement_strategy=two, name="rollout")

    # Every member takes part at the same time: start one group, then wait on both.
    training = trainer.sync()
    assert rollout.sync().wait() == [13.0, 13.0]
    assert training.wait() == [13.0]
    assert rollout.ray_style().wait() == [[2.0, 2.0]] * 2
    cluster.shutdown()
    print("collectives: ok")


if __name__ == "__main__":
    main()
