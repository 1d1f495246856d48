from __future__ import annotations

import pytest

from p2p_worker import (
    NodeInfo,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    PlacementError,
    WorkerPlacement,
)
from p2p_worker._job._placement import NodeCapacity, default_placement


def nodes(*spec: tuple[float, int]) -> list[NodeInfo]:
    return [
        NodeInfo(i, f"id{i}", f"10.0.0.{i + 1}", cpus, gpus, i == 0)
        for i, (cpus, gpus) in enumerate(spec)
    ]


def capacity(ns: list[NodeInfo]) -> list[NodeCapacity]:
    return [NodeCapacity(n, n.num_cpus, float(n.num_gpus)) for n in ns]


def test_packed_gpu_workers_fill_nodes_in_order() -> None:
    plan = PackedPlacementStrategy(6, gpus_per_worker=1).plan(capacity(nodes((8, 4), (8, 4))))
    assert [p.node_rank for p in plan] == [0, 0, 0, 0, 1, 1]
    assert plan[0] == WorkerPlacement(0, 0, 0.0, 1.0)  # CPUs shared by default
    plan = PackedPlacementStrategy(2, gpus_per_worker=2).plan(capacity(nodes((8, 3), (8, 4))))
    assert [p.node_rank for p in plan] == [0, 1]  # a worker never spans nodes


def test_packed_cpu_only_workers() -> None:
    plan = PackedPlacementStrategy(5, cpus_per_worker=2).plan(capacity(nodes((4, 0), (6, 0))))
    assert [p.node_rank for p in plan] == [0, 0, 1, 1, 1]
    assert all(p.num_gpus == 0 for p in plan)
    free = PackedPlacementStrategy(100, cpus_per_worker=0).plan(capacity(nodes((2, 0))))
    assert len(free) == 100
    assert {p.node_rank for p in free} == {0}
    plan = PackedPlacementStrategy(2, cpus_per_worker=0, nodes=[1]).plan(
        capacity(nodes((2, 0), (2, 0)))
    )
    assert [p.node_rank for p in plan] == [1, 1]


def test_fractional_gpus_share() -> None:
    plan = PackedPlacementStrategy(4, gpus_per_worker=0.5).plan(capacity(nodes((8, 2))))
    assert [p.num_gpus for p in plan] == [0.5] * 4


def test_short_resources_are_clear_errors() -> None:
    with pytest.raises(PlacementError, match=r"needs 8 x .*1 GPUs.*only 4 fit"):
        PackedPlacementStrategy(8, gpus_per_worker=1).plan(capacity(nodes((16, 4))))
    with pytest.raises(PlacementError, match="only 0 fit"):
        PackedPlacementStrategy(1, gpus_per_worker=1).plan(capacity(nodes((2, 0))))
    with pytest.raises(PlacementError, match="only 2 fit"):
        PackedPlacementStrategy(3, cpus_per_worker=1).plan(capacity(nodes((2, 0))))
    with pytest.raises(PlacementError, match=r"node rank\(s\) \[3\]"):
        NodePlacementStrategy([0, 3], cpus_per_worker=0).plan(capacity(nodes((2, 0))))
    with pytest.raises(PlacementError, match="worker 2 needs 1 CPUs on node 0"):
        NodePlacementStrategy([0, 0, 0], cpus_per_worker=1).plan(capacity(nodes((2, 0))))


def test_node_strategy_pins_workers() -> None:
    plan = NodePlacementStrategy([1, 0, 1], cpus_per_worker=0.5).plan(
        capacity(nodes((1, 0), (1, 0)))
    )
    # As in RLinf, the node ranks are sorted: ranks follow node order.
    assert [(p.rank, p.node_rank, p.num_cpus, p.num_gpus) for p in plan] == [
        (0, 0, 0.5, 0.0),
        (1, 1, 0.5, 0.0),
        (2, 1, 0.5, 0.0),
    ]


def test_plans_consume_capacity() -> None:
    cap = capacity(nodes((4, 2)))
    PackedPlacementStrategy(2, gpus_per_worker=1).plan(cap)
    assert (cap[0].cpus, cap[0].gpus) == (4.0, 0.0)
    with pytest.raises(PlacementError):
        PackedPlacementStrategy(1, gpus_per_worker=1).plan(cap)


def test_default_placement() -> None:
    gpu = default_placement(nodes((8, 4), (8, 4)))
    assert isinstance(gpu, PackedPlacementStrategy)
    assert (gpu.num_workers, gpu.gpus_per_worker) == (8, 1.0)
    cpu = default_placement(nodes((8, 0)))  # RLinf's default: NodePlacementStrategy([0])
    assert isinstance(cpu, NodePlacementStrategy)
    assert (cpu.node_ranks, cpu.cpus_per_worker) == ((0,), 0.0)


@pytest.mark.parametrize(
    ("make", "exc", "match"),
    [
        (lambda: PackedPlacementStrategy(0), ValueError, "num_workers must be >= 1"),
        (lambda: PackedPlacementStrategy("2"), TypeError, "num_workers must be an int"),
        (lambda: PackedPlacementStrategy(1, gpus_per_worker=-1), ValueError, "gpus_per_worker"),
        (lambda: PackedPlacementStrategy(1, gpus_per_worker=1.5), ValueError, "fraction"),
        (lambda: PackedPlacementStrategy(1, cpus_per_worker="1"), TypeError, "cpus_per_worker"),
        (lambda: PackedPlacementStrategy(1, nodes=[]), ValueError, "nodes must not be empty"),
        (lambda: NodePlacementStrategy([]), ValueError, "node_ranks must not be empty"),
        (lambda: NodePlacementStrategy([0, -1]), ValueError, "node ranks >= 0"),
        (lambda: NodePlacementStrategy(0), TypeError, "sequence of node ranks"),
    ],
)
def test_argument_errors(make: object, exc: type[Exception], match: str) -> None:
    with pytest.raises(exc, match=match):
        make()  # type: ignore[operator]
