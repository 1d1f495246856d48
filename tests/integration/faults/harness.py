"""The test side of the fault-injection suite: peer processes, timing, resource counts."""

from __future__ import annotations

import ctypes
import ctypes.util
import datetime
import gc
import json
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from faults import peer as peer_mod

_CTX = mp.get_context("spawn")
STORE_TIMEOUT = datetime.timedelta(seconds=60)
TIMES_ENV = "P2P_FAULT_TIMES"
"""When set, every measured time to error is appended there as one JSON line."""


def make_store() -> Any:
    """A TCPStore server on loopback, on a free port, in the test process."""
    return dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT
    )


def store_client(port: int, timeout: float = 60.0) -> Any:
    """A TCPStore client of the store on ``127.0.0.1:port``."""
    return dist.TCPStore(
        "127.0.0.1",
        port,
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout),
    )


class PeerProcess:
    """A spawned peer serving tasks of :mod:`faults.peer` (see ``peer.serve``)."""

    def __init__(self, name: str, store_port: int, config: dict[str, Any] | None = None) -> None:
        self.name = name
        self._commands = _CTX.Queue()
        self._results = _CTX.Queue()
        self.proc = _CTX.Process(
            target=peer_mod.serve,
            args=(name, store_port, config, self._commands, self._results),
            daemon=True,
            name=f"peer-{name}",
        )
        self.proc.start()
        self.pid = self.result(timeout=120)  # the peer is up and connected to the store

    def start(self, task: Callable[..., Any], *args: Any) -> None:
        """Run ``task(ctx, *args)`` in the peer; collect its result with :meth:`result`."""
        self._commands.put((task, args))

    def result(self, timeout: float = 120.0) -> Any:
        """The next task result; an AssertionError carrying the traceback if it raised."""
        status, value = self._results.get(timeout=timeout)
        if status != "ok":
            raise AssertionError(f"peer {self.name!r} failed:\n{value}")
        return value

    def call(self, task: Callable[..., Any], *args: Any, timeout: float = 120.0) -> Any:
        """Run a task and wait for its result."""
        self.start(task, *args)
        return self.result(timeout)

    def kill(self) -> float:
        """SIGKILL the process (no cleanup runs in it); return the monotonic kill time."""
        os.kill(self.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        self.proc.join(timeout=30)
        return killed_at

    def stop(self) -> None:
        """Ask the peer to exit; kill it if it does not."""
        if self.proc.is_alive():
            self._commands.put(None)
            self.proc.join(timeout=15)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=15)


class StoreHost:
    """A TCPStore server in a process of its own, so that it can be killed."""

    def __init__(self) -> None:
        self._results = _CTX.Queue()
        self.proc = _CTX.Process(target=peer_mod.store_host, args=(self._results,), daemon=True)
        self.proc.start()
        status, self.port = self._results.get(timeout=120)
        assert status == "ok"

    def kill(self) -> float:
        os.kill(self.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        self.proc.join(timeout=30)
        return killed_at


def wait_progress(store: Any, name: str, key: str, at_least: int, timeout: float = 120.0) -> int:
    """Poll the counter ``progress/<name>/<key>`` until it reaches ``at_least``."""
    deadline = time.monotonic() + timeout
    while True:
        value = int(store.add(f"progress/{name}/{key}", 0))
        if value >= at_least:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{name}: {key} stayed at {value} < {at_least} for {timeout} s")
        time.sleep(0.01)


@dataclass
class Outcome:
    """How one call ended: its error (None when it returned) and how long after ``t0``."""

    error: BaseException | None
    seconds: float
    value: Any = None


def outcome(fn: Callable[[], Any], t0: float | None = None) -> Outcome:
    """Run ``fn``; return what it raised and when, relative to ``t0`` (default: now)."""
    start = time.monotonic() if t0 is None else t0
    try:
        value = fn()
    except Exception as exc:
        return Outcome(exc, time.monotonic() - start)
    return Outcome(None, time.monotonic() - start, value)


def record_time(case: str, call: str, error: BaseException | str | None, seconds: float) -> None:
    """Append one measured time to error to ``$P2P_FAULT_TIMES`` (when set).

    ``error`` is the error raised (or its type name), or None when the call returned.
    """
    path = os.environ.get(TIMES_ENV)
    name = error if isinstance(error, str) or error is None else type(error).__name__
    line = {
        "case": case,
        "call": call,
        "error": name,
        "seconds": round(seconds, 3),
    }
    print(f"FAULT-TIME {json.dumps(line)}")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


@dataclass(frozen=True)
class Resources:
    """Resource counts of this process."""

    python_threads: int
    native_threads: int
    open_fds: int
    rss_bytes: int

    def minus(self, other: Resources) -> Resources:
        return Resources(
            self.python_threads - other.python_threads,
            self.native_threads - other.native_threads,
            self.open_fds - other.open_fds,
            self.rss_bytes - other.rss_bytes,
        )


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()


def resources() -> Resources:
    """Threads (Python and OS), open file descriptors and resident memory.

    Counted after a GC and, with glibc, after ``malloc_trim(0)``, so that pages the
    allocator holds free are not counted. Even so the main heap's resident size moves by
    whole payloads from one count to the next (seen: 94 -> 129 -> 103 -> 128 MiB at
    successive counts of the leak test, with no trend), so compare peaks, not single counts.
    """
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
    with open("/proc/self/statm", encoding="ascii") as f:
        rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return Resources(
        threading.active_count(),
        len(os.listdir("/proc/self/task")),
        len(os.listdir("/proc/self/fd")),
        rss,
    )
