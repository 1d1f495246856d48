"""Run-time descriptions of a worker (WorkerInfo) and of a cluster node (NodeInfo)."""

from __future__ import annotations

from dataclasses import dataclass, field

from p2p_worker._address import WorkerAddress


@dataclass(frozen=True)
class NodeInfo:
    """One node of a :class:`~p2p_worker.Cluster`, as the cluster saw it at start.

    Attributes:
        node_rank: Index of the node in the cluster (0 is the driver's node when it is a
            member); placement strategies and ``WorkerInfo.node_id`` use this index.
        ray_node_id: Ray's hex node id.
        ip: The node's IP address (``127.0.0.1`` on an embedded local cluster).
        num_cpus: CPUs the node offers to Ray.
        num_gpus: GPUs the node offers to Ray.
        is_driver_node: Whether the driver process runs on this node.

    Example:
        >>> NodeInfo(0, "ab12", "127.0.0.1", 8.0, 0, True).num_gpus
        0
    """

    node_rank: int
    ray_node_id: str
    ip: str
    num_cpus: float
    num_gpus: int
    is_driver_node: bool = False


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker knows about itself at run time (``self.worker_info`` in a Worker).

    Attributes:
        address: The worker's :class:`WorkerAddress` (group name and rank path).
        rank: Rank of the worker in its group.
        node_id: Index of the node that hosts the worker (``NodeInfo.node_rank``).
        gpu_id: The (first) GPU assigned to the worker, as a physical GPU id, or ``None``
            for a CPU-only worker.
        node_ip: IP address of the node that hosts the worker.
        available_gpus: Physical ids of the CUDA devices the worker can see (the GPUs of
            its group on its node); ``torch`` numbers them ``cuda:0``, ``cuda:1``, ... in
            this order. Empty for a CPU-only worker.
        world_size: Number of workers in the group.
        local_rank: The ``LOCAL_RANK`` the worker got: the ``torch`` device index of its
            GPU for a GPU worker, else its index among the group's workers on its node.
        ray_node_id: Ray's hex id of the hosting node.
        pid: Process id of the worker.

    Example:
        >>> info = WorkerInfo(WorkerAddress("g", 0), 0, 0, None, "127.0.0.1")
        >>> info.address.get_name(), info.available_gpus
        ('g:0', [])
    """

    address: WorkerAddress
    rank: int
    node_id: int
    gpu_id: int | None
    node_ip: str
    available_gpus: list[int] = field(default_factory=list, hash=False)
    world_size: int = 1
    local_rank: int = 0
    ray_node_id: str = ""
    pid: int = 0
