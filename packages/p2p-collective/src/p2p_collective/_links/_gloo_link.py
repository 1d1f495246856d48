"""GlooLink: one direction of a group over a two-rank gloo process group (any two hosts).

Each direction has its own process group, so the two directions never share a socket
pair or a tag space, and messages of one direction arrive in the order they were sent.
Header messages and payload messages travel under two tags (see
:mod:`p2p_collective._wire._headers`).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from p2p_collective._deadline import remaining
from p2p_collective._errors import CollectiveError, CollectiveTimeoutError, PeerError
from p2p_collective._frames._recvpool import PostedRecv
from p2p_collective._links._liveness import Watcher, send_record
from p2p_collective._links._torch_gloo import GlooGroup
from p2p_collective._links._waiter import Waiter, first_line, gloo_failure, wait_direct

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Work

PAYLOAD_TAG = 0
HEADER_TAG = 1
"""gloo tags: header messages (each operation's first) and all others travel apart, so
header receives posted ahead never catch a payload (see :mod:`p2p_collective._wire._headers`)."""

DIRECT_WAIT_MAX = 1 << 20
"""Messages up to this many bytes are waited for in the executing thread."""


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
        self, pg: GlooGroup, rank: int, peer: str, watch: socket.socket, watcher: Watcher
    ) -> None:
        self._pg: GlooGroup | None = pg
        self._peer_rank = 1 - rank
        self.peer = peer
        self._watch = watch
        self._watcher = watcher
        self._gone: str | None = None
        self._on_gone: Callable[[PeerError, bool], None] | None = None
        self._waiter = Waiter("p2p-gloo-wait")
        self.transport_reason = ""
        self._on_record: Callable[[bytes], None] | None = None
        self._record_lock = threading.Lock()  # one writer at a time; close waits for it
        self._record_tail = bytearray()
        watcher.watch(watch, self._peer_gone, self._record)

    def set_on_gone(self, fn: Callable[[PeerError, bool], None]) -> None:
        """Call ``fn(error, died)`` (from the watcher thread) when the peer is gone."""
        self._on_gone = fn

    def set_on_record(self, fn: Callable[[bytes], None]) -> None:
        """Call ``fn(record)`` (from the watcher thread) for each record the peer sends back."""
        self._on_record = fn

    def _record(self, record: bytes) -> None:
        fn = self._on_record
        if fn is not None:
            fn(record)

    def send_record(self, record: bytes) -> bool:
        """Send a record to the peer on the liveness connection (never blocks).

        Returns:
            False when it was dropped (the connection's buffer is full, or it is closed).
        """
        with self._record_lock:
            if self._pg is None or self._gone is not None:
                return False
            return send_record(self._watch, record, self._record_tail)

    def _gone_error(self) -> PeerError:
        return PeerError(f"peer {self.peer!r} {self._gone}")

    def _peer_gone(self, reason: str, died: bool) -> None:
        self._gone = reason
        self._waiter.wake()
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

    def _post(self, what: str, tensor: torch.Tensor, send: bool, tag: int) -> Work:
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
            raise PeerError(f"{what} with peer {self.peer!r} failed: {first_line(exc)}") from exc

    def _finish(self, what: str, work: Work, nbytes: int, deadline: float | None) -> None:
        """Wait for a posted operation; map gloo's failures to ours."""
        left = remaining(deadline)
        try:
            if left == 0.0:
                raise TimeoutError("deadline already passed")
            if nbytes <= DIRECT_WAIT_MAX:
                wait_direct(work, deadline)
            else:
                self._waiter.wait(work, deadline, self._gone_or_none)
        except PeerError:
            raise
        except Exception as exc:
            raise gloo_failure(
                exc,
                f"{what} with peer {self.peer!r}",
                f"{what} of {nbytes} bytes with peer {self.peer!r} did not complete in time"
                f" ({left if left is not None else 'no'} s left)",
            ) from exc

    def _gone_or_none(self) -> PeerError | None:
        return None if self._gone is None else self._gone_error()

    def send(self, tensor: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        """Send the bytes of a flat uint8 tensor as one message (``header``: a frame's first)."""
        self._run("send", tensor, deadline, True, HEADER_TAG if header else PAYLOAD_TAG)

    def send_pair(self, head: torch.Tensor, payload: torch.Tensor, deadline: float | None) -> None:
        """Send a frame's header message, then its payload message."""
        self.send(head, deadline, header=True)
        self.send(payload, deadline)

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

    def fileno(self) -> int | None:
        """None: gloo's receives complete in gloo's threads, not on a descriptor."""
        return None

    def peek_message(self, view: memoryview) -> int:
        """Not offered (:meth:`fileno` is None)."""
        raise CollectiveError(f"recv with peer {self.peer!r}: a gloo link cannot peek")

    def drop_message(self, view: memoryview, n: int) -> None:
        """Not offered (:meth:`fileno` is None)."""
        raise CollectiveError(f"recv with peer {self.peer!r}: a gloo link cannot peek")

    def stats(self) -> dict[str, str | None]:
        """``transport`` (``"gloo"``) and ``transport_reason`` (why not shared memory)."""
        return {"transport": self.transport, "transport_reason": self.transport_reason}

    def close(self) -> None:
        """Drop the process group and close the liveness connection (the peer sees EOF).

        The process group's sockets close once no pending operation holds it.
        """
        with self._record_lock:
            self._pg = None
        self._waiter.close()
        with self._record_lock:  # no record is being written into the closing socket
            self._watcher.forget(self._watch)
