"""The rendezvous of groups formed by plain Ray actors: one named Ray actor per job.

The first process of a job that needs it (the driver declaring a group, or a member
initializing one) creates the actor through Ray itself (``get_if_exists``), so members
need no address but their job. The actor holds:

* a ``torch.distributed.TCPStore`` server bound to the IP of its own node (loopback on
  a one-machine cluster), started at the first request, through which members meet;
* the job's token: a fresh random secret that every member of every group of the job
  proves it holds at each rendezvous (an HMAC, see p2p-collective), so a process that
  reaches the store's port but not this actor cannot join;
* the groups declared from the driver with ``create_collective_group``.

Its name carries the caller's Ray namespace and job id, so the same group name in
another namespace or job never meets this one. It is detached (a member that dies does
not take the rendezvous with it) and ends itself once Ray reports its job finished.
"""

from __future__ import annotations

import secrets
import threading
import time
from typing import Literal, Protocol, TypeAlias, TypeVar, cast, overload

import ray

from p2p_worker._remote import RemoteMethod
from p2p_worker._runtime._store import RendezvousStore

SERVICE_NAMESPACE = "p2p-collective"
"""The Ray namespace of the rendezvous actors (a fixed one, so Ray logs no warning)."""

_JOB_POLL_S = 5.0

Declaration: TypeAlias = tuple[list[str], int, list[int], str, "float | None"]
"""A group declared from the driver: actor ids, world size, ranks, backend, timeout."""

R = TypeVar("R")


class ServiceHandle(Protocol):
    """The rendezvous actor's handle, as this package calls it."""

    @property
    def store_address(self) -> RemoteMethod[..., tuple[str, int, str]]: ...
    @property
    def declare(self) -> RemoteMethod[..., bool]: ...
    @property
    def lookup(self) -> RemoteMethod[..., Declaration | None]: ...
    @property
    def forget(self) -> RemoteMethod[..., None]: ...


def service_name(namespace: str, job_id: str) -> str:
    """The actor name of the rendezvous of job ``job_id`` in Ray namespace ``namespace``.

    Example:
        >>> service_name("ns", "01000000")
        'rendezvous:ns:01000000'
    """
    return f"rendezvous:{namespace}:{job_id}"


def _job_is_dead(job_id: str) -> bool:
    try:
        from ray._private import state

        jobs: list[dict[str, object]] = state.jobs()  # type: ignore[no-untyped-call]
        return any(j.get("JobID") == job_id and j.get("IsDead") for j in jobs)
    except Exception:  # an internal API: when it is unavailable, stay up
        return False


class RendezvousService:
    """The rendezvous actor's class (run as a detached, named Ray actor; see module doc).

    Args:
        job_id: The hex id of the job it serves; it exits once that job finished.
    """

    def __init__(self, job_id: str) -> None:
        self._job_id = job_id
        self._token = secrets.token_hex(32)
        self._lock = threading.Lock()
        self._store: RendezvousStore | None = None
        self._declared: dict[str, Declaration] = {}
        threading.Thread(target=self._watch_job, name="p2p-rendezvous-job", daemon=True).start()

    def store_address(self) -> tuple[str, int, str]:
        """``(host, port, token)`` of the job's store, started at the first call."""
        with self._lock:
            if self._store is None:
                ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
                self._store = RendezvousStore(ip)
            return self._store.host, self._store.port, self._token

    def declare(self, group_name: str, info: Declaration) -> bool:
        """Record a group declared from the driver; False when that name is taken."""
        with self._lock:
            if group_name in self._declared:
                return False
            self._declared[group_name] = info
            return True

    def lookup(self, group_name: str) -> Declaration | None:
        """The declaration of ``group_name``, or None."""
        with self._lock:
            return self._declared.get(group_name)

    def forget(self, group_name: str) -> None:
        """Drop the declaration of ``group_name`` (so the name can be declared again)."""
        with self._lock:
            self._declared.pop(group_name, None)

    def _watch_job(self) -> None:
        while True:
            time.sleep(_JOB_POLL_S)
            if _job_is_dead(self._job_id):
                with self._lock:
                    store, self._store = self._store, None
                if store is not None:
                    store.close()
                ray.kill(ray.get_runtime_context().current_actor)


_actor_class: ray.actor.ActorClass[RendezvousService] | None = None


@overload
def get_service(create: Literal[True] = True) -> ServiceHandle: ...
@overload
def get_service(create: bool) -> ServiceHandle | None: ...


def get_service(create: bool = True) -> ServiceHandle | None:
    """The handle of this job's rendezvous actor (created when missing and ``create``).

    Returns:
        The actor handle, or None when it does not exist and ``create`` is False.
    """
    global _actor_class
    ctx = ray.get_runtime_context()
    name = service_name(ctx.namespace, ctx.get_job_id())
    if not create:
        try:
            return cast("ServiceHandle", ray.get_actor(name, namespace=SERVICE_NAMESPACE))
        except ValueError:
            return None
    if _actor_class is None:
        _actor_class = ray.remote(RendezvousService)
    node = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
        ctx.get_node_id(), soft=True
    )
    handle = _actor_class.options(
        name=name,
        namespace=SERVICE_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        max_restarts=0,
        scheduling_strategy=node,
    ).remote(ctx.get_job_id())
    return cast("ServiceHandle", handle)
