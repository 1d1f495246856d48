"""The CPU transport: one gloo process group per direction of a two-party group.

Process groups are built standalone (``ProcessGroupGloo(store, rank, 2, options)``), never
through ``init_process_group``, so they do not touch a default process group the user
may have. Each direction has its own group, so the two directions never share a socket
pair or a tag space, and messages of one direction arrive in the order they were sent.

An accelerator transport (issue 8) adds a sibling of :class:`GlooLink` selected by the
frame's device kind; the direction code talks to links only through ``send``/``recv``.
"""

from __future__ import annotations

import datetime
import queue
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist

from p2p_collective._errors import CollectiveError, CollectiveTimeoutError, PeerError
from p2p_collective._liveness import Watcher, open_watch_socket
from p2p_collective._recvpool import PostedRecv, ReceiveBufferPool
from p2p_collective._shm import join as _shm_join
from p2p_collective._shm import offer as _shm_offer
from p2p_collective._shm_link import ShmLink

StoreLike = Any  # a torch.distributed.Store (not re-exported for type checkers)

_PREFIX_STORE: Any = dist.PrefixStore  # type: ignore[attr-defined]
_FOREVER = datetime.timedelta(days=30)  # "no limit": larger values overflow gloo's clock math
PAYLOAD_TAG = 0
HEADER_TAG = 1
"""gloo tags: header messages (each operation's first) and all others travel apart, so
header receives posted ahead never catch a payload (see :mod:`p2p_collective._headers`)."""
_WAIT_GRACE = 2.0

DIRECT_WAIT_MAX = 1 << 20
"""Messages up to this many bytes are waited for in the executing thread."""


def remaining(deadline: float | None) -> float | None:
    """Seconds left until a ``time.monotonic()`` deadline (None: no limit), at least 0."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def to_timedelta(seconds: float | None) -> datetime.timedelta:
    """A timedelta for torch APIs; ``None`` becomes a very long one, 0 becomes 1 ms."""
    if seconds is None:
        return _FOREVER
    return datetime.timedelta(seconds=max(seconds, 0.001))


def deadline_after(seconds: float | None) -> float | None:
    """The ``time.monotonic()`` deadline ``seconds`` from now (None: no limit)."""
    return None if seconds is None else time.monotonic() + seconds


def _is_timeout(exc: BaseException) -> bool:
    return (
        isinstance(exc, TimeoutError)
        or "timed out" in str(exc).lower()
        or ("timeout" in str(exc).lower())
    )


def make_device(host: str) -> Any:
    """A gloo TCP device bound to ``host`` (an address of this machine, e.g. 127.0.0.1)."""
    return dist.ProcessGroupGloo.create_device(hostname=host)


def _new_gloo_group(store: StoreLike, rank: int, device: Any, timeout: datetime.timedelta) -> Any:
    gloo: Any = dist.ProcessGroupGloo
    make_options = getattr(gloo, "_Options", None)
    if make_options is None:  # pragma: no cover - older/newer torch without device options
        # The timedelta constructor picks its device from GLOO_SOCKET_IFNAME or the hostname.
        return gloo(store, rank, 2, timeout)
    # The options object is the only way to hand gloo a device bound to our host; the
    # timedelta constructor would pick one from the hostname or GLOO_SOCKET_IFNAME.
    opts = make_options()
    opts._devices = [device]
    opts._timeout = timeout
    opts._threads = 1  # point-to-point ops never use gloo's collective thread pool
    return gloo(store, rank, 2, opts)


class Link(Protocol):
    """What the direction code uses of a link: :class:`GlooLink` or ShmLink."""

    peer: str
    transport: str
    transport_reason: str

    def send(self, tensor: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        """Send the bytes of a flat uint8 tensor as one message (``header``: a frame's first)."""

    def recv(self, tensor: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        """Receive one message into a flat uint8 tensor (the message may be shorter)."""

    def post_recv(self, tensor: torch.Tensor) -> PostedRecv:
        """Post the receive of a header message now, to be waited for with ``wait_recv``."""

    def wait_recv(self, posted: PostedRecv, deadline: float | None) -> None:
        """Wait for a receive posted with ``post_recv``."""

    def set_on_gone(self, fn: Callable[[PeerError, bool], None]) -> None:
        """Call ``fn(error, died)`` when the peer is declared gone.

        ``died`` is True when the peer process is gone, False when it closed its end of
        this direction on purpose.
        """

    def close(self) -> None:
        """Release the link; the peer sees end-of-file."""


class LinkFactory:
    """Per-Collective transport resources: host, gloo device, liveness watcher, buffer pool.

    ``shared_memory`` (the config switch) lets :meth:`connect` put a direction whose peer
    is on this node on shared memory (:class:`~p2p_collective._shm_link.ShmLink`).
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
        self._device: Any = None

    def device(self) -> Any:
        """The gloo device bound to ``host``, created at the first connection."""
        with self._lock:
            if self._device is None:
                self._device = make_device(self.host)
            return self._device

    def connect(
        self,
        store: StoreLike,
        prefix: str,
        rank: int,
        receiving: bool,
        peer: str,
        timeout: float | None,
        wait_key: Callable[[str, float | None], bool],
    ) -> GlooLink:
        """Connect one direction under ``prefix``: liveness, process group, shared memory.

        The shared-memory handshake (see :mod:`p2p_collective._shm`) runs after the
        process group is up; when it does not succeed the gloo link is returned, its
        ``transport_reason`` saying why (both sides agree on the outcome).

        Raises:
            CollectiveTimeoutError: The peer did not connect in time.
            CollectiveError: The connection failed.
        """
        watch = open_watch_socket(store, prefix, receiving, self.host, peer, timeout, wait_key)
        try:
            pg = _new_gloo_group(
                _PREFIX_STORE(f"{prefix}/gloo", store), rank, self.device(), to_timedelta(timeout)
            )
        except Exception as exc:
            watch.close()
            if _is_timeout(exc):
                raise CollectiveTimeoutError(
                    f"peer {peer!r} did not connect the process group {prefix!r} within {timeout} s"
                ) from exc
            raise CollectiveError(
                f"could not connect the process group {prefix!r} to peer {peer!r}: {exc}"
            ) from exc
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
        # Callers annotate links as GlooLink; ShmLink has the same methods (see Link).
        return cast("GlooLink", ShmLink(link, sock, segment))

    @staticmethod
    def describe(link: Link | None) -> dict[str, str | None]:
        """The ``transport`` and ``transport_reason`` stats of a direction's link.

        ``transport`` is ``"shm"`` or ``"gloo"`` (None before the first use);
        ``transport_reason`` says why not shared memory (``""`` for shm).
        """
        if link is None:
            return {"transport": None, "transport_reason": "not connected yet"}
        return {"transport": link.transport, "transport_reason": link.transport_reason}

    def close(self) -> None:
        """Stop the liveness watcher, drop the idle receive buffers and the gloo device.

        The device's descriptors (its event loop, listening socket) close once the last
        process group that uses it is gone.
        """
        self.watcher.close()
        self.recv_pool.close()
        with self._lock:
            self._device = None


class GlooLink:
    """One direction of a group: a two-rank gloo process group plus a liveness connection.

    ``send``/``recv`` move the bytes of one flat ``uint8`` tensor as one gloo message and
    block until done or until the deadline; failures become
    :class:`CollectiveTimeoutError` or :class:`PeerError`. Messages up to
    :data:`DIRECT_WAIT_MAX` bytes are waited for in the calling thread (lowest latency);
    larger ones are waited for by the link's waiter thread while the caller watches the
    liveness connection, because gloo can miss a peer that dies mid-transfer.

    ``transport`` is ``"gloo"``; ``transport_reason`` says why shared memory is not used.
    """

    transport = "gloo"

    def __init__(
        self, pg: Any, rank: int, peer: str, watch: socket.socket, watcher: Watcher
    ) -> None:
        self._pg: Any = pg
        self._peer_rank = 1 - rank
        self.peer = peer
        self._watch = watch
        self._watcher = watcher
        self._gone: str | None = None
        self._on_gone: Callable[[PeerError, bool], None] | None = None
        self._waits: queue.SimpleQueue[_Wait | None] = queue.SimpleQueue()
        self._waiter: threading.Thread | None = None
        self._inflight: _Wait | None = None
        self.transport_reason = ""
        watcher.watch(watch, self._peer_gone)

    def set_on_gone(self, fn: Callable[[PeerError, bool], None]) -> None:
        """Call ``fn(error, died)`` (from the watcher thread) when the peer is gone."""
        self._on_gone = fn

    def _gone_error(self) -> PeerError:
        return PeerError(f"peer {self.peer!r} {self._gone}")

    def _peer_gone(self, reason: str, died: bool) -> None:
        self._gone = reason
        wait = self._inflight
        if wait is not None:
            wait.done.set()
        if self._on_gone is not None:
            self._on_gone(self._gone_error(), died)

    def _run(
        self, what: str, tensor: torch.Tensor, deadline: float | None, send: bool, tag: int
    ) -> None:
        if deadline is not None and remaining(deadline) == 0.0:
            raise CollectiveTimeoutError(
                f"{what} of {tensor.numel()} bytes with peer {self.peer!r}: the deadline had"
                " passed before it could start"
            )
        work = self._post(what, tensor, send, tag)
        self._finish(what, work, tensor.numel(), deadline)

    def _post(self, what: str, tensor: torch.Tensor, send: bool, tag: int) -> Any:
        """Hand one send or receive to gloo (never blocks); return its work."""
        pg = self._pg
        if pg is None:
            raise CollectiveError(f"{what} with peer {self.peer!r}: the link is closed")
        if self._gone is not None:
            raise self._gone_error()
        try:
            if send:
                return pg.send([tensor], self._peer_rank, tag)
            return pg.recv([tensor], self._peer_rank, tag)
        except Exception as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PeerError(f"{what} with peer {self.peer!r} failed: {first}") from exc

    def _finish(self, what: str, work: Any, nbytes: int, deadline: float | None) -> None:
        """Wait for a posted operation; map gloo's failures to ours."""
        left = remaining(deadline)
        try:
            if left == 0.0:
                raise TimeoutError("deadline already passed")
            if nbytes <= DIRECT_WAIT_MAX:
                work.wait(to_timedelta(left))
            else:
                self._watched_wait(work, deadline)
        except PeerError:
            raise
        except Exception as exc:
            if _is_timeout(exc):
                raise CollectiveTimeoutError(
                    f"{what} of {nbytes} bytes with peer {self.peer!r} did not"
                    f" complete in time ({left if left is not None else 'no'} s left)"
                ) from exc
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PeerError(f"{what} with peer {self.peer!r} failed: {first}") from exc

    def _watched_wait(self, work: Any, deadline: float | None) -> None:
        wait = _Wait(work, deadline)
        self._inflight = wait
        if self._waiter is None:
            self._waiter = threading.Thread(
                target=_waiter_loop, args=(self._waits,), name="p2p-gloo-wait", daemon=True
            )
            self._waiter.start()
        self._waits.put(wait)
        try:
            while not wait.done.wait(0.5):
                if deadline is not None and time.monotonic() > deadline + _WAIT_GRACE:
                    raise TimeoutError("the gloo wait did not return by the deadline")
            if wait.error is not None:
                raise wait.error
            if not wait.finished and self._gone is not None:
                raise self._gone_error()
        finally:
            self._inflight = None

    def send(self, tensor: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        """Send the bytes of a flat uint8 tensor as one message (``header``: a frame's first)."""
        self._run("send", tensor, deadline, True, HEADER_TAG if header else PAYLOAD_TAG)

    def recv(self, tensor: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        """Receive one message into a flat uint8 tensor (the message may be shorter)."""
        self._run("recv", tensor, deadline, False, HEADER_TAG if header else PAYLOAD_TAG)

    def post_recv(self, tensor: torch.Tensor) -> PostedRecv:
        """Post the receive of a header message now; wait for it with :meth:`wait_recv`.

        A receive posted before the peer sends lets gloo move the message at once;
        one posted after makes the peer's send wait for a notification round trip.

        Raises:
            CollectiveError, PeerError: The link is closed or the peer is gone.
        """
        if tensor.numel() > DIRECT_WAIT_MAX:
            raise ValueError(f"post_recv: {tensor.numel()} bytes; at most {DIRECT_WAIT_MAX}")
        return PostedRecv(self._post("recv", tensor, False, HEADER_TAG), tensor)

    def wait_recv(self, posted: PostedRecv, deadline: float | None) -> None:
        """Wait for a receive posted with :meth:`post_recv`.

        Raises:
            CollectiveTimeoutError, PeerError: As for :meth:`recv`.
        """
        work, posted.work = posted.work, None
        if work is None:
            raise CollectiveError(f"recv with peer {self.peer!r}: that receive was already waited")
        self._finish("recv", work, posted.tensor.numel(), deadline)

    def close(self) -> None:
        """Drop the process group and close the liveness connection (the peer sees EOF).

        The process group's sockets close once no pending operation holds it.
        """
        self._pg = None
        self._waits.put(None)
        waiter = self._waiter
        if waiter is not None and self._inflight is None:
            waiter.join(timeout=1.0)
        self._watcher.forget(self._watch)


class _Wait:
    __slots__ = ("deadline", "done", "error", "finished", "work")

    def __init__(self, work: Any, deadline: float | None) -> None:
        self.work = work
        self.deadline = deadline
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.finished = False


def _waiter_loop(waits: queue.SimpleQueue[_Wait | None]) -> None:
    while True:
        wait = waits.get()
        if wait is None:
            return
        try:
            wait.work.wait(to_timedelta(remaining(wait.deadline)))
            wait.finished = True
        except BaseException as exc:
            wait.error = exc
        finally:
            wait.work = None  # drop the gloo work (and its process group) at once
            wait.done.set()
        del wait
