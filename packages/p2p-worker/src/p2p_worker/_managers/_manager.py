"""Manager: a job-wide singleton Ray actor that any process of the job reaches by a proxy.

RLinf's scheduler keeps job-wide state (collective groups, locks, node facts) in named
actors it calls managers, each found by name in the cluster's Ray namespace. p2p needs
none of them itself (groups meet through the job's rendezvous store), but code written
for RLinf subclasses :class:`Manager` or reads its class methods, so the base class is
here with RLinf's names and behaviour: the namespace it syncs from ``CLUSTER_NAMESPACE``,
the environment it hands its actors, and :meth:`Manager.get_proxy`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar, Self, TypeVar, cast

import ray
from ray.actor import ActorHandle

from p2p_worker._errors import ClusterError
from p2p_worker._job._cluster import Cluster

NAMESPACE_ENV = "CLUSTER_NAMESPACE"
"""The environment variable that carries the cluster's Ray namespace to a process."""

DEFAULT_CALL_TIMEOUT = 60.0
"""Seconds a proxied manager call may take by default (``Manager.get_proxy(timeout=)``)."""

M = TypeVar("M", bound="Manager")


class ManagerProxy:
    """Calls a manager actor's public methods as if they were local, blocking calls.

    Returned by :meth:`Manager.get_proxy`. ``proxy.method(*args)`` runs ``method`` in
    the manager actor and returns its result (or raises its error), waiting at most
    ``timeout`` seconds.

    Attributes:
        manager_cls: The :class:`Manager` subclass the actor runs.
        actor: The Ray actor handle.
        timeout: Seconds each call may take (``None``: no limit).

    Example:
        >>> proxy = CollectiveManager.get_proxy(timeout=10.0)  # doctest: +SKIP
        >>> proxy.get_master_port_info("pair")  # runs in the manager actor  # doctest: +SKIP
        29555
    """

    def __init__(
        self, manager_cls: type[Manager], actor: ActorHandle[object], timeout: float | None
    ) -> None:
        self.manager_cls = manager_cls
        self.actor = actor
        self.timeout = timeout

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name.startswith("_") or not callable(getattr(self.manager_cls, name, None)):
            raise AttributeError(
                f"{self.manager_cls.__name__} has no public method {name!r} to call remotely"
            )
        method = getattr(self.actor, name)
        timeout = self.timeout

        def call(*args: object, **kwargs: object) -> Any:
            return ray.get(method.remote(*args, **kwargs), timeout=timeout)

        call.__name__ = name
        return call

    def __repr__(self) -> str:
        return f"<ManagerProxy {self.manager_cls.__name__} timeout={self.timeout}>"


class Manager:
    """Base of a job-wide singleton kept in a named Ray actor (RLinf's ``Manager``).

    Subclass it, set :attr:`MANAGER_NAME`, and give it public methods; every process
    of the job then calls them through ``MyManager.get_proxy()``. Constructing a
    manager (in its actor, or locally) first syncs :attr:`Cluster.NAMESPACE
    <p2p_worker.Cluster.NAMESPACE>` from ``$CLUSTER_NAMESPACE``, as RLinf's does.

    What differs from RLinf: RLinf's ``Cluster`` launches its managers when it starts;
    p2p's launches none. :meth:`get_proxy` creates the actor when none runs yet (owned
    by the calling process, so call it on the driver first for a manager that lives as
    long as the job), and every proxied call has a timeout.

    Example:
        >>> class Counter(Manager):
        ...     MANAGER_NAME = "Counter"
        ...     def __init__(self):
        ...         self.n = 0
        ...     def bump(self):
        ...         self.n += 1
        ...         return self.n
        >>> cluster = Cluster(num_nodes=1)  # doctest: +SKIP
        >>> Counter.get_proxy().bump()  # doctest: +SKIP
        1
    """

    MANAGER_NAME: ClassVar[str] = ""
    """The manager actor's name in the cluster's Ray namespace (set it in a subclass)."""

    ENV_LIST: ClassVar[tuple[str, ...]] = ("RAY_ADDRESS", NAMESPACE_ENV)
    """Environment variables copied from this process into the manager actor's."""

    _proxy: ClassVar[ManagerProxy | None] = None
    _proxy_pid: ClassVar[int | None] = None

    def __new__(cls, *args: object, **kwargs: object) -> Self:
        """Sync the cluster namespace from the environment, then create the object."""
        del args, kwargs
        cls.sync_cluster_namespace()
        return super().__new__(cls)

    @classmethod
    def sync_cluster_namespace(cls) -> None:
        """Set ``Cluster.NAMESPACE`` from ``$CLUSTER_NAMESPACE`` when that is set and not empty.

        Example:
            >>> import os
            >>> os.environ["CLUSTER_NAMESPACE"] = "jobs"
            >>> Manager.sync_cluster_namespace()
            >>> Cluster.NAMESPACE
            'jobs'
            >>> del os.environ["CLUSTER_NAMESPACE"]; Cluster.NAMESPACE = None
        """
        namespace = os.environ.get(NAMESPACE_ENV)
        if namespace:
            Cluster.NAMESPACE = namespace

    @classmethod
    def get_runtime_env_vars(cls) -> dict[str, str]:
        """The environment variables a manager actor is started with.

        Those of :attr:`ENV_LIST` that this process has, and ``CLUSTER_NAMESPACE`` set
        to ``Cluster.NAMESPACE`` whenever that is known (it wins over the environment).

        Returns:
            A new ``{name: value}`` dict, for a Ray ``runtime_env``'s ``env_vars``.

        Example:
            >>> Cluster.NAMESPACE = "jobs"
            >>> Manager.get_runtime_env_vars()["CLUSTER_NAMESPACE"]
            'jobs'
            >>> Cluster.NAMESPACE = None
        """
        env = {name: os.environ[name] for name in cls.ENV_LIST if name in os.environ}
        if Cluster.NAMESPACE is not None:
            env[NAMESPACE_ENV] = Cluster.NAMESPACE
        return env

    @classmethod
    def get_proxy(
        cls: type[M], no_wait: bool = False, *, timeout: float | None = DEFAULT_CALL_TIMEOUT
    ) -> ManagerProxy:
        """The proxy of this manager's actor, creating the actor if none runs yet.

        One proxy per class and process (a forked process makes its own).

        Args:
            no_wait: Do not create the actor: raise ``ValueError`` when none runs (RLinf's
                meaning: do not wait for one to appear).
            timeout: Seconds each call through the proxy may take (``None``: no limit);
                a longer call raises ``ray.exceptions.GetTimeoutError`` (a ``TimeoutError``).

        Returns:
            A :class:`ManagerProxy` whose methods are this class's public methods.

        Raises:
            ValueError: :attr:`MANAGER_NAME` is empty, or ``no_wait`` and no actor runs.
            ClusterError: This process is not connected to Ray (create a ``Cluster``).

        Example:
            >>> CollectiveManager.get_proxy().get_collective_group("x") is None  # doctest: +SKIP
            True
        """
        if not cls.MANAGER_NAME:
            raise ValueError(
                f"{cls.__name__}.MANAGER_NAME is empty; allowed: a non-empty actor name"
            )
        if timeout is not None and (isinstance(timeout, bool) or timeout <= 0):
            raise ValueError(f"timeout: got {timeout!r}; allowed: seconds > 0 or None")
        if not ray.is_initialized():
            raise ClusterError(
                f"{cls.__name__}.get_proxy(): this process is not connected to Ray; create a "
                f"Cluster first (or call it inside a worker)"
            )
        cls.sync_cluster_namespace()
        proxy = cls.__dict__.get("_proxy")
        if proxy is None or cls.__dict__.get("_proxy_pid") != os.getpid():
            proxy = ManagerProxy(cls, cls._find_or_create(no_wait), timeout)
            cls._proxy, cls._proxy_pid = proxy, os.getpid()
        elif proxy.timeout != timeout:
            proxy = ManagerProxy(cls, proxy.actor, timeout)
        return proxy

    @classmethod
    def _find_or_create(cls, no_wait: bool) -> ActorHandle[object]:
        try:
            return ray.get_actor(cls.MANAGER_NAME, namespace=Cluster.NAMESPACE)
        except ValueError:
            if no_wait:
                raise ValueError(
                    f"no manager actor named {cls.MANAGER_NAME!r} runs in Ray namespace "
                    f"{Cluster.NAMESPACE!r} (no_wait=True: not creating one)"
                ) from None
        actor_cls = ray.remote(cls)
        handle = actor_cls.options(
            name=cls.MANAGER_NAME,
            namespace=Cluster.NAMESPACE,
            get_if_exists=True,
            num_cpus=0,
            max_restarts=0,
            runtime_env={"env_vars": cls.get_runtime_env_vars()},
        ).remote()
        return cast("ActorHandle[object]", handle)  # Ray types it as a class or a handle
