"""What a worker process holds for its job: the store client and the one Collective."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Protocol

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from p2p_collective import Collective, CollectiveConfig
from p2p_compress import probe_codec_library
from p2p_worker._address import WorkerAddress
from p2p_worker._errors import WorkerError
from p2p_worker._info import NodeInfo
from p2p_worker._runtime._oracle import actor_alive
from p2p_worker._runtime._store import RendezvousStore

STORE_TIMEOUT = 300.0
CHILD_SHUTDOWN_TIMEOUT = 8.0
"""Seconds a closing worker gives its child group (the driver waits 10 s for the worker)."""


class ChildGroup(Protocol):
    """What a worker's runtime needs of the child group it launched (a ``WorkerGroup``)."""

    name: str

    @property
    def launched(self) -> bool:
        """Whether the children run."""

    def shutdown(self, *, timeout: float | None = ...) -> None:
        """Stop the children."""


@dataclass(frozen=True)
class JobContext:
    """What the driver hands to every worker of a job (pickled into the actor).

    Attributes:
        store_host: IP of the job's rendezvous store.
        store_port: Its port.
        collective_config: The job's ``p2p_collective.CollectiveConfig`` (or ``None``).
        codec_name: The configured compression codec, probed at worker start, or ``None``.
        nodes: The cluster's nodes, indexed by node rank.
        job_token: The job's secret, which every ``Collective`` of the job proves it holds
            at rendezvous (never printed; ``None``: no check).
    """

    store_host: str
    store_port: int
    collective_config: CollectiveConfig | None
    codec_name: str | None
    nodes: tuple[NodeInfo, ...]
    job_token: str | None = field(default=None, repr=False)


def probe_codec(codec_name: str | None) -> None:
    """Check that the configured codec's library works in this process.

    Raises:
        Exception: ``p2p_compress.CompressionError`` naming what to install.
    """
    if codec_name is None:
        return
    probe_codec_library(codec_name)


class WorkerRuntime:
    """Per-process state of a worker: its address, its store client and its Collective.

    Both are created on first use, so a worker that never communicates opens no
    connection. The Collective is built with the worker's address name, a TCPStore
    client to the job's store, the node IP as its host, the job's CollectiveConfig and
    the job's token. The runtime also holds the group of children the worker launched,
    which :meth:`close` shuts down first.

    Args:
        job: The job context from the driver.
        address: The worker's address.
        node_ip: IP of the worker's node.
    """

    def __init__(self, job: JobContext, address: WorkerAddress, node_ip: str) -> None:
        self.job = job
        self.address = address
        self.node_ip = node_ip
        self._lock = threading.Lock()
        self._store: TCPStore | None = None
        self._collective: Collective | None = None
        self._children: ChildGroup | None = None
        self._closed = False

    def store(self) -> TCPStore:
        """Return the TCPStore client to the job's rendezvous store (connecting once)."""
        with self._lock:
            if self._store is None:
                self._store = RendezvousStore.connect(
                    self.job.store_host, self.job.store_port, timeout=STORE_TIMEOUT
                )
            return self._store

    def collective(self) -> Collective:
        """Return this process's ``p2p_collective.Collective`` (creating it once).

        Raises:
            WorkerError: The runtime is closed.
        """
        if self._collective is not None:
            return self._collective
        store = self.store()
        with self._lock:
            if self._closed:
                raise WorkerError(f"worker {self.address} is shutting down")
            if self._collective is None:
                self._collective = Collective(
                    self.address,
                    store,
                    host=self.node_ip,
                    config=self.job.collective_config,
                    job_token=self.job.job_token,
                    is_alive=actor_alive,  # Ray's word on peers never connected to
                )
            return self._collective

    def adopt(self, children: ChildGroup) -> None:
        """Record ``children`` as the child group this worker launches (one at a time).

        Raises:
            WorkerError: The runtime is closed (the worker is shutting down).
            ValueError: A child group launched before still runs.
        """
        with self._lock:
            if self._closed:
                raise WorkerError(f"worker {self.address} is shutting down; it launches no child")
            live = self._children
            if live is not None and live.launched:
                raise ValueError(
                    f"worker {self.address} already runs the child group {live.name!r}; a "
                    f"worker runs one child group at a time (children's addresses extend "
                    f"the parent's): shut it down before launching another"
                )
            self._children = children

    def release(self, children: ChildGroup) -> None:
        """Forget ``children`` (it was shut down, or failed to launch)."""
        with self._lock:
            if self._children is children:
                self._children = None

    def close(self) -> None:
        """Shut the child group down, close the Collective, drop the store. Idempotent."""
        with self._lock:
            self._closed = True
            children, self._children = self._children, None
            collective, self._collective = self._collective, None
            self._store = None
        if children is not None:
            with contextlib.suppress(Exception):  # best effort: Ray kills them with us anyway
                children.shutdown(timeout=CHILD_SHUTDOWN_TIMEOUT)
        if collective is not None:
            collective.close()


_current: WorkerRuntime | None = None


def set_current_runtime(runtime: WorkerRuntime | None) -> None:
    """Make ``runtime`` this process's worker runtime."""
    global _current
    _current = runtime


def current_runtime() -> WorkerRuntime | None:
    """Return this process's worker runtime, or ``None`` outside a launched worker."""
    return _current
