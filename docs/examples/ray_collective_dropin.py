"""Code written for ``ray.util.collective`` on p2p: only the import lines differ.

Runs on its own: ``python docs/examples/ray_collective_dropin.py``. Plain ``@ray.remote``
actors after a plain ``ray.init()`` (no p2p ``Cluster``): a group initialized in each
member, a group declared from the driver, an in-place allreduce of torch tensors and of
numpy arrays, and send/recv between two members (over shared memory on one node).
"""

from __future__ import annotations

import os

import numpy as np
import ray
import torch

import p2p_worker.compat as col  # was: import ray.util.collective as col
from p2p_worker.compat.types import ReduceOp  # was: from ray.util.collective.types import ...

WORLD = 2


@ray.remote(num_cpus=0)
class Member:
    def setup(self, world_size: int, rank: int) -> None:
        col.init_collective_group(world_size, rank, backend="gloo", group_name="grads")

    def step(self, rank: int) -> list[float]:
        grad = torch.full((1024,), float(rank + 1))
        col.allreduce(grad, group_name="grads")  # in place: the sum over members
        peak = np.array([rank * 10.0], dtype=np.float32)
        col.allreduce(peak, group_name="grads", op=ReduceOp.MAX)  # numpy, in place too
        return [grad[0].item(), float(peak[0])]

    def exchange(self, rank: int) -> float:
        # the group "pairs" was declared by the driver; the members just use it
        if rank == 0:
            col.send(torch.arange(4.0), dst_rank=1, group_name="pairs")
            return 0.0
        got = torch.zeros(4)
        col.recv(got, src_rank=0, group_name="pairs")
        return float(got.sum().item())


def main() -> None:
    # A plain ray.init() works; this example binds the local cluster to loopback, as the
    # project's tests do on one machine.
    tmp = os.environ.get("P2P_RAY_TMPDIR", "/tmp/p2pray")
    os.makedirs(tmp, exist_ok=True)
    ray.init(address="local", _node_ip_address="127.0.0.1", _temp_dir=tmp, include_dashboard=False)
    try:
        members = [Member.remote() for _ in range(WORLD)]
        ray.get([m.setup.remote(WORLD, rank) for rank, m in enumerate(members)])
        assert ray.get([m.step.remote(r) for r, m in enumerate(members)]) == [[3.0, 10.0]] * 2

        col.create_collective_group(members, WORLD, [0, 1], backend="gloo", group_name="pairs")
        assert ray.get([m.exchange.remote(r) for r, m in enumerate(members)]) == [0.0, 6.0]
        print("ray_collective_dropin: ok")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
