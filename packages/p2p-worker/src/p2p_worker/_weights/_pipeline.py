"""What keeps a sync's memory bounded and its calls asynchronous.

:class:`Slots` bounds the buckets in flight on one side (received or prepared, being
applied or forwarded); a bucket's slot is freed when its last user releases it.
:func:`run_async` runs a sync on a thread of its own and hands back an ``AsyncWork``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from p2p_asyncwork import AsyncResultWork, AsyncWork
from p2p_collective import CollectiveTimeoutError
from p2p_worker._weights._edges import remaining

T = TypeVar("T")


class Slots:
    """At most ``count`` buckets in flight; each slot is freed by its last release."""

    def __init__(self, count: int) -> None:
        self._sem = threading.BoundedSemaphore(count)

    def take(self, users: int, deadline: float | None, what: str) -> Callable[[], None]:
        """Wait for a free slot; return the release function to call ``users`` times.

        Raises:
            CollectiveTimeoutError: No slot freed up before ``deadline``.
        """
        if not self._sem.acquire(timeout=remaining(deadline)):
            raise CollectiveTimeoutError(f"weight sync: {what}: no bucket slot freed up in time")
        left = [max(1, users)]
        lock = threading.Lock()

        def release() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._sem.release()

        if users == 0:
            release()
        return release


def run_async(fn: Callable[[], T], name: str) -> AsyncWork[T]:
    """Run ``fn`` on a new daemon thread; the handle completes with its result or error."""
    work: AsyncResultWork[T] = AsyncResultWork()

    def body() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the waiter
            work.set_exception(exc)
        else:
            work.set_result(result)

    threading.Thread(target=body, name=name, daemon=True).start()
    return work
