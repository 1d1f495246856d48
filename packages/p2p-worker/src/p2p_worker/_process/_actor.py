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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import ray
import ray.cloudpickle

from p2p_worker._info import WorkerInfo
from p2p_worker._job._cluster import NAMESPACE_ENV, Cluster
from p2p_worker._process._timer import collect_durations
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
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


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


def _shim_init(self: Any, boot: Boot) -> None:
    ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    self._p2p_probe_result = Probe(
        ray_node_id=ray.get_runtime_context().get_node_id(),
        ip=ip,
        gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()),
        pid=os.getpid(),
        port=_free_port(ip) if boot.reserve_port else None,
    )


Reply = tuple[bool, Any, dict[str, float]]


def _p2p_probe(self: Any) -> Reply:
    return (True, self._p2p_probe_result, {})


def _p2p_setup(self: Any, setup: Setup) -> Reply:
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
            self._p2p_worker_cls.__init__(self, *setup.args, **setup.kwargs)
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
    self: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Reply:
    if kwargs is None:  # arguments were put in the object store once for the whole group
        args, kwargs = args
    return run_method(self, method, args, kwargs)


async def _p2p_acall(
    self: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None
) -> Reply:
    if kwargs is None:
        args, kwargs = args
    return await run_coroutine_method(self, method, args, kwargs)


def dispatcher_name(method: str) -> str:
    """Name of the actor method that runs worker method ``method`` through the protocol."""
    return f"_p2p__{method}"


def _make_dispatcher(method: str, is_async: bool) -> Any:
    # One actor method per worker method: a call then carries only the user's arguments
    # (every extra Ray argument costs tens of microseconds). A coroutine method gets a
    # coroutine dispatcher, which Ray awaits on the actor's event loop.
    if is_async:

        async def adispatch(self: Any, *args: Any, **kwargs: Any) -> Reply:
            return await run_coroutine_method(self, method, args, kwargs)

        adispatch.__name__ = adispatch.__qualname__ = dispatcher_name(method)
        return adispatch

    def dispatch(self: Any, *args: Any, **kwargs: Any) -> Reply:
        return run_method(self, method, args, kwargs)

    dispatch.__name__ = dispatch.__qualname__ = dispatcher_name(method)
    return dispatch


async def run_coroutine_method(
    self: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
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


def run_method(self: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Reply:
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


def _p2p_shutdown(self: Any) -> None:
    runtime = self.__dict__.get("_p2p_runtime")
    if runtime is not None:
        runtime.close()


def _p2p_ping(self: Any) -> int:
    return os.getpid()


_ACTOR_CLASSES: dict[type, Any] = {}


def is_async_method(func: Any) -> bool:
    """Whether ``func`` is an ``async def`` function (seen through ``functools.wraps``)."""
    return inspect.iscoroutinefunction(inspect.unwrap(func)) or inspect.iscoroutinefunction(func)


def make_shim_class(worker_cls: type, methods: Mapping[str, Any] | Iterable[str] = ()) -> type:
    """Return the class a worker actor instantiates: ``worker_cls`` plus the protocol.

    It subclasses ``worker_cls`` under the same name, replaces ``__init__`` by the boot
    step and adds the ``_p2p_*`` methods, including one dispatcher per name in
    ``methods``.
    """
    namespace: dict[str, Any] = {
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
    funcs = methods if isinstance(methods, Mapping) else dict.fromkeys(methods)
    for method, func in funcs.items():
        namespace[dispatcher_name(method)] = _make_dispatcher(
            method, func is not None and is_async_method(func)
        )
    if any(func is not None and is_async_method(func) for func in funcs.values()):
        # Only then: one coroutine method makes Ray run the whole actor on an event loop.
        namespace["_p2p_acall"] = _p2p_acall
    return type(worker_cls.__name__, (worker_cls,), namespace)


def make_actor_class(worker_cls: type, methods: Mapping[str, Any] | Iterable[str] = ()) -> Any:
    """Return the Ray actor class for ``worker_cls`` (one per class, cached).

    The actor runs :func:`make_shim_class`'s class and has a control concurrency group,
    so shutdown and pings get through while a method blocks.
    """
    cached = _ACTOR_CLASSES.get(worker_cls)
    if cached is not None:
        return cached
    shim = make_shim_class(worker_cls, methods)
    actor_cls = ray.remote(concurrency_groups={CONTROL_GROUP: 2})(shim)  # type: ignore[call-overload]
    _ACTOR_CLASSES[worker_cls] = actor_cls
    return actor_cls
