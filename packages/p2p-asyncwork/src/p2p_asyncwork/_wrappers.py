"""Handles that wrap other libraries' pending operations.

torch.distributed works and anything with ``.future()`` (a Ray ``ObjectRef``) are wrapped
without importing either library.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from p2p_asyncwork._work import AsyncWork


class _DistWork(Protocol):
    def wait(self, *args: Any, **kwargs: Any) -> Any: ...


class _HasFuture(Protocol):
    def future(self) -> Future[Any]: ...


class AsyncCollWork(AsyncWork[Any]):
    """Wraps one or several ``torch.distributed`` Work objects (isend, irecv, broadcast).

    It completes when every wrapped work has completed, with ``result`` (for instance
    the tensor a broadcast filled) as its value; if any work fails, it fails with that
    work's error. ``then`` works as on every :class:`AsyncWork`.

    Args:
        works: One Work object or a sequence of them. Works that offer a future
            (``get_future()``) complete the handle from their callback. Gloo's isend/irecv
            works have no future and make progress only inside ``wait()``, so one daemon
            thread per handle waits on those, in order.
        result: The value ``wait()`` returns once all works are done.

    Raises:
        TypeError: An element is not a Work (no ``wait()``).
        ValueError: ``works`` is an empty sequence.

    Example:
        >>> import torch.distributed as dist  # doctest: +SKIP
        >>> work = AsyncCollWork(dist.isend(t, dst=1), result=t)  # doctest: +SKIP
        >>> work.then(lambda t: t.sum()).wait()  # doctest: +SKIP
    """

    def __init__(self, works: _DistWork | Sequence[_DistWork], result: Any = None) -> None:
        super().__init__()
        seq: list[Any] = list(works) if isinstance(works, (list, tuple)) else [works]
        if not seq:
            raise ValueError("AsyncCollWork(works): at least one work is required, got none")
        for i, w in enumerate(seq):
            if not callable(getattr(w, "wait", None)):
                raise TypeError(
                    f"AsyncCollWork(works): element {i} ({type(w).__name__}) is not a work:"
                    " it has no wait()"
                )
        self.works = seq
        self._final = result
        self._remaining = len(seq)
        self._finished = [False] * len(seq)
        self._count_lock = threading.Lock()
        no_future: list[int] = []
        for i, w in enumerate(seq):
            fut = _future_of(w)
            if fut is not None:
                fut.add_done_callback(lambda f, i=i: self._one_done(i, _outcome_of_future(f)))
            else:
                no_future.append(i)
        if no_future:
            threading.Thread(
                target=self._wait_works, args=(no_future,), name="p2p-collwork", daemon=True
            ).start()

    def _wait_works(self, indices: list[int]) -> None:
        for i in indices:
            try:
                self.works[i].wait()
            except BaseException as exc:
                self._one_done(i, exc)
                return
            self._one_done(i, None)

    def _one_done(self, index: int, exc: BaseException | None) -> None:
        if exc is not None:
            self._complete(exception=exc)
            return
        with self._count_lock:
            if self._finished[index]:
                return
            self._finished[index] = True
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._complete(result=self._final)


def _future_of(work: Any) -> Any:
    get = getattr(work, "get_future", None)
    if get is None:
        return None
    try:
        return get()
    except RuntimeError:  # "Work::getFuture not implemented" (gloo send/recv)
        return None


def _outcome_of_future(fut: Any) -> BaseException | None:
    try:
        fut.wait()
    except BaseException as exc:
        return exc
    return None


class AsyncChannelWork(AsyncWork[Any]):
    """Wraps anything whose ``.future()`` returns a :class:`concurrent.futures.Future`.

    A Ray ``ObjectRef`` is such a thing, so this handle needs no Ray import.

    Args:
        ref: The pending reference.
        transform: Optional function applied to the resolved value; its exception, if
            any, fails the work.

    Raises:
        TypeError: ``ref`` has no ``future()`` method.

    Example:
        >>> from concurrent.futures import Future
        >>> class Ref:
        ...     def __init__(self): self.f = Future()
        ...     def future(self): return self.f
        >>> ref = Ref()
        >>> work = AsyncChannelWork(ref)
        >>> ref.f.set_result("item")
        >>> work.wait(timeout=1.0)
        'item'
    """

    def __init__(self, ref: _HasFuture, transform: Callable[[Any], Any] | None = None) -> None:
        super().__init__()
        get = getattr(ref, "future", None)
        if not callable(get):
            raise TypeError(f"AsyncChannelWork(ref): {type(ref).__name__} has no future() method")
        self.ref = ref
        self._transform = transform
        get().add_done_callback(self._resolved)

    def _resolved(self, fut: Future[Any]) -> None:
        try:
            value = fut.result()
            if self._transform is not None:
                value = self._transform(value)
        except BaseException as exc:
            self._complete(exception=exc)
            return
        self._complete(result=value)
