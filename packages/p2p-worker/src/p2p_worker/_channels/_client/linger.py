"""A linger timer: act once something held has gone unused for a while.

A channel handle holds two things for a short while in case the next call needs them:
put credits (slots the channel worker lent) and prefetched items. Both go back once
``idle()`` seconds passed without a call using them. :class:`Linger` is that
rule, once: :meth:`~Linger.touch` marks a use (and starts the timer while something is
held), the timer re-arms itself while uses keep coming, and runs ``fire`` under the
owner's lock once they stopped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

MIN_DELAY = 0.005
"""The shortest wait the timer is started with (seconds)."""


class Linger:
    """Runs ``fire`` once ``idle()`` seconds passed since the last use, while ``held()``.

    Args:
        idle: Returns the seconds without a use after which ``fire`` runs (read at each
            check, so a module-level setting may change while a timer runs).
        lock: Returns the context the timer takes before it checks and fires (the
            owner's lock; :meth:`touch` and :meth:`arm` are called holding it).
        held: Whether something is held (the timer runs only then).
        fire: Gives back what is held (called under ``lock``, once idle).

    Example:
        >>> import threading
        >>> lock, gave = threading.Lock(), threading.Event()
        >>> linger = Linger(lambda: 0.01, lambda: lock, lambda: True, gave.set)
        >>> with lock:
        ...     linger.touch()
        >>> gave.wait(5)
        True
    """

    __slots__ = ("_fire", "_held", "_idle", "_last", "_lock", "_timer")

    def __init__(
        self,
        idle: Callable[[], float],
        lock: Callable[[], AbstractContextManager[object]],
        held: Callable[[], bool],
        fire: Callable[[], None],
    ) -> None:
        self._idle = idle
        self._lock = lock
        self._held = held
        self._fire = fire
        self._last = 0.0
        self._timer: threading.Timer | None = None

    def touch(self, arm: bool = True) -> None:
        """A use now; with ``arm``, start the timer if something is held and none runs."""
        self._last = time.monotonic()
        if arm:
            self.arm()

    def arm(self) -> None:
        """Start the timer if something is held and none runs (holding the owner's lock)."""
        if self._timer is None and self._held():
            delay = max(self._idle() - (time.monotonic() - self._last), MIN_DELAY)
            self._timer = threading.Timer(delay, self._run)
            self._timer.daemon = True
            self._timer.start()

    def stop(self) -> None:
        """Cancel the timer (the owner closes)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _run(self) -> None:
        with self._lock():
            self._timer = None
            if time.monotonic() - self._last < self._idle():
                self.arm()  # used meanwhile: wait out the rest
            elif self._held():
                self._fire()
