"""LinkFactory: connects one direction of a group and returns its :class:`Link`.

Per Collective it holds the transport resources (host, gloo device, liveness watcher,
receive buffer pool). ``connect`` builds the gloo link of a direction (liveness
connection plus process group) and then tries the shared-memory handshake; the caller
gets a :class:`~p2p_collective._links._link.Link` and never names a concrete class. A new
transport is one module implementing ``Link`` and one branch here.

The deadline helpers (:mod:`p2p_collective._deadline`) are re-exported for the modules
that import them from here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from p2p_collective._deadline import deadline_after, is_timeout, remaining, to_timedelta
from p2p_collective._errors import CollectiveError, CollectiveTimeoutError
from p2p_collective._frames._recvpool import ReceiveBufferPool
from p2p_collective._links._gloo_link import GlooLink
from p2p_collective._links._link import Link
from p2p_collective._links._liveness import Watcher, open_watch_socket
from p2p_collective._links._shm import join as _shm_join
from p2p_collective._links._shm import offer as _shm_offer
from p2p_collective._links._shm_link import ShmLink
from p2p_collective._links._torch_gloo import GlooDevice, GlooGroup, make_device, new_gloo_group

__all__ = [
    "Link",
    "LinkFactory",
    "StoreLike",
    "deadline_after",
    "remaining",
    "to_timedelta",
]

StoreLike = Any  # a torch.distributed.Store (not re-exported for type checkers)


class LinkFactory:
    """Per-Collective transport resources: host, gloo device, liveness watcher, buffer pool.

    ``shared_memory`` (the config switch) lets :meth:`connect` put a direction whose peer
    is on this node on shared memory (:class:`~p2p_collective._links._shm_link.ShmLink`).
    """

    def __init__(
        self,
        host: str,
        name: str,
        recv_cache_bytes: int,
        *,
        shared_memory: bool = True,
        mac: Callable[[bytes], bytes | None] | None = None,
    ) -> None:
        self.host = host
        self.shared_memory = shared_memory
        self.mac = mac  # the job token's HMAC, for the shared-memory hello (None: no token)
        self.watcher = Watcher(name)
        self.recv_pool = ReceiveBufferPool(recv_cache_bytes)
        self._lock = threading.Lock()
        self._device: GlooDevice | None = None

    def device(self) -> GlooDevice:
        """The gloo device bound to ``host``, created at the first connection."""
        with self._lock:
            if self._device is None:
                self._device = make_device(self.host)
            return self._device

    def gloo_group(
        self,
        store: StoreLike,
        prefix: str,
        rank: int,
        size: int,
        timeout: float | None,
        who: str,
        *,
        threads: int = 2,
    ) -> GlooGroup:
        """Connect a gloo process group of ``size`` ranks under ``prefix`` on our device.

        The one constructor of process groups for pair links and N-member groups.

        Args:
            store: The rendezvous store.
            prefix: The group's key prefix in it.
            rank: This process's rank.
            size: Number of ranks.
            timeout: Seconds to wait for every rank (None: no limit).
            who: The other side(s), for messages (e.g. ``"peer 'b'"``).
            threads: Size of gloo's collective thread pool.

        Raises:
            CollectiveTimeoutError: Not every rank connected in time.
            CollectiveError: The connection failed.
        """
        try:
            return new_gloo_group(
                store, prefix, rank, size, self.device(), to_timedelta(timeout), threads
            )
        except Exception as exc:
            if is_timeout(exc):
                raise CollectiveTimeoutError(
                    f"{who} did not connect the process group {prefix!r} within {timeout} s"
                ) from exc
            raise CollectiveError(
                f"could not connect the process group {prefix!r} to {who}: {exc}"
            ) from exc

    def connect(
        self,
        store: StoreLike,
        prefix: str,
        rank: int,
        receiving: bool,
        peer: str,
        timeout: float | None,
        wait_key: Callable[[str, float | None], bool],
    ) -> Link:
        """Connect one direction under ``prefix``: liveness, process group, shared memory.

        The shared-memory handshake (see :mod:`p2p_collective._links._shm`) runs after the
        process group is up; when it does not succeed the gloo link is returned, its
        ``transport_reason`` saying why (both sides agree on the outcome).

        Raises:
            CollectiveTimeoutError: The peer did not connect in time.
            CollectiveError: The connection failed.
        """
        watch = open_watch_socket(store, prefix, receiving, self.host, peer, timeout, wait_key)
        try:
            # one thread: point-to-point ops never use gloo's collective thread pool
            pg = self.gloo_group(store, prefix, rank, 2, timeout, f"peer {peer!r}", threads=1)
        except BaseException:
            watch.close()
            raise
        link = GlooLink(pg, rank, peer, watch, self.watcher)
        handshake = _shm_offer if receiving else _shm_join
        try:
            sock, segment, why = handshake(
                store, prefix, self.shared_memory, peer, timeout, wait_key, mac=self.mac
            )
        except BaseException as exc:
            link.close()
            if isinstance(exc, CollectiveError):
                raise
            raise CollectiveError(
                f"shared-memory setup of {prefix!r} with peer {peer!r} failed: {exc}"
            ) from exc
        if sock is None or segment is None:
            link.transport_reason = why
            return link
        return ShmLink(link, sock, segment)

    @staticmethod
    def describe(link: Link | None) -> dict[str, str | None]:
        """The ``transport`` and ``transport_reason`` stats of a direction's link.

        ``transport`` is ``"shm"`` or ``"gloo"`` (None before the first use);
        ``transport_reason`` says why not shared memory (``""`` for shm).
        """
        if link is None:
            return {"transport": None, "transport_reason": "not connected yet"}
        return link.stats()

    def close(self) -> None:
        """Stop the liveness watcher, drop the idle receive buffers and the gloo device.

        The device's descriptors (its event loop, listening socket) close once the last
        process group that uses it is gone.
        """
        self.watcher.close()
        self.recv_pool.close()
        with self._lock:
            self._device = None
