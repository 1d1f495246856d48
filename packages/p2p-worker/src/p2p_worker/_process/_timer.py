"""Worker timers: ``@Worker.timer(tag)`` and ``with self.worker_timer(tag)``.

Durations are collected per group call: the call's dispatcher opens a collection with
:func:`collect_durations`, every timer that finishes inside it adds its elapsed seconds to
its tag (a tag timed twice in one call sums), and the reply carries the dict back to the
caller's handle, which reduces it over the ranks (max by default).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from typing import Protocol, TypeVar

F = TypeVar("F", bound=Callable[..., object])


class _Timed(Protocol):
    """What a timed method runs on: a worker, with its ``worker_timer``."""

    def worker_timer(self, tag: str) -> AbstractContextManager[None]: ...


_CALL_DURATIONS: ContextVar[dict[str, float] | None] = ContextVar(
    "p2p_worker_call_durations", default=None
)

Reduction = str | Callable[[Sequence[float]], float]

_REDUCTIONS: dict[str, Callable[[Sequence[float]], float]] = {
    "max": max,
    "min": min,
    "sum": lambda xs: float(sum(xs)),
    "mean": lambda xs: float(sum(xs)) / len(xs),
}


def _check_tag(tag: object) -> str:
    if not isinstance(tag, str) or not tag:
        raise TypeError(f"tag must be a non-empty str, got {tag!r}")
    return tag


@contextmanager
def collect_durations() -> Iterator[dict[str, float]]:
    """Collect the durations of timers that finish inside the block (this thread/context).

    Yields:
        The dict that receives ``tag -> seconds``.
    """
    durations: dict[str, float] = {}
    token = _CALL_DURATIONS.set(durations)
    try:
        yield durations
    finally:
        _CALL_DURATIONS.reset(token)


@contextmanager
def timed(tag: str, fallback: dict[str, float]) -> Iterator[None]:
    """Time the block under ``tag``; record into the current call, else into ``fallback``."""
    _check_tag(tag)
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        sink = _CALL_DURATIONS.get()
        if sink is None:
            sink = fallback
        sink[tag] = sink.get(tag, 0.0) + elapsed


def timer(tag: str) -> Callable[[F], F]:
    """Decorate a worker method so that each call is timed under ``tag``.

    The decorated method must be a method of a :class:`~p2p_worker.Worker` (it uses
    ``self.worker_timer``). Coroutine methods are timed until they finish.

    Args:
        tag: Name the duration is reported under in ``consume_durations()``.

    Returns:
        The decorator.

    Raises:
        TypeError: ``tag`` is not a non-empty str.

    Example:
        >>> from p2p_worker import Worker
        >>> class MyWorker(Worker):
        ...     @Worker.timer("step")
        ...     def step(self):
        ...         return 1
    """
    _check_tag(tag)

    def decorate(func: F) -> F:
        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(self: _Timed, *args: object, **kwargs: object) -> object:
                with self.worker_timer(tag):
                    return await func(self, *args, **kwargs)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(self: _Timed, *args: object, **kwargs: object) -> object:
            with self.worker_timer(tag):
                return func(self, *args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def reduce_durations(
    per_rank: Sequence[Mapping[str, float]], reduction: Reduction = "max"
) -> dict[str, float]:
    """Reduce ``tag -> seconds`` dicts of several ranks into one, tag by tag.

    A tag only some ranks reported is reduced over those ranks.

    Args:
        per_rank: One dict per rank.
        reduction: ``"max"``, ``"min"``, ``"mean"``, ``"sum"`` or a function of a
            non-empty sequence of floats.

    Returns:
        ``tag -> reduced seconds``.

    Raises:
        ValueError: ``reduction`` is an unknown name.
        TypeError: ``reduction`` is neither a str nor callable.

    Example:
        >>> reduce_durations([{"a": 1.0}, {"a": 3.0, "b": 2.0}])
        {'a': 3.0, 'b': 2.0}
    """
    if isinstance(reduction, str):
        if reduction not in _REDUCTIONS:
            raise ValueError(
                f"reduction={reduction!r} is unknown; use one of {sorted(_REDUCTIONS)} "
                f"or a callable"
            )
        func = _REDUCTIONS[reduction]
    elif callable(reduction):
        func = reduction
    else:
        raise TypeError(f"reduction must be a str or callable, got {type(reduction).__name__}")
    values: dict[str, list[float]] = {}
    for durations in per_rank:
        for tag, seconds in durations.items():
            values.setdefault(tag, []).append(seconds)
    return {tag: float(func(xs)) for tag, xs in values.items()}
