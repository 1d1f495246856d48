"""AsyncFuncWork: a callback that runs when its predecessor completes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from p2p_asyncwork._cuda import record_event_if_cuda
from p2p_asyncwork._work import AsyncWork


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
        predecessor._add_done_callback(self._on_predecessor_done)

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
            last._add_done_callback(self._on_inner_done)
            return
        self._complete(result=out, cuda_event=record_event_if_cuda())

    def _on_inner_done(self, inner: AsyncWork[Any]) -> None:
        self._complete(
            result=inner._result, exception=inner._exception, cuda_event=inner._cuda_event
        )
