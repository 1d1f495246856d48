"""Acknowledgements of received items that ride on a consumer's next request.

A consumer acknowledges the items of each get (the channel worker frees their slots only
then, see :mod:`p2p_worker._channels.server`). Sent alone, an acknowledgement costs the
channel worker one more message, thread hand-off and wake-up per get. So it waits, in an
:class:`AckBatch`, for the consumer's next request and travels inside it
(``(ACKED, tokens, request)``); if no request follows within :data:`ACK_DELAY` seconds,
the process's :class:`AckFlusher` thread sends it on its own (``(ACK, *tokens)``), so a
producer waiting for the slot (``maxsize=1``) never stalls for long.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from p2p_worker._channels.proto import ACK, ACKED

ACK_DELAY = 0.002  # seconds an acknowledgement waits for a request to ride on


class AckBatch:
    """The acknowledgements of one link not sent yet (guarded by the link's lock).

    Example:
        >>> batch = AckBatch()
        >>> batch.add(3); batch.add(4)
        >>> batch.wrap((1, 5))
        (4, (3, 4), (1, 5))
        >>> batch.wrap((1, 6)), batch.alone()
        ((1, 6), None)
    """

    __slots__ = ("tokens",)

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def add(self, token: int) -> None:
        """Get ``token``'s items arrived: acknowledge them with the next message."""
        self.tokens.append(token)

    def clear(self) -> None:
        """Forget them (the link was reset: the hello's report covers them)."""
        self.tokens = []

    def wrap(self, request: tuple[Any, ...]) -> tuple[Any, ...]:
        """``request``, carrying the pending acknowledgements if there are any."""
        if not self.tokens:
            return request
        tokens, self.tokens = tuple(self.tokens), []
        return (ACKED, tokens, request)

    def alone(self) -> tuple[Any, ...] | None:
        """The pending acknowledgements as a message of their own; None when there are none."""
        if not self.tokens:
            return None
        tokens, self.tokens = tuple(self.tokens), []
        return (ACK, *tokens)


class _Flushable(Protocol):
    def flush_acks(self) -> None: ...


class AckFlusher:
    """One thread per process that sends acknowledgements no request took along in time."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._links: set[_Flushable] = set()
        self._thread: threading.Thread | None = None

    def arm(self, link: _Flushable) -> None:
        """Flush ``link``'s acknowledgements in :data:`ACK_DELAY` unless a request takes them."""
        with self._cond:
            if link in self._links:
                return
            self._links.add(link)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="p2p-channel-acks", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._links:
                    self._cond.wait()
            time.sleep(ACK_DELAY)
            with self._cond:
                links, self._links = self._links, set()
            for link in links:
                link.flush_acks()


FLUSHER = AckFlusher()
