"""Deadlines: the one set of time helpers every blocking call of the package uses.

A deadline is a ``time.monotonic()`` instant, or None for "no limit"; timeouts are
seconds (``float | None``). torch APIs take a ``datetime.timedelta`` instead.
"""

from __future__ import annotations

import datetime
import math
import time

_FOREVER = datetime.timedelta(days=30)  # "no limit": larger values overflow gloo's clock math


def remaining(deadline: float | None) -> float | None:
    """Seconds left until a ``time.monotonic()`` deadline (None: no limit), at least 0."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def deadline_after(seconds: float | None) -> float | None:
    """The ``time.monotonic()`` deadline ``seconds`` from now (None or ``inf``: no limit)."""
    if seconds is None or math.isinf(seconds):
        return None
    return time.monotonic() + seconds


def min_timeout(a: float | None, b: float | None) -> float | None:
    """The shorter of two timeouts (None: no limit)."""
    if a is None:
        return b
    return a if b is None else min(a, b)


def to_timedelta(seconds: float | None) -> datetime.timedelta:
    """A timedelta for torch APIs; ``None`` and ``inf`` become a very long one, 0 becomes 1 ms."""
    if seconds is None or seconds >= _FOREVER.total_seconds():
        return _FOREVER
    return datetime.timedelta(seconds=max(seconds, 0.001))


def is_timeout(exc: BaseException) -> bool:
    """Whether a torch / gloo exception reports a timeout (they carry no type for it)."""
    text = str(exc).lower()
    return isinstance(exc, TimeoutError) or "timed out" in text or "timeout" in text
