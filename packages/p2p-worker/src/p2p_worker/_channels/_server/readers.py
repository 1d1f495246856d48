"""How a channel worker takes a peer's messages off its groups, in order.

A same-node peer's groups run over shared memory, whose links have a descriptor: the
channel worker's event loop watches it (``loop.add_reader``) and, when it turns
readable, takes every message that has arrived whole (``recv_nowait``) and handles it
right there. A message then costs one wake-up of the loop and no thread hand-off (no
receiving thread wakes, takes the GIL and then wakes the loop). A message too large for
one (an item with tensors, or over the small-object size) is left to one ordinary
asynchronous receive, with the reader paused until it is in, so the order holds.

- :class:`RequestReader` reads the *control group* (a peer's requests). Without a
  descriptor (gloo, a peer on another node) it keeps one receive posted instead; the
  thread that completes one posts the next before handing the request to the loop
  (``call_soon_threadsafe``: hand-offs of one thread keep their order).
- :class:`PayloadReader` reads the *link* (put payloads), but only the payloads the
  channel worker expects (one per granted slot or lent credit), each within the
  transfer timeout. Without a descriptor the channel worker posts one receive per
  expected payload instead (``ChannelWorker._post_payload_recv``).

Either way the loop sees a group's messages in the order the peer sent them, and a
failure (the peer closed its handle, died, the stream broke or a payload is late) ends
the reading and is handed to the loop once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable

from p2p_asyncwork import AsyncWork
from p2p_collective import CollectiveGroup, CollectiveTimeoutError, GroupClosedError, Unready
from p2p_worker._channels._protocol.proto import wire_timeout

logger = logging.getLogger("p2p_worker.channel")

BATCH = 32
"""Messages taken per readable event before the loop turns to its other work."""


class LoopReader:
    """Reads one group's messages from the event loop (see the module docstring).

    Subclasses say whether messages are wanted now (:meth:`_wanted`), take each one
    (:meth:`_take`) and handle a failure (:meth:`_broken`); all three run on the loop.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, group: CollectiveGroup, timeout: float | None
    ):
        self._loop = loop
        self._group = group
        self._timeout = timeout  # of a large message's ordinary receive
        self._fd: int | None = None  # the descriptor the loop watches, while it does
        self._paused = False  # a large message's ordinary receive runs
        self._stopped = False

    def stop(self) -> None:
        """End the reading; nothing is handed over afterwards (the group closes)."""
        self._stopped = True
        self._unwatch()

    def _watch(self) -> None:
        """Watch the descriptor if messages are wanted and nothing else reads."""
        if self._fd is not None or self._paused or self._stopped or not self._wanted():
            return
        fd = self._group.recv_fileno()
        if fd is None:  # closed meanwhile
            self._fail(GroupClosedError(f"{self._group.name}: closed while reading"))
            return
        self._fd = fd
        self._loop.add_reader(fd, self._readable)

    def _unwatch(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None

    def _readable(self) -> None:
        """Take the messages that arrived whole (at most :data:`BATCH` now)."""
        for i in range(BATCH):
            if self._stopped:
                return
            if not self._wanted():
                if i == 0:  # readable with nothing due (end-of-file, or a stray message):
                    self._unwatch()  # look again once something is due
                return
            try:
                got = self._group.recv_nowait()
            except Exception as exc:  # the peer left, or the stream broke
                self._fail(exc)
                return
            if got is Unready.EMPTY:
                return
            if got is Unready.LARGE:  # one ordinary receive; reading resumes after it
                self._unwatch()
                self._paused = True
                self._post_large()
                return
            self._take(got)

    def _post_large(self) -> None:
        loop = self._loop
        work = self._group.recv(async_op=True, timeout=self._timeout)

        def arrived(w: AsyncWork[object]) -> None:
            loop.call_soon_threadsafe(self._large_in, w)

        work.add_done_callback(arrived)

    def _large_in(self, work: AsyncWork[object]) -> None:
        self._paused = False
        if self._stopped:
            return
        exc = work.exception(0)
        if exc is not None:
            self._fail(exc)
            return
        self._take(work.wait(0))
        self._watch()

    def _fail(self, exc: BaseException) -> None:
        if not self._stopped:
            self.stop()
            self._broken(exc)

    def _wanted(self) -> bool:
        raise NotImplementedError

    def _take(self, msg: object) -> None:
        raise NotImplementedError

    def _broken(self, exc: BaseException) -> None:
        raise NotImplementedError


class RequestReader(LoopReader):
    """Reads one control group's requests for the event loop.

    ``handle(request)`` and ``failed(error)`` run on the loop, in the order the requests
    came; ``failed`` at most once, after which nothing more is read.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        ctl: CollectiveGroup,
        handle: Callable[[object], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        super().__init__(loop, ctl, wire_timeout(None))  # a peer may idle for long
        self._handle = handle
        self._failed = failed
        self.mode = ""  # "loop" or "thread", once started

    def start(self) -> None:
        """Begin reading (the control group is connected)."""
        if self._group.recv_fileno() is None:
            self.mode = "thread"
            self._post()
        else:
            self.mode = "loop"
            self._watch()

    def _wanted(self) -> bool:
        return True

    def _take(self, msg: object) -> None:
        self._handle(msg)

    def _broken(self, exc: BaseException) -> None:
        self._failed(exc)

    def _post(self) -> None:
        """Post one receive; the thread that completes it posts the next."""
        # No timeout: a peer may stay idle for as long as it likes; its death or a reset
        # (which closes the group) ends the receive.
        loop = self._loop

        def arrived(work: AsyncWork[object]) -> None:
            if work.exception(0) is None:
                try:
                    self._post()
                except Exception as exc:  # closed meanwhile: the loop sees the failure
                    logger.debug("request receive not posted: %s", exc)
            loop.call_soon_threadsafe(self._arrived, work)

        self._group.recv(async_op=True, timeout=self._timeout).add_done_callback(arrived)

    def _arrived(self, work: AsyncWork[object]) -> None:
        if self._stopped:
            return
        exc = work.exception(0)
        if exc is not None:
            self._fail(exc)
        else:
            self._handle(work.wait(0))


class PayloadReader(LoopReader):
    """Reads the put payloads a channel worker expects on one peer's link.

    :meth:`expect` announces one more payload (a granted put's or a lent credit's);
    ``take(credit, obj, None)`` gets each in order, or ``take(credit, None, error)``
    for every expected payload still missing once reading fails (the peer left, the
    stream broke, a payload is later than ``timeout`` seconds, or :meth:`fail` is called
    by a reset). Announced before :meth:`start`, payloads wait for it.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        link: CollectiveGroup,
        timeout: float | None,
        take: Callable[[bool, object, BaseException | None], None],
    ) -> None:
        super().__init__(loop, link, timeout)
        self._take_payload = take
        self._expected: deque[tuple[bool, float | None]] = deque()  # (credit, deadline)
        self._started = False
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> bool:
        """Begin reading (the link is connected); False if it has no descriptor."""
        if self._group.recv_fileno() is None:
            return False
        self._started = True
        self._watch()
        return True

    def pending(self) -> list[bool]:
        """The expected payloads (their credit flags), taken out; for another reader."""
        out = [credit for credit, _ in self._expected]
        self._expected.clear()
        return out

    def expect(self, credit: bool) -> None:
        """One more payload is due (``credit``: for a lent credit, else a granted put)."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        self._expected.append((credit, deadline))
        if self._started:
            self._watch()
        if deadline is not None and self._timer is None and not self._stopped:
            self._timer = self._loop.call_later(self._timeout or 0.0, self._check_late)

    def fail(self, exc: BaseException) -> None:
        """Stop reading; every payload still expected fails with ``exc``."""
        self._fail(exc)

    def _wanted(self) -> bool:
        return self._started and bool(self._expected)

    def _take(self, msg: object) -> None:
        credit, _ = self._expected.popleft()
        self._take_payload(credit, msg, None)

    def _broken(self, exc: BaseException) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        while self._expected:
            credit, _ = self._expected.popleft()
            self._take_payload(credit, None, exc)

    def _check_late(self) -> None:
        """Fail the reading when the oldest expected payload is past its deadline."""
        self._timer = None
        if self._stopped or not self._expected:
            return
        deadline = self._expected[0][1]
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            self._fail(
                CollectiveTimeoutError(
                    f"{self._group.name}: a put's payload did not arrive within {self._timeout} s"
                )
            )
            return
        wait = (deadline - now) if deadline is not None else (self._timeout or 0.0)
        self._timer = self._loop.call_later(wait, self._check_late)
