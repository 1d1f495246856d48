"""The Link protocol: what a group's direction needs from a transport.

A *link* is one direction of a two-party group over one transport. Everything above it
(the direction's operations, frames, header receives) talks to it only through this
protocol, and :meth:`~p2p_collective._links._transport.LinkFactory.connect` returns it; nothing
above the factory names a concrete link class.

Links today: :class:`~p2p_collective._links._gloo_link.GlooLink` (a two-rank gloo process
group: any two hosts) and :class:`~p2p_collective._links._shm_link.ShmLink` (same node: a
shared-memory ring plus a Unix socket). Adding a transport is one module implementing
this protocol plus one branch in ``LinkFactory.connect`` that decides when to use it (as
the shared-memory handshake does). An accelerator link (``NcclLink``, CUDA IPC) goes
there: it keeps its process group, CUDA stream, events and IPC handles to itself, and
receives device tensors in ``recv`` exactly as the gloo link receives CPU ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from p2p_collective._errors import PeerError
from p2p_collective._frames._recvpool import PostedRecv


class Link(Protocol):
    """One direction of a group over one transport (see the module docstring).

    Every method raises :class:`~p2p_collective.CollectiveTimeoutError` when the
    deadline passes and :class:`PeerError` when the peer is gone; a closed link raises
    :class:`~p2p_collective.CollectiveError`.

    Attributes:
        peer: The peer's name (for messages).
        transport: ``"gloo"``, ``"shm"``, ... (reported in the group's stats).
        transport_reason: Why a faster transport is not used (``""`` when none was
            possible or it is the fastest).
    """

    peer: str
    transport: str
    transport_reason: str

    def send(self, tensor: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        """Send the bytes of a flat uint8 tensor as one message (``header``: a frame's first)."""

    def send_pair(self, head: torch.Tensor, payload: torch.Tensor, deadline: float | None) -> None:
        """Send a frame's header message, then its payload message (as ``send`` twice).

        A link may hand both to its transport at once: the receiver still reads two
        messages in this order.
        """

    def recv(self, tensor: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        """Receive one message into a flat uint8 tensor (the message may be shorter)."""

    def post_recv(self, tensor: torch.Tensor) -> PostedRecv:
        """Post the receive of a header message now, to be waited for with ``wait_recv``."""

    def wait_recv(self, posted: PostedRecv, deadline: float | None) -> None:
        """Wait for a receive posted with ``post_recv``."""

    def fileno(self) -> int | None:
        """A descriptor an event loop may watch for arriving messages; None if none.

        Where there is one, :meth:`peek_message` and :meth:`drop_message` receive a whole
        small message without waiting (the event loop's reader, not the direction's
        thread, then receives).
        """

    def peek_message(self, view: memoryview) -> int:
        """Copy the next message into ``view`` if it has arrived whole in one piece.

        Returns its length, or a negative number: not arrived whole yet (-1), or it
        must be received with :meth:`recv` (-2). Only for a link with a :meth:`fileno`.
        """

    def drop_message(self, view: memoryview, n: int) -> None:
        """Consume the message of ``n`` bytes :meth:`peek_message` just returned."""

    def set_on_gone(self, fn: Callable[[PeerError, bool], None]) -> None:
        """Call ``fn(error, died)`` once the peer is gone from this link.

        ``died`` is True when the peer process is gone (its peer record then fails
        everything toward it), False when it closed its end of this direction on purpose.
        """

    def set_on_record(self, fn: Callable[[bytes], None]) -> None:
        """Call ``fn(record)`` (from another thread) for each record the peer sends back.

        Records travel on a side channel beside the messages (the direction's liveness
        connection), from the receiving side to the sending side: the receiver's decode
        rates (:mod:`p2p_collective._compression._decode_rates`).
        """

    def send_record(self, record: bytes) -> bool:
        """Send a record to the peer on the side channel without blocking.

        Returns:
            False when it was dropped (the channel is full or closed).
        """

    def stats(self) -> dict[str, str | None]:
        """``{"transport": ..., "transport_reason": ...}`` for the group's stats."""

    def close(self) -> None:
        """Release the link; the peer sees a deliberate close."""
