"""Cluster: the Ray cluster a job runs on, its validated config and its rendezvous store."""

from __future__ import annotations

import os
import secrets
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import ClassVar, Protocol

import ray

from p2p_worker._config import ClusterConfig, ConfigSource, parse_cluster_config
from p2p_worker._errors import ClusterError
from p2p_worker._info import NodeInfo
from p2p_worker._job._placement import NodeCapacity, WorkerPlacement
from p2p_worker._job._ray_env import discover_nodes, embedded_running, shutdown_ray, start_or_attach
from p2p_worker._runtime._state import JobContext
from p2p_worker._runtime._store import RendezvousStore


class RunningGroup(Protocol):
    """What a Cluster needs of the worker groups launched on it (``WorkerGroup``)."""

    name: str
    _placements: list[WorkerPlacement]
    _ray_node_ids: list[str]

    def shutdown(self, *, timeout: float | None = ...) -> None:
        """Stop the group's workers."""


# Every live Cluster object of this process; Ray is shut down when the last one that
# started it goes. Reservations of all live groups count against every Cluster object,
# since they share the one Ray connection of the process.
_LIVE: weakref.WeakSet[Cluster] = weakref.WeakSet()
_LOCK = threading.RLock()
NAMESPACE_ENV = "CLUSTER_NAMESPACE"
"""Where a Cluster and RLinf-style managers read the Ray namespace from (RLinf's name)."""
JOB_TOKEN_ENV = "P2P_JOB_TOKEN"
"""Where a Cluster takes the job token from when none is given (p2p-collective reads it too)."""


def live_clusters() -> list[Cluster]:
    """The open :class:`Cluster` objects of this process, oldest first."""
    with _LOCK:
        return [c for c in list(_LIVE) if not c._closed]


def open_job_context(cluster: Cluster) -> JobContext:
    """The job context of ``cluster`` (what a process needs to take part in its job).

    For modules that build a process's place in the job from the driver (channels).

    Raises:
        ClusterError: ``cluster`` was shut down.
    """
    cluster._check_open()
    return cluster._job_context()


class Cluster:
    """The Ray cluster a job runs on, with the job's configuration and rendezvous store.

    It attaches to a running Ray cluster when one is reachable (``$RAY_ADDRESS``, or a
    ``ray start`` cluster on this machine) and otherwise starts an embedded local one
    bound to 127.0.0.1, with its temp dir at ``$P2P_RAY_TMPDIR`` (default
    ``/tmp/p2pray``). A process already connected to Ray reuses that connection.

    The whole ``cluster:`` configuration is validated first, before Ray starts, so a
    bad key fails fast with a :class:`~p2p_asyncwork.ConfigError` naming its path. The
    job's rendezvous store, a ``torch.distributed.TCPStore`` server, then starts in
    this (the driver) process on a free port of the driver's node IP; every worker
    connects to it and receives the validated configuration.

    Args:
        num_nodes: Number of nodes to use; ``None`` uses the config's ``num_nodes`` or
            every node. Waits up to ``timeout`` for that many nodes to join.
        config: The job configuration: a mapping, a YAML file path or YAML text, with
            a ``cluster:`` section (or being that section). See :func:`parse_cluster_config`.
        address: ``None`` (attach if reachable, else embedded), ``"local"`` (always
            embedded), ``"auto"`` (attach or fail), or a Ray address to attach to.
        num_cpus: CPUs an embedded cluster offers (default: the machine's).
        num_gpus: GPUs an embedded cluster offers (default: the machine's).
        object_store_memory: Bytes of an embedded cluster's object store.
        timeout: Seconds to wait for ``num_nodes`` nodes.
        cluster_cfg: RLinf's name for ``config`` (give one of them). An empty
            ``component_placement`` key, which RLinf configs carry, is accepted and
            ignored; a non-empty one is refused (use placement strategies).
        job_token: The job's secret. Every worker (and the driver's own channel
            endpoint) gets it with the store address, and their ``Collective`` s prove
            to each other at rendezvous that they hold it, so a process outside the job
            cannot join a group. Defaults to ``$P2P_JOB_TOKEN``, else a fresh random
            token per Cluster (``secrets.token_hex(32)``). It never enters the store.

    Raises:
        ConfigError: The configuration is invalid (key path in the message).
        ValueError: ``num_nodes`` disagrees with the config's, or is not >= 1; sizing
            arguments were given for an attached cluster; ``job_token`` is empty.
        TypeError: ``job_token`` is not a str.
        ClusterError: Ray cannot start or be reached, fewer than ``num_nodes`` nodes are
            there after ``timeout``, or the store cannot start.

    The Ray namespace of the job is :attr:`NAMESPACE` (RLinf's class attribute).

    ``Cluster()`` with no arguments at all, while this process has exactly one open
    Cluster, returns that Cluster, as RLinf's does (its Cluster is one per process); with
    arguments, or with none or several open, it makes a new one. Each Cluster object is a
    job of its own (its own store and job token), so code that opens several passes
    ``cluster=`` where it matters (``Channel.create``).

    Example:
        >>> cluster = Cluster(num_nodes=1)  # doctest: +SKIP
        >>> cluster.num_nodes, cluster.num_gpus  # doctest: +SKIP
        (1, 0)
        >>> cluster.shutdown()  # doctest: +SKIP
    """

    NAMESPACE: ClassVar[str | None] = None
    """The job's Ray namespace (RLinf's ``Cluster.NAMESPACE``).

    ``$CLUSTER_NAMESPACE``, when set, overrides it when a Cluster is created (and when a
    :class:`~p2p_worker.Manager` is). A Cluster that connects this process to Ray
    connects in this namespace; ``None`` (the default) means Ray's own anonymous
    namespace of the job, which keeps two jobs on one Ray cluster apart. Once connected,
    it holds the namespace Ray uses (until that connection is shut down), and every
    worker gets it, in ``Cluster.NAMESPACE`` and ``$CLUSTER_NAMESPACE``. Unlike RLinf's
    (default ``"RLinf"``) it is not fixed: a chosen name is shared by every job that
    chooses it.
    """

    def __new__(cls, *args: object, **kwargs: object) -> Cluster:
        # RLinf's Cluster() with no arguments, once a Cluster is open, is that Cluster: code
        # written for it (test fixtures, helpers) reaches the job's one Cluster this way.
        if not args and not kwargs:
            open_now = live_clusters()
            if len(open_now) == 1:
                return open_now[0]
        return super().__new__(cls)

    def __init__(
        self,
        num_nodes: int | None = None,
        config: ConfigSource = None,
        *,
        address: str | None = None,
        num_cpus: float | None = None,
        num_gpus: int | None = None,
        object_store_memory: int | None = None,
        timeout: float | None = 60.0,
        job_token: str | None = None,
        cluster_cfg: ConfigSource = None,
    ) -> None:
        if getattr(self, "_ready", False):
            return  # Cluster() handed back the open Cluster (see __new__): nothing to redo
        if cluster_cfg is not None:
            if config is not None:
                raise ValueError("give config or its RLinf name cluster_cfg, not both")
            config = cluster_cfg
        self.config: ClusterConfig = parse_cluster_config(_drop_component_placement(config))
        self._job_token = _resolve_job_token(job_token)
        wanted = _resolve_num_nodes(num_nodes, self.config.num_nodes)
        self._groups: dict[str, RunningGroup] = {}
        self._closed = False
        with _LOCK:
            namespace = os.environ.get(NAMESPACE_ENV)
            if namespace:
                Cluster.NAMESPACE = namespace
            self._started_ray = start_or_attach(
                address,
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                object_store_memory=object_store_memory,
                namespace=Cluster.NAMESPACE,
            )
            try:
                _learn_namespace()
                self._embedded = embedded_running()
                self.nodes: list[NodeInfo] = self._wait_for_nodes(wanted, timeout)
                driver_ip = next(
                    (n.ip for n in self.nodes if n.is_driver_node),
                    ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
                )
                self._store = RendezvousStore(driver_ip)
            except BaseException:
                if self._started_ray:
                    shutdown_ray()
                raise
            _LIVE.add(self)
            self._ready = True

    # -- construction helpers ----------------------------------------------------------------

    def _wait_for_nodes(self, wanted: int | None, timeout: float | None) -> list[NodeInfo]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            nodes = discover_nodes()
            if wanted is None or len(nodes) >= wanted:
                return nodes if wanted is None else nodes[:wanted]
            if self._embedded:
                raise ClusterError(
                    f"num_nodes={wanted}, but an embedded local Ray cluster has exactly one "
                    f"node; start a multi-node Ray cluster (`ray start`) and set RAY_ADDRESS"
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise ClusterError(
                    f"num_nodes={wanted}, but only {len(nodes)} Ray node(s) joined within "
                    f"{timeout} s"
                )
            time.sleep(0.5)

    # -- what the cluster offers -------------------------------------------------------------

    @property
    def num_nodes(self) -> int:
        """Number of nodes this cluster uses."""
        return len(self.nodes)

    @property
    def _num_nodes(self) -> int:
        """RLinf's private name for :attr:`num_nodes` (its tests read it)."""
        return len(self.nodes)

    @property
    def num_cpus(self) -> float:
        """Total CPUs of the nodes this cluster uses."""
        return sum(n.num_cpus for n in self.nodes)

    @property
    def num_gpus(self) -> int:
        """Total GPUs of the nodes this cluster uses."""
        return sum(n.num_gpus for n in self.nodes)

    @property
    def num_accelerators(self) -> int:
        """RLinf's name for :attr:`num_gpus`: accelerators of the nodes this cluster uses."""
        return self.num_gpus

    @property
    def is_embedded(self) -> bool:
        """Whether the cluster is an embedded local one that this process started."""
        return self._embedded

    @property
    def store_address(self) -> tuple[str, int]:
        """``(host, port)`` of the job's rendezvous store."""
        return (self._store.host, self._store.port)

    @property
    def groups(self) -> list[RunningGroup]:
        """The live worker groups launched on this cluster."""
        return list(self._groups.values())

    def summary(self) -> str:
        """Return a few lines describing the nodes, CPUs and GPUs."""
        kind = "embedded local" if self._embedded else "attached"
        lines = [
            f"{kind} Ray cluster: {self.num_nodes} node(s), {self.num_cpus:g} CPUs, "
            f"{self.num_gpus} GPUs; rendezvous store at {self._store.host}:{self._store.port}"
        ]
        for n in self.nodes:
            here = " (driver)" if n.is_driver_node else ""
            lines.append(
                f"  node {n.node_rank}: {n.ip}{here}, {n.num_cpus:g} CPUs, {n.num_gpus} GPUs"
            )
        return "\n".join(lines)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"store {self._store.host}:{self._store.port}"
        return (
            f"<Cluster {self.num_nodes} node(s), {self.num_cpus:g} CPUs, {self.num_gpus} GPUs, "
            f"{'embedded' if self._embedded else 'attached'}, {state}>"
        )

    # -- used by WorkerGroup -----------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClusterError("this Cluster was shut down; create a new one")

    def _job_context(self) -> JobContext:
        return JobContext(
            store_host=self._store.host,
            store_port=self._store.port,
            collective_config=self.config.collective,
            codec_name=self.config.codec_name,
            nodes=tuple(self.nodes),
            job_token=self._job_token,
        )

    def _capacity(self) -> list[NodeCapacity]:
        """Free resources per node: totals minus what live groups of this process hold."""
        capacity = [NodeCapacity(n, n.num_cpus, float(n.num_gpus)) for n in self.nodes]
        by_id = {c.node.ray_node_id: c for c in capacity}
        with _LOCK:
            for cluster in list(_LIVE):
                for group in cluster._groups.values():
                    for p, node_id in zip(group._placements, group._ray_node_ids, strict=True):
                        if node_id in by_id:
                            by_id[node_id].take(p.num_cpus, p.num_gpus)
        return capacity

    def _register(self, group: RunningGroup) -> None:
        with _LOCK:
            self._check_open()
            if group.name in self._groups:
                raise ValueError(
                    f"name={group.name!r}: a group of that name is already running on this "
                    f"cluster; shut it down first or pick another name"
                )
            self._groups[group.name] = group

    def _unregister(self, group: RunningGroup) -> None:
        with _LOCK:
            if self._groups.get(group.name) is group:
                del self._groups[group.name]

    def _name_taken(self, name: str) -> bool:
        with _LOCK:
            return any(name in c._groups for c in list(_LIVE))

    # -- teardown ----------------------------------------------------------------------------

    def shutdown(self, *, timeout: float | None = 30.0) -> None:
        """Shut down every group of this cluster and stop the rendezvous store.

        An embedded Ray cluster this object started is shut down too, unless another
        live ``Cluster`` object of this process still uses it. Idempotent.

        Args:
            timeout: Seconds to give each group's workers to close before they are killed.
        """
        with _LOCK:
            if self._closed:
                return
            groups = list(self._groups.values())
        for group in reversed(groups):
            group.shutdown(timeout=timeout)
        with _LOCK:
            self._closed = True
            self._store.close()
            _LIVE.discard(self)
            others = [c for c in _LIVE if not c._closed]
            if self._started_ray and ray.is_initialized():
                if others:
                    # Hand the duty of shutting Ray down to a remaining Cluster.
                    others[0]._started_ray = True
                else:
                    shutdown_ray()
                    _forget_namespace()

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()


# (namespace learned from Ray, what Cluster.NAMESPACE was before): restored when the Ray
# connection it came from is shut down, so a later connection does not reuse it.
_learned_namespace: tuple[str, str | None] | None = None


def _learn_namespace() -> None:
    """Set ``Cluster.NAMESPACE`` to the namespace Ray uses, remembering what it replaced."""
    global _learned_namespace
    actual = str(ray.get_runtime_context().namespace)
    if actual != Cluster.NAMESPACE:
        _learned_namespace = (actual, Cluster.NAMESPACE)
        Cluster.NAMESPACE = actual


def _forget_namespace() -> None:
    """After this process's Ray connection ends: undo what :func:`_learn_namespace` set."""
    global _learned_namespace
    if _learned_namespace is not None and _learned_namespace[0] == Cluster.NAMESPACE:
        Cluster.NAMESPACE = _learned_namespace[1]
    _learned_namespace = None


def _drop_component_placement(config: ConfigSource) -> ConfigSource:
    """Drop RLinf's empty ``component_placement`` key from a mapping config.

    Raises:
        ValueError: The key holds a placement (not supported: use placement strategies).
    """
    if not isinstance(config, Mapping):
        return config
    inner = config.get("cluster", config)
    if not isinstance(inner, Mapping) or "component_placement" not in inner:
        return config
    if inner["component_placement"]:
        raise ValueError(
            "cluster.component_placement: RLinf's component placement is not supported; "
            "place each group with a PlacementStrategy at launch (see the RLinf migration "
            "guide), or leave the key empty"
        )
    trimmed = {k: v for k, v in inner.items() if k != "component_placement"}
    if inner is config:
        return trimmed
    return {**{k: v for k, v in config.items()}, "cluster": trimmed}


def _resolve_num_nodes(arg: int | None, configured: int | None) -> int | None:
    if arg is not None:
        if isinstance(arg, bool) or not isinstance(arg, int):
            raise TypeError(f"num_nodes must be an int or None, got {arg!r}")
        if arg < 1:
            raise ValueError(f"num_nodes must be >= 1, got {arg}")
        if configured is not None and configured != arg:
            raise ValueError(
                f"num_nodes={arg} disagrees with the config's cluster.num_nodes={configured}; "
                f"give one of them"
            )
    return arg if arg is not None else configured


def _resolve_job_token(arg: str | None) -> str:
    if arg is not None:
        if not isinstance(arg, str):
            raise TypeError(f"job_token: expected a str or None, got {type(arg).__name__}")
        if not arg:
            raise ValueError("job_token: got an empty string; allowed: a non-empty str or None")
        return arg
    return os.environ.get(JOB_TOKEN_ENV) or secrets.token_hex(32)


def placements_per_node(placements: Sequence[WorkerPlacement]) -> dict[int, list[int]]:
    """Map node rank -> ranks of the workers placed there, in rank order."""
    out: dict[int, list[int]] = {}
    for p in placements:
        out.setdefault(p.node_rank, []).append(p.rank)
    return out
