"""The Ray actor behind a Worker: a thin subclass that sets the stage before ``__init__``.

A group starts each worker in two steps. The actor is created with a small boot
record; its constructor only records where Ray put it (node, GPUs, pid) and, for rank 0,
reserves a free port. The driver gathers those facts from every rank, computes the
environment (``MASTER_ADDR``, ``LOCAL_RANK``, visible GPUs, ...), and calls
``_p2p_setup`` on each actor, which sets ``os.environ`` and the worker's attributes and
only then runs the user's ``__init__``. Calls go through ``_p2p_call``, which times
them and turns exceptions into a failure record with the formatted traceback.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import socket
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeAlias, cast

import ray
import ray.cloudpickle

from p2p_worker._address import WorkerAddress
from p2p_worker._info import WorkerInfo
from p2p_worker._job._cluster import NAMESPACE_ENV, Cluster
from p2p_worker._process._timer import collect_durations
from p2p_worker._remote import RemoteMethod
from p2p_worker._runtime._state import JobContext, WorkerRuntime, probe_codec, set_current_runtime

CONTROL_GROUP = "p2p_ctl"


@dataclass(frozen=True)
class Boot:
    """Constructor argument of a worker actor."""

    group_name: str
    rank: int
    reserve_port: bool


@dataclass(frozen=True)
class Probe:
    """Where Ray placed a worker actor."""

    ray_node_id: str
    ip: str
    gpu_ids: tuple[str, ...]
    pid: int
    port: int | None


@dataclass(frozen=True)
class Setup:
    """Everything a worker needs before its user ``__init__`` runs."""

    job: JobContext
    info: WorkerInfo
    env: dict[str, str]
    cuda_visible_devices: str | None
    args: tuple[object, ...] = ()
    kwargs: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Failure:
    """An exception raised in a worker, in a form that always crosses the Ray boundary."""

    exc_type: str
    message: str
    traceback: str
    exc: BaseException | None


def make_failure(exc: BaseException) -> Failure:
    """Capture ``exc`` with its formatted traceback; keep the object if it pickles."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    kept: BaseException | None = exc
    try:
        ray.cloudpickle.loads(ray.cloudpickle.dumps(exc))  # type: ignore[no-untyped-call]
    except Exception:
        kept = None
    return Failure(type(exc).__qualname__, str(exc), tb, kept)


def _free_port(ip: str) -> int:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


def _loopback_interface() -> str | None:
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:  # pragma: no cover - platform without if_nameindex
        return None
    return next((n for n in ("lo", "lo0") if n in names), None)


# The functions below become methods of the actor class (see make_actor_class).


class _Shim(Protocol):
    """What the functions below read and set on the worker object they run as methods of."""

    _p2p_worker_cls: type
    _p2p_probe_result: Probe
    _p2p_info: WorkerInfo
    _p2p_runtime: WorkerRuntime
    _p2p_local_durations: dict[str, float]
    _rank: int
    _world_size: int
    _group_name: str
    _worker_address: WorkerAddress
    _worker_name: str
    _cluster_node_rank: int
    _local_accelerator_rank: int
    _node_local_rank: int

    def _load_user_extensions(self) -> None: ...


def _shim_init(self: _Shim, boot: Boot) -> None:
    ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    self._p2p_probe_result = Probe(
        ray_node_id=ray.get_runtime_context().get_node_id(),
        ip=ip,
        gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()),
        pid=os.getpid(),
        port=_free_port(ip) if boot.reserve_port else None,
    )


Reply: TypeAlias = tuple[bool, object, dict[str, float]]
"""``(ok, the method's result or a Failure, timer durations)``."""

Packed: TypeAlias = tuple[tuple[object, ...], dict[str, object]]
"""A call's ``(args, kwargs)``, put in the object store once for a whole group."""


class WorkerActor(Protocol):
    """The Ray actor handle of a worker (see :func:`make_actor_class`).

    Its ``_p2p_*`` methods run the protocol; any other name is a method of the user's
    class (its raw result) or a dispatcher (``dispatcher_name``, a :data:`Reply`).
    """

    @property
    def _p2p_probe(self) -> RemoteMethod[..., Reply]: ...
    @property
    def _p2p_setup(self) -> RemoteMethod[..., Reply]: ...
    @property
    def _p2p_call(self) -> RemoteMethod[..., Reply]: ...
    @property
    def _p2p_acall(self) -> RemoteMethod[..., Reply]: ...
    @property
    def _p2p_shutdown(self) -> RemoteMethod[..., None]: ...
    @property
    def _p2p_ping(self) -> RemoteMethod[..., int]: ...

    def __getattr__(self, name: str) -> RemoteMethod[..., object]: ...


class _ActorCreator(Protocol):
    def remote(self, boot: Boot) -> WorkerActor: ...


class WorkerActorClass(Protocol):
    """The Ray actor class of a worker class (see :func:`make_actor_class`)."""

    def options(self, **options: object) -> _ActorCreator: ...


def _p2p_probe(self: _Shim) -> Reply:
    return (True, self._p2p_probe_result, {})


def _p2p_setup(self: _Shim, setup: Setup) -> Reply:
    try:
        os.environ.update(setup.env)
        if setup.cuda_visible_devices is not None and not _cuda_initialized():
            os.environ["CUDA_VISIBLE_DEVICES"] = setup.cuda_visible_devices
        if setup.info.node_ip == "127.0.0.1" and "GLOO_SOCKET_IFNAME" not in os.environ:
            iface = _loopback_interface()
            if iface is not None:
                os.environ["GLOO_SOCKET_IFNAME"] = iface
        runtime = WorkerRuntime(setup.job, setup.info.address, setup.info.node_ip)
        self._rank = setup.info.rank
        self._world_size = setup.info.world_size
        # Attributes RLinf workers read (its tests compare and route with them).
        # A root worker's group is its root group; a child's is its parent's address.
        self._group_name = str(setup.info.address.get_parent_address())
        self._worker_address = setup.info.address
        self._worker_name = setup.info.address.get_name()
        self._cluster_node_rank = setup.info.node_id
        gpu = setup.info.gpu_id
        self._local_accelerator_rank = -1 if gpu is None else gpu
        self._node_local_rank = int(setup.env.get("NODE_LOCAL_RANK", setup.info.local_rank))
        _share_namespace()
        self._p2p_info = setup.info
        self._p2p_runtime = runtime
        self._p2p_local_durations = {}
        set_current_runtime(runtime)
        probe_codec(setup.job.codec_name)
    except BaseException as exc:
        return (False, make_failure(exc), {})
    with collect_durations() as durations:
        try:
            self._load_user_extensions()
            # The user's own __init__ on this subclass instance (the shim replaced it).
            self._p2p_worker_cls.__init__(self, *setup.args, **setup.kwargs)  # type: ignore[misc]
        except BaseException as exc:
            return (False, make_failure(exc), dict(durations))
    return (True, None, dict(durations))


def _share_namespace() -> None:
    """Give this worker its job's Ray namespace in ``Cluster.NAMESPACE`` and the environment."""
    namespace = str(ray.get_runtime_context().namespace)
    os.environ[NAMESPACE_ENV] = namespace
    Cluster.NAMESPACE = namespace


def _cuda_initialized() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def _p2p_call(
    self: object,
    method: str,
    args: tuple[object, ...] | Packed,
    kwargs: dict[str, object] | None = None,
) -> Reply:
    if kwargs is None:  # arguments were put in the object store once for the whole group
        args, kwargs = cast("Packed", args)
    return run_method(self, method, args, kwargs)


async def _p2p_acall(
    self: object,
    method: str,
    args: tuple[object, ...] | Packed,
    kwargs: dict[str, object] | None = None,
) -> Reply:
    if kwargs is None:
        args, kwargs = cast("Packed", args)
    return await run_coroutine_method(self, method, args, kwargs)


def dispatcher_name(method: str) -> str:
    """Name of the actor method that runs worker method ``method`` through the protocol."""
    return f"_p2p__{method}"


def _make_dispatcher(method: str, is_async: bool) -> Callable[..., object]:
    # One actor method per worker method: a call then carries only the user's arguments
    # (every extra Ray argument costs tens of microseconds). A coroutine method gets a
    # coroutine dispatcher, which Ray awaits on the actor's event loop.
    if is_async:

        async def adispatch(self: object, *args: object, **kwargs: object) -> Reply:
            return await run_coroutine_method(self, method, args, kwargs)

        adispatch.__name__ = adispatch.__qualname__ = dispatcher_name(method)
        return adispatch

    def dispatch(self: object, *args: object, **kwargs: object) -> Reply:
        return run_method(self, method, args, kwargs)

    dispatch.__name__ = dispatch.__qualname__ = dispatcher_name(method)
    return dispatch


async def run_coroutine_method(
    self: object, method: str, args: tuple[object, ...], kwargs: dict[str, object]
) -> Reply:
    """Await ``method`` on the running loop; return what :func:`run_method` returns."""
    with collect_durations() as durations:
        try:
            result = getattr(self, method)(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            return (False, make_failure(exc), dict(durations))
    return (True, result, dict(durations))


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_method(
    self: object, method: str, args: tuple[object, ...], kwargs: dict[str, object]
) -> Reply:
    """Run ``method`` and return ``(ok, result or Failure, timer durations)``."""
    with collect_durations() as durations:
        try:
            result = getattr(self, method)(*args, **kwargs)
            if inspect.iscoroutine(result):
                if _running_loop() is not None:
                    result.close()
                    raise TypeError(
                        f"{method}() returned a coroutine on the actor's event loop; declare "
                        f"it `async def` so the worker awaits it there"
                    )
                result = asyncio.run(result)
        except BaseException as exc:
            return (False, make_failure(exc), dict(durations))
    return (True, result, dict(durations))


def _p2p_shutdown(self: object) -> None:
    runtime = self.__dict__.get("_p2p_runtime")
    if runtime is not None:
        runtime.close()


def _p2p_ping(self: object) -> int:
    return os.getpid()


_ACTOR_CLASSES: dict[type, WorkerActorClass] = {}


def is_async_method(func: Callable[..., object]) -> bool:
    """Whether ``func`` is an ``async def`` function (seen through ``functools.wraps``)."""
    return inspect.iscoroutinefunction(inspect.unwrap(func)) or inspect.iscoroutinefunction(func)


def make_shim_class(
    worker_cls: type, methods: Mapping[str, Callable[..., object]] | Iterable[str] = ()
) -> type:
    """Return the class a worker actor instantiates: ``worker_cls`` plus the protocol.

    It subclasses ``worker_cls`` under the same name, replaces ``__init__`` by the boot
    step and adds the ``_p2p_*`` methods, including one dispatcher per name in
    ``methods``.
    """
    namespace: dict[str, object] = {
        "__init__": _shim_init,
        "__module__": worker_cls.__module__,
        "__qualname__": worker_cls.__qualname__,
        "__doc__": worker_cls.__doc__,
        "_p2p_worker_cls": worker_cls,
        "_p2p_probe": _p2p_probe,
        "_p2p_setup": _p2p_setup,
        "_p2p_call": _p2p_call,
        "_p2p_shutdown": _p2p_shutdown,
        "_p2p_ping": _p2p_ping,
    }
    funcs: Mapping[str, Callable[..., object] | None] = (
        methods if isinstance(methods, Mapping) else dict.fromkeys(methods)
    )
    for method, func in funcs.items():
        namespace[dispatcher_name(method)] = _make_dispatcher(
            method, func is not None and is_async_method(func)
        )
    if any(func is not None and is_async_method(func) for func in funcs.values()):
        # Only then: one coroutine method makes Ray run the whole actor on an event loop.
        namespace["_p2p_acall"] = _p2p_acall
    return type(worker_cls.__name__, (worker_cls,), namespace)


def make_actor_class(
    worker_cls: type, methods: Mapping[str, Callable[..., object]] | Iterable[str] = ()
) -> WorkerActorClass:
    """Return the Ray actor class for ``worker_cls`` (one per class, cached).

    The actor runs :func:`make_shim_class`'s class and has a control concurrency group,
    so shutdown and pings get through while a method blocks.
    """
    cached = _ACTOR_CLASSES.get(worker_cls)
    if cached is not None:
        return cached
    shim = make_shim_class(worker_cls, methods)
    remote = ray.remote(concurrency_groups={CONTROL_GROUP: 2})  # type: ignore[call-overload]
    actor_cls = cast("WorkerActorClass", remote(shim))
    _ACTOR_CLASSES[worker_cls] = actor_cls
    return actor_cls
