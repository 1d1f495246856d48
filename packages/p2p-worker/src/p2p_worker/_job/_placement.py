"""Placement strategies: which node each worker of a group runs on, with what resources."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from p2p_worker._errors import PlacementError
from p2p_worker._info import NodeInfo

_EPS = 1e-9


@dataclass(frozen=True)
class WorkerPlacement:
    """Where one worker goes: its rank, its node, and the resources reserved for it.

    Attributes:
        rank: The worker's rank in its group.
        node_rank: Index of the node (``NodeInfo.node_rank``).
        num_cpus: CPUs reserved for the worker (may be 0 or fractional).
        num_gpus: GPUs reserved for the worker (0 for a CPU-only worker; a fraction
            below 1 lets workers of several groups share one GPU).
    """

    rank: int
    node_rank: int
    num_cpus: float
    num_gpus: float


@dataclass
class NodeCapacity:
    """Free CPUs and GPUs of one node, as a placement sees them."""

    node: NodeInfo
    cpus: float
    gpus: float

    def fits(self, cpus: float, gpus: float) -> bool:
        """Return True if ``cpus`` and ``gpus`` fit in what is free."""
        return cpus <= self.cpus + _EPS and gpus <= self.gpus + _EPS

    def take(self, cpus: float, gpus: float) -> None:
        """Mark ``cpus`` and ``gpus`` as used."""
        self.cpus -= cpus
        self.gpus -= gpus


def _check_amount(value: object, arg: str, *, gpu: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TypeError(f"{arg} must be a finite number, got {value!r}")
    if value < 0:
        raise ValueError(f"{arg} must be >= 0, got {value}")
    if gpu and value > 1 and value != int(value):
        raise ValueError(f"{arg} must be a fraction in (0, 1] or a whole number, got {value}")
    return float(value)


def _describe(capacity: Sequence[NodeCapacity]) -> str:
    parts = [
        f"node {c.node.node_rank} ({c.node.ip}): {c.cpus:g} of {c.node.num_cpus:g} CPUs, "
        f"{c.gpus:g} of {c.node.num_gpus} GPUs free"
        for c in capacity
    ]
    return "; ".join(parts) if parts else "no nodes"


class PlacementStrategy(ABC):
    """Decides the node and the resources of every worker of a group.

    A strategy plans against the cluster's nodes and what this cluster's running groups
    already hold, so a request that cannot fit fails with :class:`PlacementError` before
    any worker starts.
    """

    @abstractmethod
    def plan(self, capacity: Sequence[NodeCapacity]) -> list[WorkerPlacement]:
        """Return one :class:`WorkerPlacement` per worker, in rank order.

        Args:
            capacity: Free resources per node, indexed by node rank (consumed by the plan).

        Raises:
            PlacementError: The nodes lack what the strategy asks for.
        """


class CountPlacementStrategy(PlacementStrategy):
    """``num_workers`` workers packed onto the nodes in order, filling each before the next.

    This is p2p-worker's own packing by count. The top-level name
    :class:`~p2p_worker.PackedPlacementStrategy` is RLinf's packing by hardware rank;
    calling it with one argument (``PackedPlacementStrategy(4, cpus_per_worker=0)``)
    still builds this class.

    Each worker reserves ``gpus_per_worker`` GPUs (0: a CPU-only worker) and
    ``cpus_per_worker`` CPUs on one node; a worker never spans nodes. Rank 0 goes to the
    first node with room, and ranks follow in node order, so consecutive ranks share a
    node where they fit.

    Args:
        num_workers: Number of workers (>= 1).
        gpus_per_worker: GPUs per worker: a whole number, or a fraction in (0, 1) to share
            a GPU with workers of other groups.
        cpus_per_worker: CPUs reserved per worker for its lifetime. 0 (default) shares
            the node's cores, as Ray actors do while they run.
        nodes: Node ranks to use, in order; ``None`` uses every node of the cluster.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: An argument is out of range.

    Example:
        >>> strategy = CountPlacementStrategy(4)
        >>> strategy.num_workers, strategy.cpus_per_worker
        (4, 0.0)
    """

    def __init__(
        self,
        num_workers: int,
        *,
        gpus_per_worker: float = 0,
        cpus_per_worker: float = 0.0,
        nodes: Sequence[int] | None = None,
    ) -> None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, int):
            raise TypeError(f"num_workers must be an int, got {num_workers!r}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.num_workers = num_workers
        self.gpus_per_worker = _check_amount(gpus_per_worker, "gpus_per_worker", gpu=True)
        self.cpus_per_worker = _check_amount(cpus_per_worker, "cpus_per_worker")
        self.nodes = None if nodes is None else _check_node_ranks(nodes, "nodes")

    def plan(self, capacity: Sequence[NodeCapacity]) -> list[WorkerPlacement]:
        """Pack the workers onto the nodes (see the class docstring)."""
        order = list(range(len(capacity))) if self.nodes is None else list(self.nodes)
        _check_nodes_exist(order, capacity, repr(self))
        cpus, gpus = self.cpus_per_worker, self.gpus_per_worker
        out: list[WorkerPlacement] = []
        pos = 0
        for rank in range(self.num_workers):
            while pos < len(order) and not capacity[order[pos]].fits(cpus, gpus):
                pos += 1
            if pos == len(order):
                used = [capacity[i] for i in order]
                raise PlacementError(
                    f"{self!r} does not fit: it needs {self.num_workers} x ({cpus:g} CPUs, "
                    f"{gpus:g} GPUs) but only {rank} fit on the nodes it may use "
                    f"[{_describe(used)}]; use fewer workers, fewer resources per worker "
                    f"(cpus_per_worker=0 shares the cores), or a bigger cluster"
                )
            node = capacity[order[pos]]
            node.take(cpus, gpus)
            out.append(WorkerPlacement(rank, node.node.node_rank, cpus, gpus))
        return out

    def __repr__(self) -> str:
        nodes = "" if self.nodes is None else f", nodes={list(self.nodes)}"
        return (
            f"CountPlacementStrategy({self.num_workers}, gpus_per_worker="
            f"{self.gpus_per_worker:g}, cpus_per_worker={self.cpus_per_worker:g}{nodes})"
        )


class NodePlacementStrategy(PlacementStrategy):
    """CPU-only workers pinned to nodes (RLinf's signature and order).

    Repeat a node rank to put several workers on it: ``[0, 0, 1]`` places ranks 0 and 1
    on node 0 and rank 2 on node 1. As in RLinf, the node ranks are sorted, so ranks
    follow node order. By default the workers share the node's cores (no CPU is
    reserved), as Ray actors do while they run: ``NodePlacementStrategy([0] * 8)``
    twice fits a 2-core machine.

    Args:
        node_ranks: Node rank of each worker (non-empty).
        node_group_label: RLinf's node-group selector; only ``None`` (all nodes) is
            supported.
        cpus_per_worker: CPUs reserved per worker for its lifetime (default 0).

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: ``node_ranks`` is empty or holds a negative rank, or
            ``node_group_label`` is not ``None``.

    Example:
        >>> NodePlacementStrategy([1, 0, 0]).node_ranks
        (0, 0, 1)
    """

    def __init__(
        self,
        node_ranks: Sequence[int],
        node_group_label: str | Sequence[str] | None = None,
        *,
        cpus_per_worker: float = 0.0,
    ) -> None:
        self.node_ranks = tuple(sorted(_check_node_ranks(node_ranks, "node_ranks")))
        if node_group_label is not None:
            raise ValueError(
                f"node_group_label={node_group_label!r}: node groups are not supported; "
                f"allowed: None (node ranks count over all nodes of the cluster)"
            )
        self.cpus_per_worker = _check_amount(cpus_per_worker, "cpus_per_worker")

    def plan(self, capacity: Sequence[NodeCapacity]) -> list[WorkerPlacement]:
        """Place worker ``i`` on ``node_ranks[i]`` if its CPUs are free there."""
        _check_nodes_exist(self.node_ranks, capacity, repr(self))
        out: list[WorkerPlacement] = []
        for rank, node_rank in enumerate(self.node_ranks):
            node = capacity[node_rank]
            if not node.fits(self.cpus_per_worker, 0.0):
                raise PlacementError(
                    f"{self!r} does not fit: worker {rank} needs {self.cpus_per_worker:g} "
                    f"CPUs on node {node_rank} [{_describe([node])}]; lower cpus_per_worker "
                    f"(0 shares the cores) or spread the workers over more nodes"
                )
            node.take(self.cpus_per_worker, 0.0)
            out.append(WorkerPlacement(rank, node_rank, self.cpus_per_worker, 0.0))
        return out

    def __repr__(self) -> str:
        return (
            f"NodePlacementStrategy({list(self.node_ranks)}, "
            f"cpus_per_worker={self.cpus_per_worker:g})"
        )


def default_placement(nodes: Sequence[NodeInfo]) -> PlacementStrategy:
    """One worker per GPU of the cluster; one CPU-only worker when it has no GPU."""
    total_gpus = sum(n.num_gpus for n in nodes)
    if total_gpus > 0:
        return CountPlacementStrategy(total_gpus, gpus_per_worker=1)
    return NodePlacementStrategy([0])


def _check_node_ranks(values: Sequence[int], arg: str) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{arg} must be a sequence of node ranks, got {values!r}")
    out = tuple(values)
    if not out:
        raise ValueError(f"{arg} must not be empty")
    for v in out:
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{arg} must hold int node ranks, got {v!r}")
        if v < 0:
            raise ValueError(f"{arg} must hold node ranks >= 0, got {v}")
    return out


def _check_nodes_exist(ranks: Sequence[int], capacity: Sequence[NodeCapacity], who: str) -> None:
    missing = sorted({r for r in ranks if r >= len(capacity)})
    if missing:
        raise PlacementError(
            f"{who} uses node rank(s) {missing} but the cluster has {len(capacity)} node(s) "
            f"(ranks 0..{len(capacity) - 1})"
        )
