"""Waiting for the first of several works: :func:`wait_any`."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from p2p_asyncwork._work import AsyncWork


def wait_any(works: Iterable[AsyncWork[Any]], timeout: float | None = None) -> bool:
    """Block until at least one of ``works`` has completed, or ``timeout`` seconds pass.

    Completion, successful or not, wakes the caller at once (no polling); the results
    stay with the works (read them with ``done()`` / ``wait()``). An empty iterable, or one
    holding a completed work, returns True at once.

    Args:
        works: The works to watch.
        timeout: Seconds to wait; ``None`` waits without limit.

    Returns:
        True when some work has completed; False when ``timeout`` passed first.

    Example:
        >>> from p2p_asyncwork import AsyncResultWork, wait_any
        >>> a, b = AsyncResultWork(), AsyncResultWork()
        >>> wait_any([a, b], timeout=0.01)
        False
        >>> b.set_result(2)
        >>> wait_any([a, b]), a.done(), b.done()
        (True, False, True)
    """
    pending = list(works)
    if not pending or any(w.done() for w in pending):
        return True
    woken = threading.Event()

    def wake(_: AsyncWork[Any]) -> None:
        woken.set()

    for w in pending:
        # A work completing while the callbacks are added runs it at once.
        w.add_done_callback(wake)
    return woken.wait(timeout)
