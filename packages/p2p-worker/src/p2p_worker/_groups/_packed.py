"""PackedPlacementStrategy: RLinf's packing of workers onto a range of hardware ranks.

Hardware ranks number the accelerators of the cluster node by node (node 0's GPUs
first); on a cluster without accelerators they number the nodes. A worker takes
``num_hardware_per_process`` of them, ``stride`` apart, starting at the lowest rank of
the range not yet taken, and never spans two nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from p2p_worker._errors import PlacementError
from p2p_worker._job._placement import (
    CountPlacementStrategy,
    NodeCapacity,
    PlacementStrategy,
    WorkerPlacement,
    _check_amount,
)

_COUNT_KEYWORDS = frozenset({"gpus_per_worker", "nodes"})


def _check_rank(value: object, arg: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{arg} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{arg} must be >= {low}, got {value}")
    return value


class PackedPlacementStrategy(PlacementStrategy):
    """Workers packed onto hardware ranks ``start_hardware_rank..end_hardware_rank`` (RLinf).

    With accelerators, each worker holds ``num_hardware_per_process`` GPUs: ranks
    ``r, r + stride, ...`` where ``r`` is the lowest rank of the range still free, so
    ``PackedPlacementStrategy(0, 3)`` gives four one-GPU workers and
    ``PackedPlacementStrategy(0, 3, num_hardware_per_process=2, stride=2)`` two workers
    on GPUs (0, 2) and (1, 3). Which physical GPU of its node a worker gets is Ray's
    choice; the count per node is what the ranks decide (see the RLinf migration guide).
    Without accelerators the ranks are node ranks: one CPU worker per node in the range.

    Called with a single argument, as in p2p-worker's first releases
    (``PackedPlacementStrategy(4, cpus_per_worker=0)``), it builds a
    :class:`~p2p_worker.CountPlacementStrategy` instead.

    Args:
        start_hardware_rank: First hardware rank of the range (>= 0).
        end_hardware_rank: Last hardware rank of the range, inclusive.
        num_hardware_per_process: Hardware ranks per worker (>= 1).
        stride: Distance between the ranks of one worker (>= 1).
        node_group: RLinf's node-group selector; only ``None`` is supported.
        cpus_per_worker: CPUs reserved per worker (default 0: share the node's cores).

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: A rank is negative, the range is empty, its size is not a multiple
            of ``num_hardware_per_process * stride``, or ``node_group`` is given.

    Example:
        >>> p = PackedPlacementStrategy(start_hardware_rank=0, end_hardware_rank=3)
        >>> p.num_hardware, p.num_workers
        (4, 4)
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        count_form = (len(args) == 1 and "end_hardware_rank" not in kwargs) or bool(
            _COUNT_KEYWORDS & kwargs.keys()
        )
        if count_form and cls is PackedPlacementStrategy:
            return CountPlacementStrategy(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        start_hardware_rank: int,
        end_hardware_rank: int,
        num_hardware_per_process: int = 1,
        stride: int = 1,
        node_group: str | None = None,
        *,
        cpus_per_worker: float = 0.0,
    ) -> None:
        self.start_hardware_rank = _check_rank(start_hardware_rank, "start_hardware_rank", 0)
        self.end_hardware_rank = _check_rank(end_hardware_rank, "end_hardware_rank", 0)
        if self.end_hardware_rank < self.start_hardware_rank:
            raise ValueError(
                f"end_hardware_rank={end_hardware_rank} is below start_hardware_rank="
                f"{start_hardware_rank}; the range is inclusive and must not be empty"
            )
        self.num_hardware_per_process = _check_rank(
            num_hardware_per_process, "num_hardware_per_process", 1
        )
        self.stride = _check_rank(stride, "stride", 1)
        step = self.num_hardware_per_process * self.stride
        if self.num_hardware % step:
            raise ValueError(
                f"the range {start_hardware_rank}..{end_hardware_rank} holds "
                f"{self.num_hardware} hardware ranks, not a multiple of "
                f"num_hardware_per_process * stride = {step}"
            )
        if node_group is not None:
            raise ValueError(
                f"node_group={node_group!r}: node groups are not supported; allowed: None"
            )
        self.cpus_per_worker = _check_amount(cpus_per_worker, "cpus_per_worker")

    @property
    def num_hardware(self) -> int:
        """Number of hardware ranks in the range."""
        return self.end_hardware_rank - self.start_hardware_rank + 1

    @property
    def num_workers(self) -> int:
        """Number of workers the strategy places."""
        return self.num_hardware // self.num_hardware_per_process

    def worker_ranks(self) -> list[list[int]]:
        """The hardware ranks of each worker, in worker rank order.

        Example:
            >>> PackedPlacementStrategy(0, 3, 2, stride=2).worker_ranks()
            [[0, 2], [1, 3]]
        """
        free = list(range(self.start_hardware_rank, self.end_hardware_rank + 1))
        taken: set[int] = set()
        out: list[list[int]] = []
        for first in free:
            if first in taken:
                continue
            ranks = [first + k * self.stride for k in range(self.num_hardware_per_process)]
            taken.update(ranks)
            out.append(ranks)
        return out

    def plan(self, capacity: Sequence[NodeCapacity]) -> list[WorkerPlacement]:
        """Place each worker on the node that holds its hardware ranks."""
        gpus = any(c.node.num_gpus > 0 for c in capacity)
        owner: list[int] = []  # hardware rank -> node rank
        for c in capacity:
            owner += [c.node.node_rank] * (c.node.num_gpus if gpus else 1)
        kind = "GPU" if gpus else "node"
        if self.end_hardware_rank >= len(owner):
            raise PlacementError(
                f"{self!r} needs {kind} ranks up to {self.end_hardware_rank} but the cluster "
                f"has {len(owner)} {kind}(s) (ranks 0..{len(owner) - 1})"
            )
        out: list[WorkerPlacement] = []
        for rank, hw in enumerate(self.worker_ranks()):
            nodes = sorted({owner[h] for h in hw})
            if len(nodes) > 1:
                raise PlacementError(
                    f"{self!r}: worker {rank} would hold {kind} ranks {hw} on nodes {nodes}; "
                    f"a worker cannot span nodes"
                )
            node = capacity[nodes[0]]
            want = float(len(hw)) if gpus else 0.0
            if not node.fits(self.cpus_per_worker, want):
                raise PlacementError(
                    f"{self!r}: worker {rank} needs {want:g} GPUs and {self.cpus_per_worker:g} "
                    f"CPUs on node {nodes[0]} ({node.node.ip}), which has {node.gpus:g} GPUs "
                    f"and {node.cpus:g} CPUs free; other groups hold the rest"
                )
            node.take(self.cpus_per_worker, want)
            out.append(WorkerPlacement(rank, nodes[0], self.cpus_per_worker, want))
        return out

    def __repr__(self) -> str:
        return (
            f"PackedPlacementStrategy({self.start_hardware_rank}, {self.end_hardware_rank}, "
            f"num_hardware_per_process={self.num_hardware_per_process}, stride={self.stride})"
        )


PackedPlacementStrategy.register(CountPlacementStrategy)
