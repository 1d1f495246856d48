"""How a channel worker takes one peer's requests off its control group, in order.

Two ways, chosen per control group once it is connected:

- **From the event loop** (a same-node peer: the shared-memory link has a descriptor).
  The loop watches the descriptor (``loop.add_reader``) and, when it turns readable,
  takes every request that has arrived whole (``recv_nowait``) and serves it right
  there. A request costs one wake-up of the loop and no thread hand-off: no receiving
  thread wakes, takes the GIL and then wakes the loop. A request too large for one
  message (an inline item over the small-object size) is left to one ordinary
  asynchronous receive, with the reader paused until it is in, so the order holds.
- **From the group's receiving thread** (a peer on another node: gloo has no
  descriptor). One receive is always posted; the thread that completes one posts the
  next before handing the request to the loop (``call_soon_threadsafe``: hand-offs of
  one thread keep their order).

Either way the loop sees the requests in the order the peer sent them, and a failure
(the peer closed its handle, died, or the stream broke) ends the reading and is handed
to the loop once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from p2p_collective import Unready
from p2p_worker._channels.proto import wire_timeout

logger = logging.getLogger("p2p_worker.channel")

BATCH = 32
"""Requests served per readable event before the loop turns to its other work."""


class RequestReader:
    """Reads one control group's requests for the event loop (see the module docstring).

    ``handle(request)`` and ``failed(error)`` run on the loop, in the order the requests
    came; ``failed`` at most once, after which nothing more is read. :meth:`stop` (on the
    loop) ends the reading at once; nothing is handed over afterwards.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        ctl: Any,
        handle: Callable[[Any], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        self._loop = loop
        self._ctl = ctl
        self._handle = handle
        self._failed = failed
        self._fd: int | None = None  # the descriptor the loop watches, while it does
        self._stopped = False
        self.mode = ""  # "loop" or "thread", once started

    def start(self) -> None:
        """Begin reading (the control group is connected)."""
        fd = self._ctl.recv_fileno()
        self.mode = "thread" if fd is None else "loop"
        if fd is None:
            self._post()
        else:
            self._watch(fd)

    def stop(self) -> None:
        """End the reading; later requests and failures are dropped (the group closes)."""
        self._stopped = True
        self._unwatch()

    # -- from the event loop --------------------------------------------------------------

    def _watch(self, fd: int) -> None:
        self._fd = fd
        self._loop.add_reader(fd, self._readable)

    def _unwatch(self) -> None:
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None

    def _readable(self) -> None:
        """Serve the requests that arrived whole (at most :data:`BATCH` now)."""
        for _ in range(BATCH):
            if self._stopped:
                return
            try:
                request = self._ctl.recv_nowait()
            except Exception as exc:  # the peer left, or the stream broke
                self._fail(exc)
                return
            if request is Unready.EMPTY:
                return
            if request is Unready.LARGE:  # one ordinary receive; reading resumes after it
                self._unwatch()
                self._post(resume=True)
                return
            self._handle(request)

    def _fail(self, exc: BaseException) -> None:
        if not self._stopped:
            self.stop()
            self._failed(exc)

    # -- from the receiving thread --------------------------------------------------------

    def _post(self, resume: bool = False) -> None:
        """Post one receive; its thread posts the next unless ``resume`` (loop reading)."""
        # No timeout: a peer may stay idle for as long as it likes; its death or a reset
        # (which closes the group) ends the receive.
        loop = self._loop

        def arrived(work: Any) -> None:
            if not resume and work.exception(0) is None:
                try:
                    self._post()
                except Exception as exc:  # closed meanwhile: the loop sees the failure
                    logger.debug("request receive not posted: %s", exc)
            loop.call_soon_threadsafe(self._arrived, work, resume)

        self._ctl.recv(async_op=True, timeout=wire_timeout(None))._add_done_callback(arrived)

    def _arrived(self, work: Any, resume: bool) -> None:
        if self._stopped:
            return
        exc = work.exception(0)
        if exc is not None:
            self._fail(exc)
            return
        self._handle(work.wait(0))
        if resume and not self._stopped:
            fd = self._ctl.recv_fileno()
            if fd is None:  # closed meanwhile: the next receive reports it
                self._post(resume=True)
            else:
                self._watch(fd)
