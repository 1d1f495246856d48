"""Where a process stands in a job's channels: a worker's runtime, or the driver's endpoint.

A worker already has what a channel peer needs (an address, a store client and a
``Collective``: its :class:`~p2p_worker._runtime._state.WorkerRuntime`). The driver is not a
worker, so it gets a runtime of its own per :class:`~p2p_worker.Cluster`: the address
``p2p_driver.<pid>:0``, a client of the job's store and a ``Collective`` with the job's
configuration, built on first use.
"""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Protocol

from p2p_worker._address import WorkerAddress
from p2p_worker._channels._protocol.errors import ChannelError
from p2p_worker._job._cluster import Cluster, live_clusters, open_job_context
from p2p_worker._runtime._state import WorkerRuntime, current_runtime

_lock = threading.Lock()


class NamedHandle(Protocol):
    """What the cache of handles needs of a channel handle: the channel's name."""

    @property
    def name(self) -> str: ...


_drivers: weakref.WeakKeyDictionary[Cluster, WorkerRuntime] = weakref.WeakKeyDictionary()
_handles: weakref.WeakKeyDictionary[WorkerRuntime, dict[str, NamedHandle]] = (
    weakref.WeakKeyDictionary()
)


def driver_endpoint(cluster: Cluster) -> WorkerRuntime:
    """The driver's endpoint in ``cluster``'s job (created once per Cluster object).

    Raises:
        TypeError: ``cluster`` is not a Cluster.
        ClusterError: The cluster was shut down.
    """
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
    job = open_job_context(cluster)
    with _lock:
        endpoint = _drivers.get(cluster)
        if endpoint is None:
            host, _ = cluster.store_address
            ip = next((n.ip for n in cluster.nodes if n.is_driver_node), host)
            address = WorkerAddress(f"p2p_driver.{os.getpid()}", 0)
            endpoint = WorkerRuntime(job, address, ip)
            _drivers[cluster] = endpoint
            weakref.finalize(cluster, endpoint.close)
        return endpoint


def current_endpoint(cluster: Cluster | None = None) -> WorkerRuntime:
    """This process's endpoint: the worker's runtime, else the driver's in ``cluster``.

    Without ``cluster`` the driver must have exactly one open Cluster (RLinf's
    ``Channel.create`` relies on its single Cluster the same way).

    Raises:
        ChannelError: Outside a worker, no Cluster or several are open.
    """
    runtime = current_runtime()
    if cluster is None and runtime is not None:
        return runtime
    if cluster is None:
        open_now = live_clusters()
        if len(open_now) > 1:
            # A Cluster nothing refers to any more (a finished test module's, a helper's
            # that returned) is not one the caller can mean: let the collector drop it.
            del open_now
            gc.collect()
            open_now = live_clusters()
        if len(open_now) != 1:
            raise ChannelError(
                f"this process is not a worker and has {len(open_now)} open Cluster objects; "
                f"pass cluster=... to say which job the channel belongs to"
            )
        cluster = open_now[0]
    return driver_endpoint(cluster)


def endpoint_for_store(store: tuple[str, int]) -> WorkerRuntime:
    """This process's endpoint in the job whose rendezvous store is ``store``.

    Raises:
        ChannelError: This process takes no part in that job.
    """
    runtime = current_runtime()
    if runtime is not None and (runtime.job.store_host, runtime.job.store_port) == store:
        return runtime
    for cluster in live_clusters():
        if cluster.store_address == store:
            return driver_endpoint(cluster)
    raise ChannelError(
        f"this process is neither a worker nor the driver of the job whose store is "
        f"{store[0]}:{store[1]}, so it cannot use that job's channels"
    )


def cached_handle(endpoint: WorkerRuntime, name: str) -> NamedHandle | None:
    """The handle on channel ``name`` this endpoint connected before (None if none)."""
    with _lock:
        return _handles.get(endpoint, {}).get(name)


def remember_handle(endpoint: WorkerRuntime, handle: NamedHandle) -> None:
    """Make ``handle`` the endpoint's handle on its channel."""
    with _lock:
        _handles.setdefault(endpoint, {})[handle.name] = handle


def forget_handle(endpoint: WorkerRuntime, handle: NamedHandle) -> None:
    """Drop ``handle`` from the cache (it was closed)."""
    with _lock:
        named = _handles.get(endpoint, {})
        name = handle.name
        if named.get(name) is handle:
            del named[name]
