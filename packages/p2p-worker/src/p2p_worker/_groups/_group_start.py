"""How a WorkerGroup starts and stops its workers: reservation, per-rank setup, exit wait.

:class:`~p2p_worker.WorkerGroup` keeps the user-facing part (launching, calling,
shutting down); this module holds the mechanics both a root group and a child group
use, so neither the group module nor the cluster grows them twice.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import ray
from ray.util.placement_group import PlacementGroup, placement_group

from p2p_worker._address import WorkerAddress
from p2p_worker._errors import PlacementError
from p2p_worker._info import NodeInfo, WorkerInfo
from p2p_worker._job._placement import PlacementStrategy, WorkerPlacement
from p2p_worker._process._actor import Probe, Setup
from p2p_worker._runtime._state import JobContext


def check_max_concurrency(value: object) -> None:
    """Refuse a ``max_concurrency`` that is neither ``None`` nor an int >= 1.

    Raises:
        TypeError: Not an int (or a bool).
        ValueError: Below 1.
    """
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"max_concurrency must be an int or None, got {value!r}")
        if value < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {value}")


def check_strategy(strategy: object) -> None:
    """Refuse anything but a :class:`PlacementStrategy`.

    Raises:
        TypeError: ``strategy`` is of another type.
    """
    if not isinstance(strategy, PlacementStrategy):
        raise TypeError(
            f"placement_strategy must be a PlacementStrategy, got {type(strategy).__name__}"
        )


def reserve(
    group_name: str,
    nodes: Sequence[NodeInfo],
    placements: Sequence[WorkerPlacement],
    strategy: PlacementStrategy,
    timeout: float | None,
    left: float | None,
) -> PlacementGroup:
    """Reserve one bundle per worker on its node in a Ray placement group, and wait for it.

    Args:
        group_name: The group's name, for messages.
        nodes: The job's nodes, by node rank.
        placements: One placement per worker, in rank order.
        strategy: The strategy that planned them, for messages.
        timeout: The launch timeout the caller was given, for messages.
        left: Seconds left to wait for the reservation (None: no limit).

    Returns:
        The ready placement group.

    Raises:
        PlacementError: Ray could not reserve the bundles within ``left`` seconds.
    """
    bundles, selectors = [], []
    for p in placements:
        node = nodes[p.node_rank]
        bundle: dict[str, float] = {}
        if p.num_cpus > 0:
            bundle["CPU"] = p.num_cpus
        if p.num_gpus > 0:
            bundle["GPU"] = p.num_gpus
        if not bundle:  # Ray refuses empty bundles; a sliver of the node resource pins it
            bundle[f"node:{node.ip}"] = 0.001
        bundles.append(bundle)
        selectors.append({"ray.io/node-id": node.ray_node_id})
    pg: PlacementGroup = placement_group(bundles, strategy="PACK", bundle_label_selector=selectors)
    try:
        ray.get(pg.ready(), timeout=left)
    except ray.exceptions.GetTimeoutError as exc:
        free = ray.available_resources()  # type: ignore[no-untyped-call]
        raise PlacementError(
            f"group {group_name!r}: Ray could not reserve the resources of {strategy!r} "
            f"within {timeout} s although the cluster's totals suffice; other groups or "
            f"jobs hold them ({free} available now)"
        ) from exc
    return pg


def build_setups(
    job: JobContext,
    group: WorkerAddress,
    placements: Sequence[WorkerPlacement],
    probes: Sequence[Probe],
    args: tuple[object, ...],
    kwargs: dict[str, object],
) -> list[Setup]:
    """What each worker gets before its ``__init__``: environment, info, job, arguments.

    Args:
        job: The job context (store, token, configuration, nodes).
        group: The group's address; worker ``r`` is ``group.get_child_address(r)``.
        placements: One placement per worker, in rank order.
        probes: Where Ray put each worker, in rank order.
        args: Positional arguments for every worker's ``__init__``.
        kwargs: Keyword arguments for every worker's ``__init__``.

    Returns:
        One :class:`Setup` per worker, in rank order.
    """
    world = len(probes)
    master = probes[0]
    on_node: dict[int, list[int]] = {}
    for p in placements:
        on_node.setdefault(p.node_rank, []).append(p.rank)
    setups = []
    for p, probe in zip(placements, probes, strict=True):
        peers = on_node[p.node_rank]
        visible = _sorted_ids({g for r in peers for g in probes[r].gpu_ids})
        if probe.gpu_ids:
            local_rank = visible.index(probe.gpu_ids[0])
            cuda_visible: str | None = ",".join(visible)
        else:
            local_rank = peers.index(p.rank)
            cuda_visible = None
        address = group.get_child_address(p.rank)
        env = {
            "MASTER_ADDR": master.ip,
            "MASTER_PORT": str(master.port),
            "RANK": str(p.rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(len(peers)),
            "NODE_LOCAL_RANK": str(peers.index(p.rank)),
            "NODE_RANK": str(p.node_rank),
            "P2P_WORKER_ADDRESS": address.get_name(),
        }
        info = WorkerInfo(
            address=address,
            rank=p.rank,
            node_id=p.node_rank,
            gpu_id=_gpu_int(probe.gpu_ids[0], 0) if probe.gpu_ids else None,
            node_ip=probe.ip,
            available_gpus=[_gpu_int(g, i) for i, g in enumerate(visible)] if probe.gpu_ids else [],
            world_size=world,
            local_rank=local_rank,
            ray_node_id=probe.ray_node_id,
            pid=probe.pid,
        )
        setups.append(Setup(job, info, env, cuda_visible, args, dict(kwargs)))
    return setups


def _sorted_ids(ids: set[str]) -> list[str]:
    return sorted(ids, key=lambda g: (0, int(g), g) if g.isdigit() else (1, 0, g))


def _gpu_int(gpu: str, fallback: int) -> int:
    return int(gpu) if gpu.isdigit() else fallback


def wait_exit(pids: Sequence[int], deadline: float) -> None:
    """Wait until the processes ``pids`` (on this machine) are gone, or the deadline."""
    pending = set(pids)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                pending.discard(pid)
            except PermissionError:  # pragma: no cover - pid reused by another user
                pending.discard(pid)
        if pending:
            time.sleep(0.05)
