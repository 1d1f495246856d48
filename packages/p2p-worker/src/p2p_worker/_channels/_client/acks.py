"""Acknowledgements of received items that ride on a consumer's next request.

A consumer acknowledges the items of each get (the channel worker frees their slots only
then, see :mod:`p2p_worker._channels._server.server`). Sent alone, an acknowledgement costs the
channel worker one more message, thread hand-off and wake-up per get. So it waits, in an
:class:`AckBatch`, for the consumer's next request and travels inside it
(``(ACKED, tokens, request)``); if no request follows within :data:`ACK_DELAY` seconds,
the process's :class:`AckFlusher` thread sends it on its own (``(ACK, *tokens)``), so a
producer waiting for the slot (``maxsize=1``) never stalls for long: within
:data:`ACK_DELAY` to :data:`MAX_TICK` seconds (the longer only after a stretch in which
every acknowledgement rode on a request).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Protocol

from p2p_worker._channels._protocol.proto import ACK, ACKED

if TYPE_CHECKING:
    from p2p_worker._channels._protocol.proto import AckMessage, Carried, Request

ACK_DELAY = 0.002  # seconds an acknowledgement waits for a request to ride on
MAX_TICK = 0.01  # longest pause between ticks while requests take every ack along
TICK_LINGER = 0.05  # seconds the flusher keeps ticking after the last arm, then sleeps
MIN_SLEEP = 0.0001  # shortest pause of the flusher thread between two looks


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

    def wrap(self, request: Carried) -> Request:
        """``request``, carrying the pending acknowledgements if there are any."""
        if not self.tokens:
            return request
        tokens, self.tokens = tuple(self.tokens), []
        return (ACKED, tokens, request)

    def alone(self) -> AckMessage | None:
        """The pending acknowledgements as a message of their own; None when there are none."""
        if not self.tokens:
            return None
        tokens, self.tokens = tuple(self.tokens), []
        return (ACK, *tokens)


class _Flushable(Protocol):
    def flush_acks(self) -> None: ...


class AckFlusher:
    """One thread per process that sends acknowledgements no request took along in time.

    While gets flow, the thread ticks and sends the acknowledgements of links armed at
    least :data:`ACK_DELAY` ago that no request took along (:meth:`disarm`); arming it
    then costs a dict entry, not a wake-up. A tick that finds a link armed sleeps until
    that link is due. The pause between ticks that find none starts at
    :data:`ACK_DELAY` and doubles up to :data:`MAX_TICK` while no acknowledgement is left
    behind (requests take them all along); the first one left behind brings it back to
    :data:`ACK_DELAY`. After :data:`TICK_LINGER` seconds without an arm the thread sleeps
    until the next one. (Woken per get, it cost a consumer 14-21% of its GIL-holding
    samples with four busy pairs on 2 cores; ticking every 2 ms, still about one wake-up
    per item there: a consumer's voluntary context switches per item 3.6-4.1 against
    2.7-3.0 with 10 ms between ticks; see ``benchmarks/cpu_per_item.py``.)
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._armed: dict[_Flushable, float] = {}  # link -> when its oldest ack was armed
        self._last_arm = 0.0
        self._idle = True  # the thread sleeps until an arm notifies it
        self._tick = ACK_DELAY  # the next pause after a tick that finds no link armed
        self._thread: threading.Thread | None = None

    def arm(self, link: _Flushable) -> None:
        """Flush ``link``'s acknowledgements in :data:`ACK_DELAY` unless a request takes them."""
        now = time.monotonic()
        with self._cond:
            self._armed.setdefault(link, now)
            self._last_arm = now
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="p2p-channel-acks", daemon=True
                )
                self._thread.start()
            if self._idle:
                self._idle = False
                self._cond.notify()

    def disarm(self, link: _Flushable) -> None:
        """A request took ``link``'s acknowledgements along: nothing to flush for it."""
        with self._cond:
            self._armed.pop(link, None)

    def _due(self) -> tuple[list[_Flushable], float | None]:
        """Links to flush now, and seconds until the next look (None: sleep until an arm).

        Holding ``_cond``.
        """
        now = time.monotonic()
        due = [link for link, at in self._armed.items() if now - at >= ACK_DELAY]
        for link in due:
            del self._armed[link]
        if due:  # acknowledgements are being left behind: look often
            self._tick = ACK_DELAY
        if self._armed:
            return due, max(min(self._armed.values()) + ACK_DELAY - now, MIN_SLEEP)
        if now - self._last_arm >= TICK_LINGER:
            self._tick = ACK_DELAY
            return due, None
        pause, self._tick = self._tick, min(2 * self._tick, MAX_TICK)
        return due, pause

    def _run(self) -> None:
        while True:
            with self._cond:
                due, pause = self._due()
            for link in due:  # before going idle too: a late tick may find links due
                link.flush_acks()
            if pause is not None:
                time.sleep(pause)
                continue
            with self._cond:
                if self._armed or time.monotonic() - self._last_arm < TICK_LINGER:
                    continue  # armed meanwhile (without a notify: the thread was not idle)
                self._idle = True
                while self._idle:
                    self._cond.wait()


FLUSHER = AckFlusher()
