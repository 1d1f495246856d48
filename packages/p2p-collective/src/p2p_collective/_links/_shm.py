"""Same-node shared memory: the segment of one direction and the setup handshake.

Each direction of a group whose two members share a node gets one anonymous segment
(``memfd_create``: it never appears in ``/dev/shm``, and the kernel frees it once both
processes have unmapped it or died, so a crash leaves nothing behind) and one Unix stream
socket in the abstract namespace, which carries the control messages and, once, the
segment's file descriptor (``SCM_RIGHTS``). The segment is a ring of :data:`SLOTS` slots
of :data:`SLOT_BYTES` bytes, created by the sending side and reused for the group's whole
life; see :mod:`p2p_collective._links._shm_link` for how messages move through it.

Handshake (under the direction's store prefix, within the init timeout):

1. The receiving side listens on a random abstract name and publishes
   ``"<hostname>|<name>"`` under ``shm/offer`` -- or ``"none:<reason>"`` when it will not
   use shared memory (disabled by config, no socket).
2. The sending side compares hostnames, creates and maps the segment, connects, and
   sends a hello (ring geometry) with the segment's descriptor. Whenever it cannot (other
   host, disabled, another network namespace: abstract names are per namespace), it
   publishes ``"<reason>"`` under ``shm/refuse`` instead.
3. The receiving side maps the segment and answers ``ok`` or ``no:<reason>``.

Both sides end up with the same outcome: a connected socket and a mapped segment, or
gloo and the same reason string.
"""

from __future__ import annotations

import contextlib
import hmac
import mmap
import os
import secrets
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from p2p_collective._errors import AuthenticationError, CollectiveError, CollectiveTimeoutError

SLOTS = 4
"""Slots in the ring of one direction (the sender fills one while the receiver drains another)."""
SLOT_BYTES = 2 << 20
"""Bytes per slot: a direction's segment holds ``SLOTS * SLOT_BYTES`` (8 MiB) at most.

Small enough that a chunk the sender has just written is still in the shared cache when
the receiver copies it out: measured on a 2-core EPYC (32 MiB L3), 4 x 2 MiB moved
13.6-14.8 GB/s, 4 x 8 MiB 8-8.9 GB/s, 8 x 1 MiB 11-13 GB/s (bench_shm, same runs).

Pages are allocated when first written, so a direction that never carries a message of
at least :data:`~p2p_collective._links._shm_link.SHM_MIN_BYTES` costs no memory."""

_HELLO = struct.Struct("<4sHHIQ")  # magic, version, reserved, slots, slot bytes
_MAGIC = b"P2PS"
_VERSION = 2
_POLL = 0.02  # seconds between looks at the store while waiting for the sender


class Segment:
    """A mapped shared-memory segment cut into equal slots (uint8 numpy views).

    numpy views, because numpy copies them single-threaded with the GIL released: torch's
    copy splits a large copy across its intra-op threads, whose spinning, with the other
    process copying at the same time, made transfers 5-10 times slower on two cores.
    """

    def __init__(self, mm: mmap.mmap, slots: int, slot_bytes: int) -> None:
        self._mm: mmap.mmap | None = mm
        base = np.frombuffer(mm, dtype=np.uint8)
        self.slot_bytes = slot_bytes
        self.slots: list[npt.NDArray[np.uint8]] = [
            base[i * slot_bytes : (i + 1) * slot_bytes] for i in range(slots)
        ]

    @classmethod
    def create(cls, slots: int, slot_bytes: int) -> tuple[Segment, int]:
        """A new anonymous segment and its descriptor (the caller closes the descriptor).

        Raises:
            OSError: memfd_create, ftruncate or mmap failed.
        """
        fd = os.memfd_create("p2p-shm", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, slots * slot_bytes)
            return cls(mmap.mmap(fd, slots * slot_bytes), slots, slot_bytes), fd
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Drop the views and unmap (deferred to garbage collection if a view survives)."""
        self.slots = []
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()


_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_MAC_BYTES = 32  # HMAC-SHA256 of the job token over _mac_label (zeros without a token)


def _mac_label(prefix: str, name: str) -> bytes:
    return b"p2p-shm\0" + prefix.encode() + b"\0" + name.encode()


def _fail(what: str, exc: BaseException, peer: str) -> CollectiveError:
    if isinstance(exc, TimeoutError):
        return CollectiveTimeoutError(f"shared-memory setup with peer {peer!r}: {what} timed out")
    return CollectiveError(f"shared-memory setup with peer {peer!r}: {what} failed: {exc}")


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("the peer closed the connection")
        data += part
    return data


def _send_text(sock: socket.socket, text: str) -> None:
    raw = text.encode()[:1000]
    sock.sendall(struct.pack("<H", len(raw)) + raw)


def _recv_text(sock: socket.socket) -> str:
    (n,) = struct.unpack("<H", _recv_exact(sock, 2))
    return _recv_exact(sock, n).decode(errors="replace")


def offer(
    store: Any,
    prefix: str,
    enabled: bool,
    peer: str,
    timeout: float | None,
    wait_key: Callable[[str, float | None], bool],
    *,
    mac: Callable[[bytes], bytes | None] | None = None,
) -> tuple[socket.socket | None, Segment | None, str]:
    """The receiving side of the handshake: ``(socket, segment, "")`` or ``(None, None, why)``.

    With ``mac`` (the job token's HMAC) the connecting process must prove the token:
    the hello carries ``mac(label)`` for this direction and socket name.

    Raises:
        CollectiveTimeoutError: The sending side neither connected nor refused in time.
        CollectiveError: The store or the connection failed after it was made.
    """
    key = f"{prefix}/shm/offer"
    if not enabled:
        store.set(key, b"none:disabled by config")
        return None, None, "disabled by config"
    name = f"p2p-shm-{secrets.token_hex(16)}"
    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        why = f"no Unix socket: {exc}"
        store.set(key, f"none:{why}".encode())
        return None, None, why
    with listener:
        try:
            listener.bind("\0" + name)
            listener.listen(1)
        except OSError as exc:
            why = f"cannot listen on an abstract Unix socket: {exc}"
            store.set(key, f"none:{why}".encode())
            return None, None, why
        store.set(key, f"{socket.gethostname()}|{name}".encode())
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            readable, _, _ = select.select([listener], [], [], _POLL)
            if readable:
                conn, _ = listener.accept()
                break
            if wait_key(f"{prefix}/shm/refuse", 0.0):
                return None, None, bytes(store.get(f"{prefix}/shm/refuse")).decode()
            if deadline is not None and time.monotonic() > deadline:
                raise CollectiveTimeoutError(
                    f"peer {peer!r} neither joined nor refused the shared-memory channel"
                    f" {prefix!r} within {timeout} s"
                )
    try:
        pid, uid, _gid = _PEERCRED.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
        )
    except OSError:  # pragma: no cover - SO_PEERCRED exists on every Linux
        pid, uid = -1, os.getuid()
    if uid != os.getuid():
        conn.close()
        raise CollectiveError(
            f"shared-memory channel {prefix!r}: process {pid} of user {uid} connected"
            f" instead of peer {peer!r} (this process runs as user {os.getuid()})"
        )
    try:
        conn.settimeout(timeout)
        msg, fds, _, _ = socket.recv_fds(conn, _HELLO.size, 1)
        proof = _recv_exact(conn, _MAC_BYTES)
    except OSError as exc:
        conn.close()
        raise _fail("receiving the segment", exc, peer) from exc
    expected = None if mac is None else mac(_mac_label(prefix, name))
    if expected is not None and not hmac.compare_digest(expected, proof):
        for fd in fds:
            os.close(fd)
        conn.close()
        raise AuthenticationError(
            f"shared-memory channel {prefix!r}: the process that connected instead of peer"
            f" {peer!r} does not hold this job's token; refusing it"
        )
    try:
        if len(msg) != _HELLO.size or len(fds) != 1:
            raise ConnectionError(f"bad hello ({len(msg)} bytes, {len(fds)} descriptors)")
        magic, version, _, slots, slot_bytes = _HELLO.unpack(msg)
        if magic != _MAGIC or version != _VERSION or not 0 < slots <= 64 or slot_bytes <= 0:
            raise ConnectionError(f"bad hello {msg!r}")
        try:
            segment = Segment(mmap.mmap(fds[0], slots * slot_bytes), slots, slot_bytes)
        except (OSError, ValueError) as exc:
            why = f"cannot map the peer's segment: {exc}"
            _send_text(conn, f"no:{why}")
            conn.close()
            return None, None, why
        finally:
            for fd in fds:
                os.close(fd)
        _send_text(conn, "ok")
    except OSError as exc:
        conn.close()
        raise _fail("the hello", exc, peer) from exc
    return conn, segment, ""


def join(
    store: Any,
    prefix: str,
    enabled: bool,
    peer: str,
    timeout: float | None,
    wait_key: Callable[[str, float | None], bool],
    *,
    mac: Callable[[bytes], bytes | None] | None = None,
) -> tuple[socket.socket | None, Segment | None, str]:
    """The sending side of the handshake: ``(socket, segment, "")`` or ``(None, None, why)``.

    With ``mac`` the hello carries the job token's proof for this direction and name.

    Raises:
        CollectiveTimeoutError: The receiving side did not publish its offer in time.
        CollectiveError: The store or the connection failed after it was made.
    """
    key = f"{prefix}/shm/offer"
    if not wait_key(key, timeout):
        raise CollectiveTimeoutError(
            f"peer {peer!r} did not publish its shared-memory offer under {key!r}"
            f" within {timeout} s"
        )
    got = bytes(store.get(key)).decode()
    if got.startswith("none:"):
        why = got[len("none:") :]
        return None, None, why if enabled else "disabled by config"

    def refuse(why: str) -> tuple[None, None, str]:
        store.set(f"{prefix}/shm/refuse", why.encode())
        return None, None, why

    host, _, name = got.partition("|")
    if not enabled:
        return refuse("disabled by config")
    if host != socket.gethostname():
        return refuse("peer on another host")
    try:
        segment, fd = Segment.create(SLOTS, SLOT_BYTES)
    except (OSError, ValueError) as exc:
        return refuse(f"cannot create a shared-memory segment: {exc}")
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect("\0" + name)
        except OSError as exc:
            sock.close()
            segment.close()
            return refuse(
                f"peer's shared-memory socket unreachable (another network namespace?): {exc}"
            )
        try:
            socket.send_fds(sock, [_HELLO.pack(_MAGIC, _VERSION, 0, SLOTS, SLOT_BYTES)], [fd])
            proof = None if mac is None else mac(_mac_label(prefix, name))
            sock.sendall(proof if proof is not None else bytes(_MAC_BYTES))
            answer = _recv_text(sock)
        except OSError as exc:
            sock.close()
            segment.close()
            raise _fail("sending the segment", exc, peer) from exc
    finally:
        os.close(fd)
    if answer != "ok":
        sock.close()
        segment.close()
        return None, None, answer[len("no:") :] if answer.startswith("no:") else answer
    return sock, segment, ""
