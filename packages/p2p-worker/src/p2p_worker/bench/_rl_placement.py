"""Where ``p2p-bench rl`` puts its workers: every one on node 0, or spread over the nodes.

``--placement one-node`` (the default) starts every worker of both stacks on node 0, the
driver's node. ``--placement spread`` keeps the trainers there and puts rollout worker
``i`` on node ``1 + i % (N - 1)`` of a cluster of ``N`` nodes, so that rollouts, weights
and the trainers' allreduce cross the network as they would in a real job. Both stacks
follow the same layout (p2p through its placement strategies, the Ray baseline through
node affinity), and a replacement for a lost rollout worker goes to the node of the
worker it replaces.

Node ranks are :class:`~p2p_worker.Cluster`'s: 0 is the driver's node, the others follow
by address.

Example:
    >>> layout("spread", trainers=2, rollouts=4, num_nodes=4)
    Layout(trainers=(0, 0), rollouts=(1, 2, 3, 1))
    >>> layout("one-node", trainers=2, rollouts=2, num_nodes=4).rollouts
    (0, 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from p2p_worker import Cluster, PlacementError, PlacementStrategy, WorkerPlacement
from p2p_worker.bench._rl_policy import PLACEMENTS


class Layout(NamedTuple):
    """The node rank of every trainer and every rollout worker, by rank."""

    trainers: tuple[int, ...]
    rollouts: tuple[int, ...]


def layout(placement: str, trainers: int, rollouts: int, num_nodes: int) -> Layout:
    """The nodes of ``placement`` on a cluster of ``num_nodes`` nodes.

    Raises:
        ValueError: ``placement`` is not one of :data:`PLACEMENTS`.
        PlacementError: ``spread`` on a cluster of one node (it needs a node for the
            trainers and at least one more for the rollout workers).
    """
    if placement not in PLACEMENTS:
        raise ValueError(f"placement: got {placement!r}; allowed: {', '.join(PLACEMENTS)}")
    if placement == "one-node":
        return Layout((0,) * trainers, (0,) * rollouts)
    if num_nodes < 2:
        raise PlacementError(
            f"--placement spread: the Ray cluster has {num_nodes} node; spread puts the"
            " trainers on node 0 and the rollout workers on the other nodes, so it needs 2"
            " or more (attach to a multi-node cluster with --address, or use --placement"
            " one-node)"
        )
    return Layout((0,) * trainers, tuple(1 + i % (num_nodes - 1) for i in range(rollouts)))


class InOrder(PlacementStrategy):
    """Worker ``i`` on node ``nodes[i]``, no CPU reserved (the cores are shared).

    :class:`~p2p_worker.NodePlacementStrategy` sorts its node ranks; this one keeps the
    order, so that rollout worker ``i`` lands where :func:`layout` says.

    Args:
        nodes: The node rank of each worker, by rank.
    """

    def __init__(self, nodes: Sequence[int]) -> None:
        self.nodes = tuple(nodes)

    def plan(self, capacity: Sequence[object]) -> list[WorkerPlacement]:
        """One placement per worker, in rank order.

        Raises:
            PlacementError: A node rank the cluster does not have.
        """
        missing = sorted({n for n in self.nodes if not 0 <= n < len(capacity)})
        if missing:
            raise PlacementError(
                f"{self!r}: node rank(s) {missing}, but the cluster has {len(capacity)} node(s)"
            )
        return [WorkerPlacement(rank, node, 0.0, 0.0) for rank, node in enumerate(self.nodes)]

    def __repr__(self) -> str:
        return f"InOrder({list(self.nodes)})"


def pinned(cluster: Cluster, node: int) -> dict[str, object]:
    """Ray actor options that start an actor on node rank ``node`` of ``cluster`` (no CPU)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    node_id = cluster.nodes[node].ray_node_id
    return {
        "num_cpus": 0,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False),
    }
