"""Work handles: AsyncWork, AsyncResultWork (set by a producer), AsyncFuncWork (then())."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Generator
from typing import Any, Generic, TypeVar

from p2p_asyncwork._cuda import record_event_if_cuda, stream_wait
from p2p_asyncwork._errors import WorkTimeoutError

T = TypeVar("T")
# A handle only hands its result out (wait, await, callbacks), so AsyncWork[int] is an
# AsyncWork[object]; AsyncResultWork, whose producer sets the result, stays invariant.
T_co = TypeVar("T_co", covariant=True)
_MISSING: Any = object()
_log = logging.getLogger("p2p_asyncwork")


def _run_callback(fn: Callable[[Any], None], work: AsyncWork[Any]) -> None:
    """Call one done-callback; what it raises is logged, never passed to the completer."""
    try:
        fn(work)
    except Exception:
        _log.exception("done-callback %r of %r raised; ignored", fn, work)


class AsyncWork(Generic[T_co]):
    """A handle on an operation that completes later, possibly on another thread.

    The vocabulary follows :class:`concurrent.futures.Future` and ``torch.futures``:
    ``done()`` never blocks, ``wait()`` blocks with an optional timeout, and
    ``await work`` (or ``await work.async_wait()``) suspends a coroutine without
    parking a thread. A failed work stores its exception; ``wait()`` re-raises it, and
    so does every work chained after it with :meth:`then`.

    When the work carries a CUDA event (recorded by the producer on its own stream),
    ``wait()`` and ``async_wait()`` make the caller's current stream wait on it before
    returning, so results are safe to use on the caller's stream.

    Example:
        >>> from p2p_asyncwork import AsyncResultWork
        >>> work = AsyncResultWork()
        >>> doubled = work.then(lambda v: v * 2)
        >>> work.set_result(21)
        >>> doubled.wait(timeout=1.0)
        42
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._done = False
        # One held lock per thread blocked in wait() (see _settled), released on
        # completion. Most works complete before anyone waits (a send run inline, a
        # callback's work), and a threading.Event would cost a Condition's set-up on
        # every operation and a Python-level Condition.wait on every blocking wait.
        self._waiters: list[threading.Lock] | None = None
        self._result: Any = _MISSING
        self._exception: BaseException | None = None
        self._callbacks: list[Callable[[AsyncWork[T_co]], None]] = []
        self._cuda_event: Any = None
        self._next: AsyncWork[Any] | None = None

    # -- completion (producer side) -----------------------------------------------------

    def _complete(
        self, result: Any = None, exception: BaseException | None = None, cuda_event: Any = None
    ) -> bool:
        """Complete once; later calls are ignored and return False."""
        with self._lock:
            if self._done:
                return False
            self._result = result
            self._exception = exception
            self._cuda_event = cuda_event
            self._done = True
            waiters, self._waiters = self._waiters, None
            callbacks, self._callbacks = self._callbacks, []
        for waiter in waiters or ():
            waiter.release()
        for cb in callbacks:
            _run_callback(cb, self)
        return True

    def add_done_callback(self, fn: Callable[[AsyncWork[T_co]], None]) -> None:
        """Call ``fn(work)`` once the work completes, successfully or not.

        ``fn`` runs in the thread that completes the work (a transport thread, for the
        works of a group), or at once in the calling thread if the work is already done,
        as :meth:`concurrent.futures.Future.add_done_callback` does. It should be quick
        and must not block: hand longer work to a queue or an event loop
        (``loop.call_soon_threadsafe``). Callbacks run in the order they were added. An
        exception raised by ``fn`` is logged (logger ``p2p_asyncwork``) and dropped, so
        one failing callback neither reaches the transport nor stops the others.

        Example:
            >>> from p2p_asyncwork import AsyncResultWork
            >>> seen = []
            >>> work = AsyncResultWork()
            >>> work.add_done_callback(lambda w: seen.append(w.wait()))
            >>> work.set_result(7)
            >>> seen
            [7]
        """
        with self._lock:
            if not self._done:
                self._callbacks.append(fn)
                return
        _run_callback(fn, self)

    def _settled(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: no limit) for completion; whether it came."""
        with self._lock:
            if self._done:
                return True
            if timeout is not None and timeout <= 0:
                return False
            waiter = threading.Lock()
            waiter.acquire()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waiter)
        limit = -1 if timeout is None else min(timeout, threading.TIMEOUT_MAX)
        if waiter.acquire(True, limit):
            return True
        with self._lock:
            if self._waiters is not None and waiter in self._waiters:
                self._waiters.remove(waiter)
                return False
        return True  # completed between the timeout and the lock: released meanwhile

    # -- consumer side ------------------------------------------------------------------

    def done(self) -> bool:
        """Return True when the work has completed, successfully or not. Never blocks."""
        return self._done

    def wait(self, timeout: float | None = None) -> T_co:
        """Block until the work completes and return its result.

        Args:
            timeout: Seconds to wait; ``None`` waits without limit.

        Returns:
            The work's result.

        Raises:
            WorkTimeoutError: The work did not complete within ``timeout`` seconds
                (it keeps running; a later ``wait`` may still succeed).
            BaseException: The exception the work or a callback before it failed with.
        """
        if not self._settled(timeout):
            raise WorkTimeoutError(f"{type(self).__name__} did not complete within {timeout} s")
        return self._outcome()

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like :meth:`wait` and return the stored exception, or ``None`` on success.

        Raises:
            WorkTimeoutError: The work did not complete within ``timeout`` seconds.
        """
        if not self._settled(timeout):
            raise WorkTimeoutError(f"{type(self).__name__} did not complete within {timeout} s")
        return self._exception

    async def async_wait(self) -> T_co:
        """Suspend the running coroutine until the work completes; return its result.

        No thread is parked per waiter: the completing thread resolves an asyncio future
        through ``loop.call_soon_threadsafe``.

        Raises:
            BaseException: The exception the work failed with.
        """
        if not self._done:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[None] = loop.create_future()

            def wake(_: AsyncWork[T_co]) -> None:
                # RuntimeError: the loop was closed meanwhile; nobody is waiting any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_resolve, fut)

            self.add_done_callback(wake)
            await fut
        return self._outcome()

    def __await__(self) -> Generator[Any, None, T_co]:
        return self.async_wait().__await__()

    def _outcome(self) -> T_co:
        if self._exception is not None:
            raise self._exception
        if self._cuda_event is not None:
            stream_wait(self._cuda_event)
        return self._result  # type: ignore[no-any-return]

    # -- chaining -----------------------------------------------------------------------

    def then(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> AsyncFuncWork:
        """Schedule ``func(result, *args, **kwargs)`` to run when this work completes.

        The callback runs in the thread that completes this work (at once, in the
        calling thread, if it is already done); keep it short. If it returns an
        :class:`AsyncWork`, the returned handle completes only when the last work of
        that chain completes, with that work's result.

        Args:
            func: Called with this work's result as its first argument.
            *args: Further positional arguments for ``func``.
            **kwargs: Keyword arguments for ``func``.

        Returns:
            An :class:`AsyncFuncWork` whose result is ``func``'s return value. If this
            work fails, ``func`` is not called and the returned work fails with the
            same exception.

        Example:
            >>> from p2p_asyncwork import AsyncResultWork
            >>> w = AsyncResultWork()
            >>> w2 = w.then(lambda buf, scale: buf * scale, 10)
            >>> w.set_result(4)
            >>> w2.wait()
            40
        """
        nxt = AsyncFuncWork(self, func, args, kwargs)
        self._next = nxt
        return nxt

    def get_next_work(self) -> AsyncWork[Any] | None:
        """Return the work most recently chained to this one with :meth:`then`, if any."""
        return self._next

    def get_last_work(self) -> AsyncWork[Any]:
        """Follow :meth:`get_next_work` to the end of the chain and return that work."""
        work: AsyncWork[Any] = self
        while work._next is not None:
            work = work._next
        return work

    def __repr__(self) -> str:
        if not self._done:
            state = "pending"
        elif self._exception is not None:
            state = f"failed: {type(self._exception).__name__}"
        else:
            state = "done"
        return f"<{type(self).__name__} {state}>"


class AsyncFuncWork(AsyncWork[Any]):
    """Runs ``func(result, *args, **kwargs)`` once ``predecessor`` completes.

    Created by :meth:`AsyncWork.then`. The callback runs in the thread that completes
    the predecessor. After it returns, a CUDA event is recorded on the current stream
    when CUDA is initialized, and ``wait()`` / ``async_wait()`` make the caller's stream
    wait on it. If the callback returns an :class:`AsyncWork`, this work completes when
    the last work of that chain completes, with its result. If the predecessor failed,
    the callback is skipped and this work fails with the same exception; an exception
    raised by the callback fails this work and every work chained after it.

    Example:
        >>> from p2p_asyncwork import AsyncResultWork
        >>> first = AsyncResultWork()
        >>> second = AsyncResultWork()
        >>> chained = first.then(lambda _: second)
        >>> first.set_result(None)
        >>> chained.done()
        False
        >>> second.set_result("from the inner chain")
        >>> chained.wait()
        'from the inner chain'
    """

    def __init__(
        self,
        predecessor: AsyncWork[Any],
        func: Callable[..., Any],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not callable(func):
            raise TypeError(f"then(func): func must be callable, got {type(func).__name__}")
        self._func = func
        self._args = args
        self._kwargs = kwargs or {}
        self._predecessor = predecessor
        predecessor.add_done_callback(self._on_predecessor_done)

    def _on_predecessor_done(self, pred: AsyncWork[Any]) -> None:
        if pred._exception is not None:
            self._complete(exception=pred._exception)
            return
        try:
            out = self._func(pred._result, *self._args, **self._kwargs)
        except BaseException as exc:  # stored and re-raised by wait(); nothing escapes here
            self._complete(exception=exc)
            return
        if isinstance(out, AsyncWork):
            last = out.get_last_work()
            last.add_done_callback(self._on_inner_done)
            return
        self._complete(result=out, cuda_event=record_event_if_cuda())

    def _on_inner_done(self, inner: AsyncWork[Any]) -> None:
        self._complete(
            result=inner._result, exception=inner._exception, cuda_event=inner._cuda_event
        )


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class AsyncResultWork(AsyncWork[T]):
    """A work completed explicitly by its producer, from any thread.

    This is the handle that queued operations (a send or receive on a collective group,
    a channel operation) return: the thread that performs the operation calls
    :meth:`set_result` or :meth:`set_exception` exactly once.

    Example:
        >>> import threading
        >>> from p2p_asyncwork import AsyncResultWork
        >>> work = AsyncResultWork()
        >>> threading.Thread(target=work.set_result, args=("payload",)).start()
        >>> work.wait(timeout=5.0)
        'payload'
    """

    def set_result(self, result: T, cuda_event: Any = None) -> None:
        """Complete the work with ``result``; ignored if the work is already complete.

        Args:
            result: The value ``wait()`` returns.
            cuda_event: Optional ``torch.cuda.Event`` that consumers' streams wait on.
        """
        self._complete(result=result, cuda_event=cuda_event)

    def set_exception(self, exception: BaseException) -> None:
        """Complete the work with an error that ``wait()`` re-raises (ignored if complete)."""
        self._complete(exception=exception)
