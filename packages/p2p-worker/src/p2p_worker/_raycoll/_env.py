"""Where this process meets its peers: the job's store inside a p2p Worker, else Ray's.

Inside a launched :class:`~p2p_worker.Worker` the groups use the job's rendezvous store,
node IP, configuration and token, as every other collective of the job does. In any
other process connected to Ray (a plain ``@ray.remote`` actor or task, or a driver after
``ray.init()``), they use the job's rendezvous actor (:mod:`._service`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import ray
from torch.distributed import TCPStore  # type: ignore[attr-defined]

from p2p_collective import CollectiveConfig
from p2p_worker._raycoll._errors import RayCollectiveError
from p2p_worker._raycoll._service import get_service
from p2p_worker._runtime._state import current_runtime
from p2p_worker._runtime._store import RendezvousStore

STORE_TIMEOUT = 300.0
"""Seconds a blocking request to the store may take (its client's own limit)."""


@dataclass(frozen=True)
class Meeting:
    """What a group needs to meet its peers.

    Attributes:
        store: A client of the rendezvous store (``torch.distributed.TCPStore``).
        host: This node's IP, which the transports bind to.
        job_token: The job's secret (None: no check).
        config: The job's ``p2p_collective.CollectiveConfig`` (None: defaults).
        where: ``"worker"`` (the job's store) or ``"ray"`` (the rendezvous actor).
    """

    store: TCPStore
    host: str
    job_token: str | None = field(repr=False)
    config: CollectiveConfig | None
    where: str


_lock = threading.Lock()
_cache: dict[tuple[str, str], Meeting] = {}


def _from_ray(timeout: float | None) -> Meeting:
    ctx = ray.get_runtime_context()
    key = (ctx.namespace, ctx.get_job_id())
    with _lock:
        cached = _cache.get(key)
    if cached is not None:
        return cached
    try:
        host, port, token = ray.get(get_service().store_address.remote(), timeout=timeout)
    except ray.exceptions.GetTimeoutError as exc:
        raise RayCollectiveError(
            f"the job's collective rendezvous actor did not answer within {timeout} s"
        ) from exc
    store = RendezvousStore.connect(host, port, timeout=STORE_TIMEOUT)
    node_ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
    meeting = Meeting(store, node_ip, token, None, "ray")
    with _lock:
        return _cache.setdefault(key, meeting)


def meeting(timeout: float | None) -> Meeting:
    """Return where this process meets its peers (connecting once per job).

    Args:
        timeout: Seconds to wait for the rendezvous actor (None: no limit).

    Raises:
        RayCollectiveError: Not in a p2p Worker and Ray is not initialized, or the
            rendezvous actor did not answer in time.
    """
    runtime = current_runtime()
    if runtime is not None:
        job = runtime.job
        return Meeting(
            runtime.store(), runtime.node_ip, job.job_token, job.collective_config, "worker"
        )
    if not ray.is_initialized():
        raise RayCollectiveError(
            "a collective group of two or more members needs Ray: call ray.init() first"
            " (or use it inside a Ray actor or task, or a launched p2p_worker.Worker)"
        )
    return _from_ray(timeout)
