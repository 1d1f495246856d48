"""The GPU job's own checks: a CUDA build of torch, and tensors that live on the GPU.

Skipped, with the reason, where torch sees no CUDA GPU; ``nox -s
"integration(device='cuda')"`` skips before collecting them there, or fails when
``P2P_REQUIRE_GPU=1``. Today p2p moves CPU tensors (NCCL and CUDA IPC are planned): a GPU
tensor travels through p2p-compress as its CPU copy and must come back bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed

from p2p_compress import compress_tensors

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(120),
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU visible to torch"),
]


def test_torch_is_a_cuda_build_with_nccl() -> None:
    assert torch.version.cuda is not None, f"torch {torch.__version__} is a CPU build"
    assert torch.distributed.is_nccl_available()
    assert torch.cuda.device_count() >= 1
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    assert float(x.sum().item()) == float(sum(range(1 << 20)))


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bfloat16, torch.float16, torch.bool])
def test_gpu_tensors_round_trip_through_the_codecs(codec: str, dtype: torch.dtype) -> None:
    gen = torch.Generator(device="cuda").manual_seed(7)
    source = torch.randint(0, 64, (1 << 18,), device="cuda", generator=gen).to(dtype)
    with compress_tensors({"x": source.cpu()}, codec) as packed:
        restored = packed.decompress()["x"]
    assert restored.dtype == dtype
    back = restored.to("cuda")
    assert torch.equal(back.view(torch.uint8), source.view(torch.uint8))
