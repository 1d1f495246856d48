"""Peer liveness: plain TCP connections to the peer, watched for end-of-file.

Gloo reports a dead peer quickly in most states, but not all: measured on torch 2.13, a
peer that dies in the middle of a multi-megabyte message can leave the other side's
receive (or send) waiting until its timeout. So each direction also holds a TCP
connection on which nothing is ever sent. When the peer process dies (or closes its
group) the kernel closes that connection and the :class:`Watcher` thread sees
end-of-file at once. After a short grace period, which lets operations that were about
to complete finish, the link is declared gone and its pending operation fails with
:class:`PeerError`.

Two things are ever sent on such a connection. :data:`BYE` (one byte) is written just
before a side closes it on purpose (it closed the group): end-of-file right after
``BYE`` means "that group was closed"; end-of-file after anything else (or an error)
means the process is gone, and its :class:`~p2p_collective._peers._peer.Peer` fails
everything toward it. And a pair group's receiving side writes *records* of
:data:`RECORD_BYTES` bytes (tag :data:`RECORD`, last byte :data:`RECORD_END`, so never
``BYE``) back to the sender: how fast it decoded (see
:mod:`p2p_collective._compression._decode_rates`). The watcher hands each whole record
to the connection's ``on_record`` callback; bytes that are neither a record nor ``BYE``
are logged and dropped, and the connection keeps being watched.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable

from p2p_collective._errors import CollectiveError, CollectiveTimeoutError

_log = logging.getLogger("p2p_collective")

GONE_GRACE = 2.0
"""Seconds between seeing the peer's connection close and failing the pending operation."""
_TICK = 0.25
BYE = b"C"
"""Written on a liveness connection right before it is closed on purpose."""
RECORD = b"D"
"""The first byte of a record sent back on a liveness connection."""
RECORD_END = b"\n"
"""The last byte of a record (never :data:`BYE`: end-of-file after a record is a death)."""
RECORD_BYTES = 40
"""The size of every record, tag and end byte included."""

GoneCallback = Callable[[str, bool], None]
"""``on_gone(reason, died)``: ``died`` is False when the peer said goodbye first."""
RecordCallback = Callable[[bytes], None]
"""``on_record(record)``: one whole record (:data:`RECORD_BYTES` bytes) the peer sent."""


def split_records(buf: bytearray, sock: socket.socket | None = None) -> list[bytes]:
    """Take the whole records off the front of ``buf`` (what a connection delivered so far).

    ``BYE`` bytes are skipped; a record not yet complete stays in ``buf``; bytes that
    cannot start a record (or a record that does not end in :data:`RECORD_END`) are
    dropped with a warning naming the connection ``sock``'s far end.
    """
    out: list[bytes] = []
    while buf:
        tag = buf[:1]
        if tag == BYE:
            del buf[:1]
        elif tag == RECORD:
            if len(buf) < RECORD_BYTES:
                break
            record = bytes(buf[:RECORD_BYTES])
            del buf[:RECORD_BYTES]
            if record[-1:] == RECORD_END:
                out.append(record)
            else:
                _log.warning(
                    "liveness connection from %s: a record that does not end in %r was"
                    " ignored (%s)",
                    _peer_of(sock),
                    RECORD_END,
                    record.hex(),
                )
        else:
            skip = 1
            while skip < len(buf) and buf[skip : skip + 1] not in (BYE, RECORD):
                skip += 1
            _log.warning(
                "liveness connection from %s: %d bytes that start no record were ignored (%s)",
                _peer_of(sock),
                skip,
                bytes(buf[: min(skip, 16)]).hex(),
            )
            del buf[:skip]
    return out


def _keepalive(sock: socket.socket) -> None:
    """Let the kernel probe idle connections, so a vanished host is noticed too."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3)):
        opt = getattr(socket, name, None)
        if opt is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, opt, value)


def open_watch_socket(
    store: object,
    prefix: str,
    listen: bool,
    host: str,
    peer: str,
    timeout: float | None,
    wait_key: Callable[[str, float | None], bool],
) -> socket.socket:
    """Connect the liveness connection of one direction.

    The receiving side listens on ``host`` (an ephemeral port) and publishes the address
    under ``prefix/watch``; the sending side reads it and connects.

    Raises:
        CollectiveTimeoutError: The peer did not connect or publish in time.
        CollectiveError: The connection failed.
    """
    key = f"{prefix}/watch"
    try:
        if listen:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.create_server((host, 0), family=family) as server:
                server.settimeout(timeout)
                port = server.getsockname()[1]
                store.set(key, f"{host}|{port}".encode())  # type: ignore[attr-defined]
                sock, _ = server.accept()
        else:
            if not wait_key(key, timeout):
                raise CollectiveTimeoutError(
                    f"peer {peer!r} did not publish its liveness address under {key!r}"
                    f" within {timeout} s"
                )
            peer_host, _, port_s = bytes(store.get(key)).decode().rpartition("|")  # type: ignore[attr-defined]
            sock = socket.create_connection((peer_host, int(port_s)), timeout=timeout)
    except TimeoutError as exc:
        raise CollectiveTimeoutError(
            f"liveness connection with peer {peer!r} under {key!r} timed out after {timeout} s"
        ) from exc
    except OSError as exc:
        raise CollectiveError(
            f"liveness connection with peer {peer!r} under {key!r} failed: {exc}"
        ) from exc
    sock.setblocking(False)
    _keepalive(sock)
    return sock


def _peer_of(sock: socket.socket | None) -> str:
    if sock is None:
        return "a peer"
    try:
        return str(sock.getpeername())
    except OSError:
        return "a closed connection"


def send_record(sock: socket.socket, record: bytes, tail: bytearray) -> bool:
    """Write one record on a liveness connection without blocking.

    ``tail`` holds what an earlier call could not write (the connection's buffer was
    full); it goes first, so records never interleave. Returns False when nothing of
    ``record`` could be written (it is dropped) or the connection failed.
    """
    if len(record) != RECORD_BYTES or record[:1] != RECORD or record[-1:] != RECORD_END:
        raise ValueError(
            f"a liveness record is {RECORD_BYTES} bytes from {RECORD!r} to {RECORD_END!r};"
            f" got {len(record)} bytes {record[:1]!r}...{record[-1:]!r}"
        )
    try:
        if tail:
            del tail[: sock.send(tail)]
            if tail:
                return False
        sent = sock.send(record)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return False
    tail += record[sent:]
    return sent > 0


class Watcher:
    """One daemon thread per Collective that watches every liveness connection.

    ``watch(sock, on_gone)`` calls ``on_gone(reason, died)`` once, from the watcher
    thread, :data:`GONE_GRACE` seconds after the connection reports end-of-file or an
    error; ``died`` is False when :data:`BYE` came first (the peer closed on purpose).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._selector: selectors.BaseSelector | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._pending: list[tuple[float, GoneCallback, str, bool]] = []
        self._said_bye: set[int] = set()  # descriptors whose peer's last byte was BYE
        self._buffers: dict[int, bytearray] = {}  # descriptors' bytes not yet a record
        self._closed = False

    def _start_locked(self) -> selectors.BaseSelector:
        if self._selector is None:
            self._selector = selectors.DefaultSelector()
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._selector.register(self._wake_r, selectors.EVENT_READ, None)
            self._thread = threading.Thread(
                target=self._loop, name=f"p2p-liveness[{self._name}]", daemon=True
            )
            self._thread.start()
        return self._selector

    def watch(
        self, sock: socket.socket, on_gone: GoneCallback, on_record: RecordCallback | None = None
    ) -> None:
        """Start watching ``sock``; ``on_gone(reason, died)`` runs once after it closes.

        ``on_record(record)`` runs (from the watcher thread) for each record the peer
        sends; without it records are dropped.
        """
        with self._lock:
            if self._closed:
                raise CollectiveError("the liveness watcher is closed")
            selector = self._start_locked()
            self._said_bye.discard(sock.fileno())
            self._buffers.pop(sock.fileno(), None)
            selector.register(sock, selectors.EVENT_READ, (on_gone, on_record))
            self._wake()

    def forget(self, sock: socket.socket) -> None:
        """Stop watching ``sock``, say :data:`BYE` and close it (the peer sees a close)."""
        with self._lock:
            if self._selector is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
            self._said_bye.discard(sock.fileno())
            self._buffers.pop(sock.fileno(), None)
        with contextlib.suppress(OSError):
            sock.send(BYE)
        sock.close()

    def _wake(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")

    def _loop(self) -> None:
        assert self._selector is not None
        while True:
            with self._lock:
                if self._closed:
                    return
            events = self._selector.select(_TICK)
            now = time.monotonic()
            records: list[tuple[RecordCallback, list[bytes]]] = []
            for key, _ in events:
                if key.data is None:  # wake-up
                    with contextlib.suppress(OSError):
                        self._wake_r.recv(4096)  # type: ignore[union-attr]
                    continue
                with self._lock:  # forget() cannot close the socket meanwhile
                    if self._selector.get_map().get(key.fd) is not key:
                        continue  # forgotten (closed by this side) since select()
                    on_gone, on_record = key.data
                    report, got = self._read_locked(key.fileobj)  # type: ignore[arg-type]
                    if got and on_record is not None:
                        records.append((on_record, got))
                    if report is not None:
                        with contextlib.suppress(KeyError, ValueError):
                            self._selector.unregister(key.fileobj)
                        self._pending.append((now + GONE_GRACE, on_gone, *report))
            for on_record, got in records:  # outside the lock: the callback takes its own
                for record in got:
                    try:
                        on_record(record)
                    except Exception:  # a bad record must not stop watching
                        _log.exception("p2p liveness record callback failed")
            due: list[tuple[GoneCallback, str, bool]] = []
            with self._lock:
                keep = []
                for item in self._pending:
                    (due.append(item[1:]) if item[0] <= now else keep.append(item))
                self._pending = keep
            for fn, why, died in due:
                try:
                    fn(why, died)
                except Exception:  # a failing callback must not stop watching the others
                    _log.exception("p2p liveness callback failed")

    def _read_locked(self, sock: socket.socket) -> tuple[tuple[str, bool] | None, list[bytes]]:
        """Read what a readable liveness connection has.

        Returns:
            (reason, died) once it ended, else None; and the whole records it delivered.
        """
        fd = sock.fileno()
        try:
            data = sock.recv(4096)
        except BlockingIOError:
            return None, []
        except OSError as exc:
            self._said_bye.discard(fd)
            self._buffers.pop(fd, None)
            return (f"is unreachable (liveness connection failed: {exc})", True), []
        if data:
            if data[-1:] == BYE:  # (a record never ends in BYE)
                self._said_bye.add(fd)
            else:
                self._said_bye.discard(fd)
            buf = self._buffers.setdefault(fd, bytearray())
            buf += data
            return None, split_records(buf, sock)
        self._buffers.pop(fd, None)
        if fd in self._said_bye:
            self._said_bye.discard(fd)
            return ("closed the group (its end of the connection is closed)", False), []
        return ("died (its liveness connection closed without a goodbye)", True), []

    def close(self) -> None:
        """Stop the thread; sockets are closed by their owners (:meth:`forget`)."""
        with self._lock:
            self._closed = True
            self._wake()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2.0)
        with self._lock:
            for sock in (self._wake_r, self._wake_w):
                if sock is not None:
                    sock.close()
            if self._selector is not None:
                self._selector.close()
