"""Plain torch.distributed inside workers: the environment is set before __init__ runs.

Runs on its own: ``python docs/examples/workers_torch_distributed.py``. This is seed
004's first example on CPU: each worker joins a gloo process group of its worker group
with ``init_process_group`` (which reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE)
and all-reduces a tensor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from p2p_worker import Cluster, PackedPlacementStrategy, Worker


class MyWorker(Worker):
    def initialize(self) -> list[float]:
        if not dist.is_initialized():
            dist.init_process_group(backend="gloo")  # env:// from the variables set for us
        test_tensor = torch.ones(1, 1)
        dist.all_reduce(test_tensor)
        return test_tensor.flatten().tolist()

    def hello(self) -> int:
        return self._rank


def main() -> None:
    cluster = Cluster(num_nodes=1)
    placement = PackedPlacementStrategy(4, cpus_per_worker=0)
    group = MyWorker.create_group().launch(
        cluster, placement_strategy=placement, name="my_worker_group"
    )
    assert group.initialize().wait()[0] == [4.0]  # the sum over the four workers
    # Only ranks 0 and 3 run the next call.
    assert group.execute_on(0, 3).hello().wait() == [0, 3]
    print("workers_torch_distributed: ok")


if __name__ == "__main__":
    main()
