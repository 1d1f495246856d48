"""Ray's multi-GPU calls (signatures kept) and ``synchronize``.

The ``*_multigpu`` calls move tensors on several GPUs of one process over NCCL. The
NCCL transport of N-member groups does not exist yet, so each raises
:class:`BackendUnavailableError` naming what is missing, before touching anything.
Until then run one actor per GPU and use the single-tensor calls.
"""

from __future__ import annotations

import torch

from p2p_worker._raycoll._checks import Tensor
from p2p_worker._raycoll._errors import BackendUnavailableError, RayCollectiveError
from p2p_worker._raycoll._types import ReduceOp, ReduceOpLike


def _missing(call: str) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"{call}: multi-GPU collectives need the NCCL (accelerator) transport of N-member"
        " groups, which this version does not provide; run one actor per GPU and use the"
        " single-tensor calls (CPU tensors on the gloo backend)"
    )


def allreduce_multigpu(
    tensor_list: list[Tensor], group_name: str = "default", op: ReduceOpLike = ReduceOp.SUM
) -> None:
    """Ray's multi-GPU allreduce: not available (see the module doc).

    Raises:
        BackendUnavailableError: Always.
    """
    raise _missing("allreduce_multigpu")


def reduce_multigpu(
    tensor_list: list[Tensor],
    dst_rank: int = 0,
    dst_tensor: int = 0,
    group_name: str = "default",
    op: ReduceOpLike = ReduceOp.SUM,
) -> None:
    """Ray's multi-GPU reduce: not available (see the module doc).

    Raises:
        BackendUnavailableError: Always.
    """
    raise _missing("reduce_multigpu")


def broadcast_multigpu(
    tensor_list: list[Tensor], src_rank: int = 0, src_tensor: int = 0, group_name: str = "default"
) -> None:
    """Ray's multi-GPU broadcast: not available (see the module doc).

    Raises:
        BackendUnavailableError: Always.
    """
    raise _missing("broadcast_multigpu")


def allgather_multigpu(
    output_tensor_lists: list[list[Tensor]],
    input_tensor_list: list[Tensor],
    group_name: str = "default",
) -> None:
    """Ray's multi-GPU allgather: not available (see the module doc).

    Raises:
        BackendUnavailableError: Always.
    """
    raise _missing("allgather_multigpu")


def reducescatter_multigpu(
    output_tensor_list: list[Tensor],
    input_tensor_lists: list[list[Tensor]],
    group_name: str = "default",
    op: ReduceOpLike = ReduceOp.SUM,
) -> None:
    """Ray's multi-GPU reduce-scatter: not available (see the module doc).

    Raises:
        BackendUnavailableError: Always.
    """
    raise _missing("reducescatter_multigpu")


def send_multigpu(
    tensor: Tensor,
    dst_rank: int,
    dst_gpu_index: int,
    group_name: str = "default",
    n_elements: int = 0,
) -> None:
    """Ray's GPU-to-GPU send: not available (see the module doc).

    Raises:
        BackendUnavailableError: Always.
    """
    raise _missing("send_multigpu")


def recv_multigpu(
    tensor: Tensor,
    src_rank: int,
    src_gpu_index: int,
    group_name: str = "default",
    n_elements: int = 0,
) -> None:
    """Ray's GPU-to-GPU receive: not available (see the module doc).

    Raises:
        BackendUnavailableError: Always.
    """
    raise _missing("recv_multigpu")


def synchronize(gpu_id: int) -> None:
    """Wait until all work queued on CUDA device ``gpu_id`` has finished.

    Args:
        gpu_id: Index of the CUDA device.

    Raises:
        RayCollectiveError: No CUDA device is available (a ``RuntimeError``, as in Ray).
        ValueError: ``gpu_id`` is not a device index of this process.

    Example:
        >>> synchronize(0)  # doctest: +SKIP
    """
    if not torch.cuda.is_available():
        raise RayCollectiveError(f"synchronize({gpu_id!r}): no CUDA device in this process")
    count = torch.cuda.device_count()
    if isinstance(gpu_id, bool) or not isinstance(gpu_id, int) or not 0 <= gpu_id < count:
        raise ValueError(f"gpu_id: got {gpu_id!r}; allowed: 0..{count - 1}")
    torch.cuda.synchronize(gpu_id)
