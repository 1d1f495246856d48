"""Ring reduce-scatter over a gloo process group's point-to-point messages.

gloo has no usable reduce-scatter on CPU (torch 2.13's hangs, measured), and building
one from an allreduce of every input (what ``ray.util.collective``'s torch-gloo backend
does) or from one reduce per member moves about twice the bytes a reduce-scatter needs.
The ring moves each member's ``(N - 1) / N`` of its input once: in step ``k`` member
``r`` sends its partial sum of block ``r - k - 1`` to member ``r + 1`` and receives
member ``r - 1``'s partial sum of block ``r - k - 2``, to which it adds its own input of
that block. After ``N - 1`` steps the block it received last is block ``r``, reduced
over every member.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Work

    from p2p_collective._links._torch_gloo import GlooGroup, GlooReduceOp

RING_TAG = (1 << 28) + 1
"""gloo tag of the ring's messages (apart from send_tensor's and the collectives')."""

_REDUCE = dist.ReduceOp


_COMBINE: dict[GlooReduceOp, Callable[..., torch.Tensor]] = {
    _REDUCE.SUM: torch.add,
    _REDUCE.PRODUCT: torch.mul,
    _REDUCE.MIN: torch.minimum,
    _REDUCE.MAX: torch.maximum,
}


def ring_reduce_scatter(
    pg: GlooGroup,
    rank: int,
    size: int,
    out: torch.Tensor,
    inputs: Sequence[torch.Tensor],
    op: GlooReduceOp,
    spare: torch.Tensor,
    wait: Callable[[list[Work]], None],
) -> None:
    """Reduce ``inputs[r]`` of every member into ``out`` of member ``r`` (in place).

    Args:
        pg: The gloo process group of the ``size`` members.
        rank: This member's rank.
        size: Number of members (>= 2).
        out: This member's result; contiguous, shaped like every input.
        inputs: ``size`` contiguous tensors (left unchanged).
        op: A ``torch.distributed.ReduceOp`` (sum, product, min or max).
        spare: A flat buffer of at least ``2 * out.numel()`` items of ``out.dtype``.
        wait: Blocks until the gloo send/recv works it is given are done (raises on
            failure).
    """
    combine = _COMBINE.get(op)
    if combine is None:
        raise ValueError(f"op: got {op!r}; allowed: SUM, PRODUCT, MIN, MAX")
    n = out.numel()
    bufs = [spare[:n].view(out.shape), spare[n : 2 * n].view(out.shape)]
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    send = inputs[(rank - 1) % size]
    for k in range(size - 1):
        into = bufs[k % 2]  # never ``out``: it may be one of the inputs (Ray allows that)
        posted = pg.recv([_bytes(into)], prv, RING_TAG)
        sent = pg.send([_bytes(send)], nxt, RING_TAG)
        wait([sent, posted])
        block = (rank - k - 2) % size
        combine(into, inputs[block], out=out if k == size - 2 else into)
        send = into


def ring_op(op: GlooReduceOp) -> bool:
    """Whether :func:`ring_reduce_scatter` can reduce with ``op``."""
    try:
        return op in _COMBINE
    except TypeError:  # an unhashable ReduceOp wrapper
        return False


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8)
