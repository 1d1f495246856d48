"""Codec work that runs exactly once: on a worker thread, or in the thread that needs it.

A :class:`Job` is queued to a :class:`Worker` so it can run ahead (compressing the next
frame while one is on the wire, decoding a payload while the next one arrives); the
thread that needs the result calls :meth:`Job.result`, which runs the job right there
when no worker has started it, so nobody waits behind unrelated work.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from p2p_collective._deadline import remaining
from p2p_collective._errors import CollectiveTimeoutError

T = TypeVar("T")


class Job(Generic[T]):
    """A unit of codec work run exactly once: by a worker thread, or by its consumer."""

    __slots__ = ("__weakref__", "_done", "_error", "_fn", "_lock", "_result", "_started")

    def __init__(self, fn: Callable[[], T]) -> None:
        self._fn: Callable[[], T] | None = fn
        self._lock = threading.Lock()
        self._started = False
        self._done = threading.Event()
        self._result: T | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        """Run the work unless someone already started (or cancelled) it."""
        with self._lock:
            if self._started:
                return
            self._started = True
            fn, self._fn = self._fn, None
        try:
            assert fn is not None
            self._result = fn()
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    def cancel(self) -> bool:
        """Prevent the work from running; True when it had not started."""
        with self._lock:
            if self._started:
                return False
            self._started = True
            self._fn = None
        self._done.set()
        return True

    def result(self, deadline: float | None) -> T:
        """Run the work here if nobody started it, else wait for it; return or raise its outcome.

        Raises:
            CollectiveTimeoutError: A worker is still running it at ``deadline``.
            BaseException: What the work raised.
        """
        self.run()
        if not self._done.wait(remaining(deadline)):
            raise CollectiveTimeoutError("codec work did not finish before the deadline")
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]


class Runnable(Protocol):
    """What a :class:`Worker` runs: a :class:`Job` of any result type."""

    def run(self) -> None: ...


class Worker:
    """Up to ``threads`` lazily started daemon threads that run queued jobs in FIFO order."""

    def __init__(self, name: str, threads: int = 1) -> None:
        self.name = name
        self._max = max(1, threads)
        self._queue: queue.SimpleQueue[Runnable | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = False

    def put(self, job: Runnable) -> None:
        with self._lock:
            if self._closed:
                return  # the consumer runs the job itself
            if len(self._threads) < self._max:
                t = threading.Thread(target=_work, args=(self._queue,), name=self.name, daemon=True)
                self._threads.append(t)
                t.start()
        self._queue.put(job)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for _ in self._threads:
                self._queue.put(None)


def _work(jobs: queue.SimpleQueue[Runnable | None]) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run()
        del job  # hold nothing (tensors, leases) while idle
