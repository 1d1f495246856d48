"""Header receives: when the receive of a direction's next header message is posted.

Every operation's first message is a header of at most ``HEADER_MAX`` bytes, so once an
operation has taken all its own messages, the receive of the next header can be posted
(into the other of two buffers). gloo moves a message only into a posted receive; a
send that finds none first trades "ready to send" / "ready to receive" notifications
with the receiver, and a synchronous send to a receiver that is busy elsewhere waits
for it.

Posting is not free: a gloo receive costs 5-15 us of the caller's time (it writes the
"ready" notification to the socket). Posted the moment a frame is in, it sits between
the arrival of a request and the reply to it. So the next header's receive is *armed*
then and posted by whichever comes first:

- this side's next send, right after that send's first message was handed to gloo
  (while it travels; a request/reply exchange never waits for the post);
- this side's next receive, before it waits;
- the :class:`HeaderPoster` thread, :data:`POST_DELAY` seconds later, so a small send
  to a receiver busy elsewhere still completes at once, and two peers that both send
  before they receive do not wait for each other.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import torch

from p2p_collective._framing import HEADER_MAX
from p2p_collective._recvpool import PostedRecv

if TYPE_CHECKING:
    from p2p_collective._transport import Link

POST_DELAY = 0.001
"""Seconds after a frame is in until the poster thread posts the next header receive."""
_IDLE_TICKS = 200  # ticks with nothing armed before the poster thread sleeps until woken

_NO_MAGIC = bytes(4)


class HeaderReceiver:
    """The header receives of one direction: two buffers, the next receive armed or posted.

    Thread-safe: the direction's receives, the other direction's sends and the poster
    thread all call in.
    """

    def __init__(self, poster: HeaderPoster | None) -> None:
        self._poster = poster
        self._lock = threading.Lock()
        # Allocated at the first receive: a group's sending side never needs them.
        self._bufs: tuple[torch.Tensor, ...] = ()
        self._views: tuple[memoryview, ...] = ()
        self._next = 0
        self._posted: PostedRecv | None = None
        self._armed: Link | None = None  # post the next header on this link when due
        self._due = 0.0  # when the poster thread posts an armed receive
        self._closed = False

    def _post_locked(self, link: Link) -> PostedRecv:
        i = self._next
        self._views[i][:4] = _NO_MAGIC  # a short stray message must not leave an old header
        return link.post_recv(self._bufs[i])

    def receive(self, link: Link, deadline: float | None) -> tuple[torch.Tensor, memoryview]:
        """Take the next header message (posted earlier or now); return buffer and view.

        The buffer is not reused before the next :meth:`receive`, so it stays valid for
        the rest of the operation that took it.
        """
        with self._lock:
            if not self._bufs:
                self._bufs = tuple(torch.zeros(HEADER_MAX, dtype=torch.uint8) for _ in range(2))
                self._views = tuple(b.numpy().data for b in self._bufs)
            self._armed = None
            posted, self._posted = self._posted, None
            if posted is None:
                posted = self._post_locked(link)
            i = self._next
            self._next = 1 - i
        link.wait_recv(posted, deadline)
        return self._bufs[i], self._views[i]

    def arm(self, link: Link) -> None:
        """The current operation has taken all its messages: the next header may come.

        Call from the operation that took the last header, after its last receive.
        """
        with self._lock:
            if self._closed or self._posted is not None:
                return
            if not link.posts_cost or self._poster is None:
                self._posted = self._post_locked(link)
                return
            self._due = time.monotonic() + POST_DELAY
            self._armed = link
        self._poster.armed(self)

    @property
    def is_armed(self) -> bool:
        """Whether a receive is armed and not yet posted."""
        return self._armed is not None

    def post_armed(self, now: float | None = None) -> bool:
        """Post the armed receive (if still armed; with ``now``, only once it is due).

        Any thread; never raises: a link that fails here fails the next receive too,
        which reports it. Returns whether a receive is still armed and not yet due.
        """
        if self._armed is None:  # unlocked look first: the common case is "nothing to do"
            return False
        with self._lock:
            link = self._armed
            if link is None or self._closed or self._posted is not None:
                self._armed = None
                return False
            if now is not None and now < self._due:
                return True
            self._armed = None
            try:
                self._posted = self._post_locked(link)
            except Exception:  # the next receive posts again and reports the failure
                self._posted = None
            return False

    def discard(self) -> None:
        """Forget the armed or posted receive (the link is closing; gloo drops it)."""
        with self._lock:
            self._closed = True
            self._armed = None
            self._posted = None
        if self._poster is not None:
            self._poster.forget(self)


class HeaderPoster:
    """One thread per Collective that posts armed header receives once they are due.

    A receive armed at ``t`` is posted at the first tick after ``t + POST_DELAY``. Each
    receiver registers once; the thread looks at all registered receivers every
    :data:`POST_DELAY` seconds while any was armed recently and sleeps until woken
    otherwise, so a stream of operations costs neither a wake-up nor a shared lock per
    frame.
    """

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._receivers: set[HeaderReceiver] = set()
        self._idle = True
        self._closed = False
        self._thread: threading.Thread | None = None
        self._name = f"p2p-post[{name}]"

    def armed(self, receiver: HeaderReceiver) -> None:
        """``receiver`` armed a receive: make sure a tick will see it."""
        if not self._idle and receiver in self._receivers:
            return  # the thread is ticking and knows the receiver
        with self._cond:
            if self._closed:
                return
            self._receivers.add(receiver)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._idle = False
            self._cond.notify()

    def forget(self, receiver: HeaderReceiver) -> None:
        """Stop looking at ``receiver`` (its direction closed)."""
        with self._cond:
            self._receivers.discard(receiver)

    def _loop(self) -> None:
        quiet = 0
        while True:
            with self._cond:
                if quiet >= _IDLE_TICKS:
                    quiet = 0
                    # Idle only if nothing is armed: a receiver armed after this thread's
                    # last look saw ``_idle`` False and did not wake it.
                    self._idle = not any(r.is_armed for r in self._receivers)
                while self._idle and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                receivers = list(self._receivers)
            time.sleep(POST_DELAY)
            now = time.monotonic()
            busy = False
            for receiver in receivers:
                busy = receiver.post_armed(now) or busy
            quiet = 0 if busy else quiet + 1
            del receivers

    def close(self) -> None:
        """Stop the thread (armed receives are dropped with their links)."""
        with self._cond:
            self._closed = True
            self._receivers.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)
