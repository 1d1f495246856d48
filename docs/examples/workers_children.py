"""A worker launches child workers; children, parent and another group talk by address.

Runs on its own: ``python docs/examples/workers_children.py``. Rank 0 of ``trainer``
launches two children, ``trainer:0:0`` and ``trainer:0:1``; each child greets its parent,
which answers, and sends a tensor to the worker of another root group, ``logger``.
"""

from __future__ import annotations

import torch

from p2p_worker import Cluster, NodePlacementStrategy, Worker, WorkerGroup


class Helper(Worker):
    def work(self) -> str:
        parent = self.worker_address.get_parent_address()  # trainer:0, a live worker
        assert parent is not None
        # A rank path from the root group reaches any worker: ("trainer", (0,)).
        self.send(f"ready: {self.worker_address}", parent.root_group_name, parent.ranks)
        task = self.recv(parent.root_group_name, parent.ranks)
        # Any other worker of the job, by group name and rank.
        self.send(torch.full((2,), float(task)), "logger", 0)
        return f"{self.worker_address} did task {task}"


class Trainer(Worker):
    def run(self) -> list[str]:
        helpers: WorkerGroup[Helper] = Helper.create_group().launch_children(
            NodePlacementStrategy([0, 0])
        )
        # The child group's name is this worker's address: send/recv take it as a group.
        assert helpers.name == self.worker_address.get_name() == "trainer:0"
        done = helpers.work()  # runs on both children while this worker talks to them
        for rank in range(helpers.world_size):
            assert self.recv(helpers.name, rank) == f"ready: trainer:0:{rank}"
            self.send(10 + rank, helpers.name, rank)
        return list(done.wait(timeout=120))


class Logger(Worker):
    def collect(self) -> float:
        # Children are addressed like any worker: the root group and the rank path.
        return sum(float(self.recv("trainer", (0, r)).sum()) for r in range(2))


def main() -> None:
    with Cluster(num_nodes=1) as cluster:
        trainer = Trainer.create_group().launch(cluster, NodePlacementStrategy([0]), "trainer")
        logger = Logger.create_group().launch(cluster, NodePlacementStrategy([0]), "logger")
        collected = logger.collect()
        print(trainer.run().wait(timeout=180)[0])
        assert collected.wait(timeout=120) == [2 * 10.0 + 2 * 11.0]
        trainer.shutdown()  # shuts the children down first
    print("workers_children: ok")


if __name__ == "__main__":
    main()
