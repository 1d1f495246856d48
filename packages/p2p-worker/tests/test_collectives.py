"""Worker-level collectives and the ray.util.collective-style layer, on a real local Ray."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import p2p_worker.compat as col
from p2p_worker import Cluster, PackedPlacementStrategy, Worker

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]


class CollWorker(Worker):
    def mixed(self) -> dict[str, Any]:
        g = self.create_collective(["coll_a", "coll_b"], timeout=60)
        x = torch.full((3,), float(g.rank + 1))
        g.allreduce(x, op="sum", timeout=60)
        obj = (
            {"w": torch.arange(4.0), "tag": "v1"}
            if str(self.worker_address) == "coll_b:1"
            else None
        )
        got = self.broadcast(
            obj, members=["coll_a", "coll_b"], src_group_name="coll_b", src_rank=1, timeout=60
        )
        gathered = g.allgather(np.array([g.rank], dtype=np.int64), timeout=60)
        return {
            "rank": g.rank,
            "size": g.world_size,
            "allreduce": x.tolist(),
            "bcast": (got["w"].tolist(), got["tag"]),
            "allgather": [int(a[0]) for a in gathered],
            "transport": g.collectives_transport,
        }

    def ray_style(self, world_size: int) -> dict[str, Any]:
        rank = self._rank
        col.init_collective_group(world_size, rank, "gloo", "default")
        buf = np.full(4, rank + 1, dtype=np.float32)
        col.allreduce(buf, "default")
        mx = torch.tensor([float(rank)])
        col.allreduce(mx, "default", op=col.ReduceOp.MAX)
        b = torch.full((2,), float(rank))
        col.broadcast(b, src_rank=2, group_name="default")
        lst = [torch.zeros(1) for _ in range(world_size)]
        col.allgather(lst, torch.tensor([rank * 10.0]), "default")
        red = torch.tensor([1.0])
        col.reduce(red, dst_rank=0, group_name="default")
        out = torch.zeros(1)
        col.reduce_scatter(out, [torch.tensor([float(i)]) for i in range(world_size)], "default")
        col.barrier("default")
        t = torch.zeros(2)
        if rank == 0:
            col.send(torch.tensor([7.0, 8.0]), 1, "default")
        elif rank == 1:
            col.recv(t, 0, "default")
        info = (col.get_rank("default"), col.get_collective_group_size("default"))
        col.barrier("default")  # a member that destroys its group is "gone" for the others
        col.destroy_collective_group("default")
        return {
            "sum": buf.tolist(),
            "max": mx.item(),
            "bcast": b.tolist(),
            "gather": [v.item() for v in lst],
            "reduce": red.item(),
            "rs": out.item(),
            "recv": t.tolist(),
            "info": info,
            "after": col.is_group_initialized("default"),
        }


def test_collectives_over_two_worker_groups(cluster: Cluster) -> None:
    a = CollWorker.create_group().launch(
        cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="coll_a"
    )
    b = CollWorker.create_group().launch(
        cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="coll_b"
    )
    ha, hb = a.mixed(), b.mixed()
    outs = ha.wait() + hb.wait()
    assert sorted(o["rank"] for o in outs) == [0, 1, 2, 3]
    for o in outs:
        assert o["size"] == 4
        assert o["allreduce"] == [10.0] * 3
        assert o["bcast"] == ([0.0, 1.0, 2.0, 3.0], "v1")
        assert o["allgather"] == [0, 1, 2, 3]
        assert o["transport"] == "shm"  # four workers on one node: the ring of pairs


def test_ray_style_compat_layer(cluster: Cluster) -> None:
    n = 4
    g = CollWorker.create_group().launch(
        cluster, PackedPlacementStrategy(n, cpus_per_worker=0), name="raystyle"
    )
    outs = g.ray_style(n).wait()
    for rank, o in enumerate(outs):
        assert o["sum"] == [10.0] * 4
        assert o["max"] == 3.0
        assert o["bcast"] == [2.0, 2.0]
        assert o["gather"] == [0.0, 10.0, 20.0, 30.0]
        assert o["reduce"] == (4.0 if rank == 0 else 1.0)
        assert o["rs"] == float(rank * n)
        assert o["recv"] == ([7.0, 8.0] if rank == 1 else [0.0, 0.0])
        assert o["info"] == (rank, n)
        assert o["after"] is False


def test_compat_errors_outside_a_worker() -> None:
    from p2p_worker import WorkerError

    with pytest.raises(ValueError, match="backend"):
        col.init_collective_group(2, 0, backend="nccl")
    with pytest.raises(WorkerError, match="not initialized"):
        col.allreduce(torch.ones(1), "nope")
    with pytest.raises(RuntimeError, match="not initialized"):  # as ray.util.collective
        col.allreduce(torch.ones(1), "nope")
    assert col.get_rank("nope") == -1
