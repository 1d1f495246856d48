"""GPU workers: default placement, visible devices and LOCAL_RANK (skipped without CUDA)."""

from __future__ import annotations

import os

import pytest
import torch

from p2p_worker import Cluster, PackedPlacementStrategy, Worker

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.ray,
    pytest.mark.timeout(300),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class GpuWorker(Worker):
    def device_view(self) -> tuple[str, int, int | None, list[int], str]:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        info = self.worker_info
        return (
            os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            torch.cuda.current_device(),
            info.gpu_id,
            info.available_gpus,
            os.environ["LOCAL_RANK"],
        )

    def initialize(self) -> list[float]:
        # Seed 004's first example as written: NCCL over every GPU of the cluster.
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend="nccl")
        test_tensor = torch.ones(size=(1, 1), dtype=torch.float32, device="cuda")
        torch.distributed.all_reduce(test_tensor)
        return test_tensor.cpu().flatten().tolist()


def test_default_placement_one_worker_per_gpu(cluster: Cluster) -> None:
    assert cluster.num_gpus >= 1
    group = GpuWorker.create_group().launch(cluster=cluster, name="gpu_group")
    assert group.world_size == cluster.num_gpus
    views = group.device_view().wait(timeout=120)
    for rank, (visible, device, gpu_id, available, local_rank) in enumerate(views):
        assert gpu_id is not None
        assert available == [int(g) for g in visible.split(",")]
        assert device == int(local_rank) == available.index(gpu_id)
        assert group.worker_infos[rank].gpu_id == gpu_id
    assert len({v[2] for v in views}) == cluster.num_gpus  # one GPU each
    assert group.initialize().wait(timeout=300)[0] == [float(cluster.num_gpus)]


def test_fractional_gpus_share_a_device(cluster: Cluster) -> None:
    half = PackedPlacementStrategy(2, gpus_per_worker=0.5, cpus_per_worker=0)
    group = GpuWorker.create_group().launch(cluster, half, name="half_gpu")
    views = group.device_view().wait(timeout=120)
    assert all(v[2] is not None for v in views)
