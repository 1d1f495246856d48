"""WorkerGroup: create a group of workers of one class and call them all at once."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

import ray
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from p2p_worker._address import WorkerAddress, check_group_name
from p2p_worker._errors import WorkerError
from p2p_worker._groups._args import looks_large
from p2p_worker._groups._group_start import (
    build_setups,
    check_max_concurrency,
    check_strategy,
    reserve,
    wait_exit,
)
from p2p_worker._groups._handle import GroupCallHandle
from p2p_worker._groups._members import WorkerRank, public_methods
from p2p_worker._info import NodeInfo, WorkerInfo
from p2p_worker._job._cluster import Cluster
from p2p_worker._job._placement import (
    NodeCapacity,
    NodePlacementStrategy,
    PlacementStrategy,
    WorkerPlacement,
    default_placement,
)
from p2p_worker._process._actor import (
    CONTROL_GROUP,
    Boot,
    Probe,
    Reply,
    WorkerActor,
    dispatcher_name,
    is_async_method,
    make_actor_class,
)
from p2p_worker._process._worker_base import WorkerBase
from p2p_worker._runtime._state import JobContext, WorkerRuntime, current_runtime

W = TypeVar("W", bound=WorkerBase)


class WorkerGroup(Generic[W]):
    """A group of workers of one :class:`Worker` class, called as one.

    Create it with ``MyWorker.create_group(*init_args, **init_kwargs)`` and start it with
    :meth:`launch`. Every public method of the worker class then becomes a method of
    the group that runs on all its workers in parallel and returns a
    :class:`GroupCallHandle` (``wait()`` gives the per-rank results as a list).
    :meth:`execute_on` restricts the next call to some ranks. A method whose name
    clashes with the group's own API (``launch``, ``shutdown``, ``name``, ...) is
    reached with :meth:`call`.

    A worker can launch a group of children from one of its methods with
    :meth:`launch_children`: child ``r`` of worker ``trainer:0`` is ``trainer:0:r``.

    Attributes:
        worker_cls: The worker class.
        name: The group name once launched: the root of its workers' addresses, or for
            a child group the address of the worker that launched it (``"trainer:0"``).
        cluster: The cluster it runs on, once launched (``None`` for a child group).

    Example:
        >>> group = MyWorker.create_group(lr=0.1).launch(cluster, name="trainer")  # doctest: +SKIP
        >>> group.execute_on(0, 3).hello().wait()  # doctest: +SKIP
        [0, 3]
    """

    def __init__(
        self, worker_cls: type[W], args: tuple[object, ...], kwargs: dict[str, object]
    ) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, WorkerBase)):
            raise TypeError(f"worker_cls must be a subclass of Worker, got {worker_cls!r}")
        self.worker_cls = worker_cls
        self._init_args = args
        self._init_kwargs = kwargs
        self.name: str = ""
        self.cluster: Cluster | None = None
        self._address: WorkerAddress | None = None  # of the group: its workers' parent
        self._nodes: list[NodeInfo] = []
        self._parent_runtime: WorkerRuntime | None = None  # set for a child group
        self._placements: list[WorkerPlacement] = []
        self._ray_node_ids: list[str] = []
        self._actors: list[WorkerActor] = []
        self._probes: list[Probe] = []
        self._infos: list[WorkerInfo] = []
        self._pg: PlacementGroup | None = None
        self._methods: dict[str, Callable[..., object]] = {}
        self._next_ranks: tuple[int, ...] | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- launching -------------------------------------------------------------------------

    @property
    def launched(self) -> bool:
        """Whether the workers run (launched and not shut down)."""
        return self._address is not None and not self._closed

    @property
    def parent_address(self) -> WorkerAddress | None:
        """The address of the worker that launched this group, or ``None`` for a root group."""
        return self._address if self._address is not None and self._address.ranks else None

    def launch(
        self,
        cluster: Cluster,
        placement_strategy: PlacementStrategy | None = None,
        name: str | None = None,
        max_concurrency: int | None = None,
        isolate_gpu: bool = True,
        catch_system_failure: bool | None = None,
        disable_distributed_log: bool = False,
        *,
        runtime_env: Mapping[str, object] | None = None,
        timeout: float | None = 120.0,
    ) -> WorkerGroup[W]:
        """Start the workers on ``cluster`` and return this group.

        Resources are checked against the cluster first (a request that cannot fit
        raises :class:`PlacementError` before anything starts), then reserved at once in
        a Ray placement group. Each worker's environment is set before its ``__init__``
        runs; if any worker fails to start, every worker of the group is stopped.

        Args:
            cluster: The :class:`Cluster` to run on.
            placement_strategy: Where the workers go; default: one worker per GPU of
                the cluster, or one CPU-only worker on a cluster without GPUs.
            name: Group name (letters, digits, ``_ . -``); default
                ``"Worker_group_<ClassName>"``.
            max_concurrency: Methods one worker may run at once; ``None`` (default)
                takes Ray's default, as RLinf does: 1 for a class without ``async def``
                methods (one at a time, in call order) and 1000 coroutines on the event
                loop for one with them. More than 1 lets sync methods overlap in
                threads, in no guaranteed order.
            isolate_gpu: RLinf's flag, accepted for compatibility: a GPU worker here
                always sees the GPUs of its group on its node (see
                ``WorkerInfo.available_gpus``).
            catch_system_failure: RLinf's flag, accepted for compatibility; a worker's
                exception (``SystemExit`` included) always comes back as a
                :class:`WorkerError` with its traceback.
            disable_distributed_log: RLinf's flag, accepted for compatibility; worker
                output goes where Ray sends it.
            runtime_env: A Ray runtime environment for the workers (``env_vars``,
                ``pip``, ...); note that workers with one start in fresh processes.
            timeout: Seconds for the whole launch (reservation, start, ``__init__``).

        Returns:
            This group, launched.

        Raises:
            TypeError: An argument has the wrong type.
            ValueError: The group is already launched, or the name is invalid or in use.
            PlacementError: The cluster lacks the resources, or they stay held by others
                past ``timeout``.
            WorkerError: A worker failed to start (its ``__init__`` raised, its codec
                library is missing, its process died) or the launch timed out.

        Example:
            >>> group = MyWorker.create_group().launch(  # doctest: +SKIP
            ...     cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="trainer"
            ... )
        """
        self._check_not_launched()
        if not isinstance(cluster, Cluster):
            raise TypeError(f"cluster must be a Cluster, got {type(cluster).__name__}")
        for flag, value in (
            ("isolate_gpu", isolate_gpu),
            ("disable_distributed_log", disable_distributed_log),
            ("catch_system_failure", catch_system_failure),
        ):
            optional = flag == "catch_system_failure" and value is None
            if not isinstance(value, bool) and not optional:
                raise TypeError(f"{flag} must be a bool, got {value!r}")
        check_max_concurrency(max_concurrency)
        group_name = check_group_name(
            f"Worker_group_{self.worker_cls.__name__}" if name is None else name
        )
        cluster._check_open()
        if cluster._name_taken(group_name):
            raise ValueError(
                f"name={group_name!r}: a group of that name is already running; shut it "
                f"down first or pick another name"
            )
        strategy = (
            default_placement(cluster.nodes) if placement_strategy is None else (placement_strategy)
        )
        check_strategy(strategy)
        placements = strategy.plan(cluster._capacity())
        self._placements = placements
        self._ray_node_ids = [cluster.nodes[p.node_rank].ray_node_id for p in placements]
        self.name = group_name
        cluster._register(self)
        self.cluster = cluster
        job = cluster._job_context()
        self._run(WorkerAddress(group_name), job, strategy, max_concurrency, runtime_env, timeout)
        return self

    def launch_children(
        self,
        placement_strategy: PlacementStrategy | None = None,
        max_concurrency: int | None = None,
        *,
        runtime_env: Mapping[str, object] | None = None,
        timeout: float | None = 120.0,
    ) -> WorkerGroup[W]:
        """Start the workers as children of the worker whose method calls this.

        Call it inside a method of a launched worker. Child ``r`` gets the address
        ``<parent address>:r`` (``trainer:0:1`` for child 1 of ``trainer:0``), and the
        group's :attr:`name` is the parent's address, which ``send``/``recv`` take as a
        group name: ``self.send(x, "trainer:0", 1)`` and ``self.send(x, "trainer", (0, 1))``
        reach the same child from any worker of the job. Children share the job's
        rendezvous store, token and configuration, and get their own ``MASTER_ADDR``,
        ``RANK``, ``WORLD_SIZE``, ... like any group. Resources are reserved in a Ray
        placement group as for :meth:`launch`.

        A worker runs one child group at a time. Shutting the parent's group down (or
        the cluster) shuts its children down first. If the parent's process dies, Ray
        ends the child processes with it.

        Args:
            placement_strategy: Where the children go; default: one CPU-only child on
                the parent's node.
            max_concurrency: As for :meth:`launch`.
            runtime_env: As for :meth:`launch`.
            timeout: Seconds for the whole launch.

        Returns:
            This group, launched.

        Raises:
            WorkerError: Called outside a launched worker (on the driver, for instance:
                use :meth:`launch` there), the parent is shutting down, or a child
                failed to start.
            TypeError: An argument has the wrong type.
            ValueError: The group is already launched, or this worker already runs a
                live child group.
            PlacementError: The cluster lacks the resources, or they stay held past
                ``timeout``.

        Example:
            >>> class Trainer(Worker):
            ...     def spawn(self):
            ...         self.kids = Helper.create_group().launch_children(
            ...             PackedPlacementStrategy(2, cpus_per_worker=0)
            ...         )
            ...         return self.kids.name  # "trainer:0" in trainer rank 0
        """
        self._check_not_launched()
        runtime = current_runtime()
        if runtime is None:
            raise WorkerError(
                f"{self.worker_cls.__name__}.create_group().launch_children() runs inside a "
                f"method of a launched worker (children extend their parent's address); "
                f"this process is no launched worker: on the driver use .launch(cluster)"
            )
        check_max_concurrency(max_concurrency)
        job, parent = runtime.job, runtime.address
        if placement_strategy is None:
            node = next((n.node_rank for n in job.nodes if n.ip == runtime.node_ip), 0)
            placement_strategy = NodePlacementStrategy([node])
        check_strategy(placement_strategy)
        capacity = [NodeCapacity(n, n.num_cpus, float(n.num_gpus)) for n in job.nodes]
        placements = placement_strategy.plan(capacity)
        self._placements = placements
        self._ray_node_ids = [job.nodes[p.node_rank].ray_node_id for p in placements]
        runtime.adopt(self)  # refuses a second live child group
        self._parent_runtime = runtime
        self.name = parent.get_name()
        self._run(parent, job, placement_strategy, max_concurrency, runtime_env, timeout)
        return self

    def _check_not_launched(self) -> None:
        if self._address is not None or self._closed:
            raise ValueError(f"this group was already launched as {self.name!r}")

    def _run(
        self,
        address: WorkerAddress,
        job: JobContext,
        strategy: PlacementStrategy,
        max_concurrency: int | None,
        runtime_env: Mapping[str, object] | None,
        timeout: float | None,
    ) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        self._address = address
        self._nodes = list(job.nodes)
        try:
            self._start(job, strategy, max_concurrency, runtime_env, deadline, timeout)
        except BaseException:
            self._teardown(graceful=False, timeout=10.0)
            raise
        for method_name in self._methods:
            if not hasattr(type(self), method_name):
                setattr(self, method_name, self._make_method(method_name))

    def _start(
        self,
        job: JobContext,
        strategy: PlacementStrategy,
        max_concurrency: int | None,
        runtime_env: Mapping[str, object] | None,
        deadline: float | None,
        timeout: float | None,
    ) -> None:
        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        self._pg = reserve(self.name, self._nodes, self._placements, strategy, timeout, left())
        self._methods = public_methods(self.worker_cls)
        actor_cls = make_actor_class(self.worker_cls, self._methods)
        for p in self._placements:
            address = self._worker_address(p.rank).get_name()
            options: dict[str, object] = {
                "name": address,
                "num_cpus": p.num_cpus,
                "num_gpus": p.num_gpus,
                "max_restarts": 0,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=p.rank
                ),
            }
            if max_concurrency is not None:
                options["max_concurrency"] = max_concurrency
            if runtime_env is not None:
                options["runtime_env"] = runtime_env
            try:
                actor = actor_cls.options(**options).remote(Boot(self.name, p.rank, p.rank == 0))
            except ValueError as exc:
                raise ValueError(
                    f"name={self.name!r}: cannot create Ray actor {address!r}: {exc}"
                ) from exc
            self._actors.append(actor)
        probes = cast(
            "list[Probe]", self._gather([a._p2p_probe.remote() for a in self._actors], left())
        )
        self._probes = probes
        assert self._address is not None  # set at launch
        setups = build_setups(
            job, self._address, self._placements, probes, self._init_args, self._init_kwargs
        )
        self._infos = [s.info for s in setups]
        self._gather(
            [a._p2p_setup.remote(s) for a, s in zip(self._actors, setups, strict=True)], left()
        )

    def _gather(self, refs: list[ray.ObjectRef[Reply]], timeout: float | None) -> list[object]:
        handle = GroupCallHandle(self.name, "__init__", list(range(len(refs))), refs)
        try:
            return handle.wait(timeout)
        except WorkerError:
            raise
        except TimeoutError as exc:
            raise WorkerError(
                f"group {self.name!r}: the workers did not start within the launch timeout",
                group_name=self.name,
                method="__init__",
            ) from exc

    def _worker_address(self, rank: int) -> WorkerAddress:
        assert self._address is not None  # set at launch
        return self._address.get_child_address(rank)

    # -- calling ---------------------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """Number of workers in the group."""
        return len(self._placements)

    def __len__(self) -> int:
        return self.world_size

    @property
    def worker_infos(self) -> list[WorkerInfo]:
        """The :class:`WorkerInfo` of every worker, by rank."""
        return list(self._infos)

    @property
    def worker_info_list(self) -> list[WorkerRank]:
        """One :class:`WorkerRank` per worker, by rank: RLinf's ``worker_info_list``.

        Each entry has ``worker`` (the Ray actor handle, as RLinf gives) and ``rank``,
        plus ``info`` (the :class:`WorkerInfo`). The actor's own methods can be called
        with plain Ray (``entry.worker.method.remote()``) and return the raw result.

        Example:
            >>> [w.rank for w in group.worker_info_list]  # doctest: +SKIP
            [0, 1]
        """
        return [
            WorkerRank(cast("ActorHandle[object]", a), i.rank, i)
            for a, i in zip(self._actors, self._infos, strict=True)
        ]

    @property
    def worker_group_name(self) -> str:
        """RLinf's name for :attr:`name`."""
        return self.name

    @property
    def actors(self) -> list[ActorHandle[W]]:
        """The Ray actor handles of the workers, by rank (for plain Ray calls)."""
        return [cast("ActorHandle[W]", a) for a in self._actors]

    def execute_on(self, *ranks: int) -> WorkerGroup[W]:
        """Restrict the next call on this group to ``ranks`` (in that result order).

        Args:
            *ranks: Distinct ranks in ``range(world_size)``.

        Returns:
            This group, so ``group.execute_on(0, 3).hello()`` reads naturally.

        Raises:
            TypeError: A rank is not an int.
            ValueError: No rank given, a rank is out of range, or repeated.
            WorkerError: The group is not launched.

        Example:
            >>> group.execute_on(0, 3).hello().wait()  # doctest: +SKIP
            [0, 3]
        """
        self._check_launched()
        if not ranks:
            raise ValueError("execute_on() needs at least one rank")
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int):
                raise TypeError(f"execute_on ranks must be ints, got {r!r}")
            if not 0 <= r < self.world_size:
                raise ValueError(
                    f"execute_on rank {r} is out of range for group {self.name!r} "
                    f"(ranks 0..{self.world_size - 1})"
                )
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"execute_on ranks must be distinct, got {list(ranks)}")
        with self._lock:
            self._next_ranks = tuple(ranks)
        return self

    def call(self, method: str, *args: object, **kwargs: object) -> GroupCallHandle:
        """Run ``method(*args, **kwargs)`` on the workers; same as ``group.<method>(...)``.

        Args:
            method: Name of a public method of the worker class.
            *args: Positional arguments, passed to every worker.
            **kwargs: Keyword arguments, passed to every worker.

        Returns:
            A :class:`GroupCallHandle` on the call.

        Raises:
            ValueError: ``method`` is not a public method of the worker class.
            WorkerError: The group is not launched.

        Example:
            >>> group.call("shutdown").wait()  # a worker method named like the group's  # doctest: +SKIP
        """  # noqa: E501
        self._check_launched()
        if method not in self._methods:
            raise ValueError(
                f"method={method!r} is not a public method of {self.worker_cls.__name__}; "
                f"public methods: {sorted(self._methods)}"
            )
        return self._invoke(method, args, kwargs)

    def _make_method(self, method: str) -> Callable[..., GroupCallHandle]:
        def group_method(*args: object, **kwargs: object) -> GroupCallHandle:
            self._check_launched()
            return self._invoke(method, args, kwargs)

        group_method.__name__ = method
        group_method.__qualname__ = f"{type(self).__name__}.{method}"
        group_method.__doc__ = self._methods[method].__doc__
        return group_method

    def _invoke(
        self, method: str, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> GroupCallHandle:
        with self._lock:
            ranks = self._next_ranks or tuple(range(self.world_size))
            self._next_ranks = None
        if len(ranks) > 1 and looks_large(args, kwargs):
            packed = ray.put((args, kwargs))
            call = "_p2p_acall" if is_async_method(self._methods[method]) else "_p2p_call"
            refs: list[ray.ObjectRef[Reply]] = [
                getattr(self._actors[r], call).remote(method, packed) for r in ranks
            ]
        else:
            name = dispatcher_name(method)
            refs = [getattr(self._actors[r], name).remote(*args, **kwargs) for r in ranks]
        return GroupCallHandle(self.name, method, ranks, refs)

    def _check_launched(self) -> None:
        if self._address is None:
            raise WorkerError(
                f"this {self.worker_cls.__name__} group is not launched; call "
                f".launch(cluster) first"
            )
        if self._closed:
            raise WorkerError(f"group {self.name!r} was shut down", group_name=self.name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        cls = self.__dict__.get("worker_cls")
        if cls is not None and name in public_methods(cls):
            self._check_launched()
        raise AttributeError(
            f"{type(self).__name__} has no attribute {name!r} (it is not a public method of "
            f"{getattr(cls, '__name__', '?')})"
        )

    # -- teardown --------------------------------------------------------------------------

    def shutdown(self, *, timeout: float | None = 30.0) -> None:
        """Stop every worker of the group and release its resources. Idempotent.

        Each worker first closes its Collective (this runs even while a method blocks),
        then its actor is killed and the placement group removed. On the driver's node
        this waits until the worker processes have exited.

        Args:
            timeout: Seconds to wait for the workers to close and exit.
        """
        if self._address is None or self._closed:
            return
        self._teardown(graceful=True, timeout=30.0 if timeout is None else timeout)

    def _close(self) -> None:
        """RLinf's private name for :meth:`shutdown` (its test fixtures call it)."""
        self.shutdown()

    def _teardown(self, *, graceful: bool, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._closed = True
        if graceful and self._actors:
            refs = [
                a._p2p_shutdown.options(concurrency_group=CONTROL_GROUP).remote()
                for a in self._actors
            ]
            with contextlib.suppress(ray.exceptions.RayError):
                ray.wait(refs, num_returns=len(refs), timeout=min(timeout, 10.0))
        for actor in self._actors:
            with contextlib.suppress(ray.exceptions.RayError):
                ray.kill(cast("ActorHandle[object]", actor), no_restart=True)
        if self._pg is not None:
            with contextlib.suppress(ray.exceptions.RayError):
                remove_placement_group(self._pg)
        here = ray.get_runtime_context().get_node_id()
        local_pids = [p.pid for p in self._probes if p.ray_node_id == here]
        wait_exit(local_pids, deadline)
        if self.cluster is not None:
            self.cluster._unregister(self)
        if self._parent_runtime is not None:
            self._parent_runtime.release(self)

    def __enter__(self) -> WorkerGroup[W]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        if self._address is None:
            return f"<WorkerGroup of {self.worker_cls.__name__}, not launched>"
        state = "shut down" if self._closed else f"{self.world_size} workers"
        return f"<WorkerGroup {self.name!r} of {self.worker_cls.__name__}, {state}>"
