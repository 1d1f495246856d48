"""Finding, attaching to, or starting the Ray cluster a job runs on."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import sys
from collections.abc import Iterator
from typing import Any, TypedDict

import ray

from p2p_worker._errors import ClusterError
from p2p_worker._info import NodeInfo

LOOPBACK = "127.0.0.1"
DEFAULT_TMPDIR = "/tmp/p2pray"

_embedded_started = False  # this process started an embedded cluster that is still up


def ray_temp_dir() -> str:
    """Return the short temp dir for an embedded cluster (``$P2P_RAY_TMPDIR`` or default).

    Ray puts Unix socket paths under it, and those must stay short (about 100 bytes).
    """
    return os.environ.get("P2P_RAY_TMPDIR") or DEFAULT_TMPDIR


def _ray_start_address() -> str | None:
    """Return the GCS address a ``ray start`` on this machine recorded, if it answers."""
    base = os.environ.get("RAY_TMPDIR") or "/tmp"
    try:
        with open(os.path.join(base, "ray", "ray_current_cluster"), encoding="utf-8") as f:
            address = f.read().strip()
    except OSError:
        return None
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
            return address
    except OSError:
        return None


def resolve_address(address: str | None) -> str | None:
    """Decide where to run: an address to attach to, or ``None`` for an embedded cluster.

    ``None``: ``$RAY_ADDRESS`` if set, else a running ``ray start`` cluster on this
    machine, else embedded. ``"local"``: always embedded. ``"auto"``: attach or fail.
    Anything else: that address.

    Raises:
        ClusterError: ``"auto"`` found nothing, or a Ray Client address was given.
    """
    if address == "local":
        return None
    found: str | None = address if address not in (None, "auto") else None
    if found is None:
        found = os.environ.get("RAY_ADDRESS") or None
    if found is None:
        found = _ray_start_address()
    if found is None and address == "auto":
        raise ClusterError(
            "address='auto': no running Ray cluster found (RAY_ADDRESS is unset and no "
            "`ray start` cluster answers on this machine)"
        )
    if found is not None and found.startswith("ray://"):
        raise ClusterError(
            f"Ray Client addresses are not supported ({found}): the job's rendezvous store "
            f"runs in the driver, so run the driver on a node of the cluster"
        )
    return found


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0].strip("[]") or address
    return host in ("127.0.0.1", "localhost", "::1")


def embedded_running() -> bool:
    """Whether this process is connected to an embedded cluster it started."""
    return _embedded_started and ray.is_initialized()


def shutdown_ray() -> None:
    """Disconnect from Ray (stopping an embedded cluster this process started)."""
    global _embedded_started
    ray.shutdown()
    _embedded_started = False


@contextlib.contextmanager
def _loopback_resolution(embedded: bool) -> Iterator[None]:
    """Keep 127.0.0.1 as the node IP while an embedded cluster starts.

    ``ray.init(_node_ip_address="127.0.0.1")`` replaces a loopback address by the
    machine's outward one unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` is 0, and Ray
    reads that variable once, when ``ray`` is imported (measured on Ray 2.60). Setting
    the variable covers the processes Ray starts; the constant Ray derived from it is
    switched off for the duration of the start, then restored.
    """
    if not embedded:
        yield
        return
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    constants = importlib.import_module("ray._private.ray_constants")
    saved = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    if saved is not None:
        setattr(constants, "ENABLE_RAY_CLUSTER", False)  # noqa: B010
    try:
        yield
    finally:
        if saved is not None:
            setattr(constants, "ENABLE_RAY_CLUSTER", saved)  # noqa: B010


def driver_code_paths() -> list[str]:
    """The driver's own code directories on ``sys.path``, for the workers' ``sys.path``.

    Ray adds the driver's script directory and working directory to every worker's
    path; this adds the rest of what the driver imports from outside its Python
    installation (a directory pytest put on the path, a ``sys.path.insert`` of the
    program), so a class defined there and pickled by reference (a dataclass sent
    between workers) resolves in the workers too. Directories under the interpreter's
    prefixes are left out: workers run the same installation.
    """
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    out: list[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.curdir)
        if not os.path.isdir(path) or path in out:
            continue
        if any(path == p or path.startswith(p + os.sep) for p in prefixes):
            continue
        out.append(path)
    return out


def start_or_attach(
    address: str | None,
    *,
    num_cpus: float | None = None,
    num_gpus: int | None = None,
    object_store_memory: int | None = None,
    namespace: str | None = None,
) -> bool:
    """Make sure this process is connected to Ray; return True if this call connected it.

    ``namespace`` is the Ray namespace to connect in (``None``: Ray's anonymous one of
    this job); it does not apply when the process is already connected.

    An embedded cluster binds to loopback, with a short temp dir, no dashboard and no
    usage reporting. ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set before Ray starts;
    without it Ray 2.60 replaces 127.0.0.1 by the machine's outward address.

    Raises:
        ClusterError: Ray cannot start, or the cluster cannot be reached.
    """
    if ray.is_initialized():
        return False
    target = resolve_address(address)
    kwargs: dict[str, Any] = {
        "logging_level": logging.WARNING,
        "include_dashboard": False,
    }
    if namespace is not None:
        kwargs["namespace"] = namespace
    paths = driver_code_paths()
    if paths:  # the job's workers start with the driver's code directories importable
        existing = os.environ.get("PYTHONPATH")
        pythonpath = os.pathsep.join(paths + ([existing] if existing else []))
        kwargs["runtime_env"] = {"env_vars": {"PYTHONPATH": pythonpath}}
    if target is None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        tmp = ray_temp_dir()
        os.makedirs(tmp, exist_ok=True)
        kwargs.update(
            address="local",
            _node_ip_address=LOOPBACK,
            _temp_dir=tmp,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            object_store_memory=object_store_memory,
        )
        what = f"start an embedded local Ray cluster (temp dir {tmp})"
    else:
        if num_cpus is not None or num_gpus is not None or object_store_memory is not None:
            raise ValueError(
                "num_cpus/num_gpus/object_store_memory size an embedded cluster only; they "
                f"cannot be given when attaching to the running cluster at {target}"
            )
        del kwargs["include_dashboard"]
        kwargs["address"] = target
        if _is_loopback(target):
            kwargs["_node_ip_address"] = LOOPBACK
        what = f"attach to the Ray cluster at {target}"
    try:
        with _loopback_resolution(target is None):
            ray.init(**kwargs)
    except Exception as exc:
        raise ClusterError(f"could not {what}: {exc}") from exc
    global _embedded_started
    _embedded_started = target is None
    return True


class _RayNode(TypedDict, total=False):
    """The fields of a ``ray.nodes()`` record read here."""

    NodeID: str
    NodeManagerAddress: str
    Alive: bool
    alive: bool
    Resources: dict[str, float]


def discover_nodes() -> list[NodeInfo]:
    """Return the alive nodes, the driver's node first, then ordered by IP and id."""
    here = ray.get_runtime_context().get_node_id()
    listed: list[_RayNode] = ray.nodes()  # type: ignore[no-untyped-call]
    alive = [n for n in listed if n.get("Alive", n.get("alive", False))]

    def order(n: _RayNode) -> tuple[bool, str, str]:
        return (n["NodeID"] != here, str(n["NodeManagerAddress"]), str(n["NodeID"]))

    nodes = []
    for i, n in enumerate(sorted(alive, key=order)):
        res = n.get("Resources", {})
        nodes.append(
            NodeInfo(
                node_rank=i,
                ray_node_id=str(n["NodeID"]),
                ip=str(n["NodeManagerAddress"]),
                num_cpus=float(res.get("CPU", 0.0)),
                num_gpus=int(res.get("GPU", 0)),
                is_driver_node=n["NodeID"] == here,
            )
        )
    return nodes
