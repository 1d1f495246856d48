"""The handle a group call returns: per-rank results, errors, and timer durations."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, cast

import ray

from p2p_asyncwork import AsyncWork, WorkTimeoutError
from p2p_worker._errors import WorkerError
from p2p_worker._process._actor import Failure, Reply
from p2p_worker._process._timer import Reduction, reduce_durations

_PENDING = object()

POLL_SECONDS = 0.1
"""How often a waiting handle checks finished replies for a failure while others run."""


def failure_error(group_name: str, rank: int, method: str, failure: Failure) -> WorkerError:
    """Build the WorkerError for a method that raised in worker ``rank``."""
    err = WorkerError(
        f"{failure.exc_type} in {method}() on worker {group_name}:{rank} (group "
        f"{group_name!r}, rank {rank}): {failure.message}\n\n"
        f"Remote traceback (worker {group_name}:{rank}):\n{failure.traceback.rstrip()}",
        group_name=group_name,
        rank=rank,
        method=method,
        remote_traceback=failure.traceback,
    )
    err.__cause__ = failure.exc
    return err


def ray_error(group_name: str, rank: int, method: str, exc: BaseException) -> WorkerError:
    """Build the WorkerError for a Ray-level failure (a dead worker, a lost object)."""
    what = "died" if isinstance(exc, ray.exceptions.RayActorError) else "failed in Ray"
    err = WorkerError(
        f"worker {group_name}:{rank} (group {group_name!r}, rank {rank}) {what} while "
        f"running {method}(): {type(exc).__name__}: {exc}",
        group_name=group_name,
        rank=rank,
        method=method,
    )
    err.__cause__ = exc
    return err


class GroupCallHandle(AsyncWork[list[Any]]):
    """Handle on one method call that runs on several workers of a group in parallel.

    ``wait()`` returns the per-rank results as a list, in the order of the ranks the
    call ran on. As soon as any worker fails, the handle fails with a
    :class:`~p2p_worker.WorkerError` naming the group, the rank, the method and the remote
    traceback (the other workers keep running). It is an
    :class:`~p2p_asyncwork.AsyncWork`: ``done()``, ``async_wait()``, ``await handle``
    and ``then()`` work as usual.

    Attributes:
        group_name: Name of the group.
        method: Name of the method.
        ranks: The ranks the call ran on, in result order.
        refs: Ray ``ObjectRef`` of each rank's reply.

    Example:
        >>> handle = group.step(batch)  # doctest: +SKIP
        >>> handle.wait(timeout=60)  # doctest: +SKIP
        [0.5, 0.25]
        >>> handle.consume_durations()  # doctest: +SKIP
        {'step': 1.25, 'forward': 0.75}
    """

    def __init__(
        self,
        group_name: str,
        method: str,
        ranks: Sequence[int],
        refs: Sequence[ray.ObjectRef[Reply]],
    ) -> None:
        super().__init__()
        self.group_name = group_name
        self.method = method
        self.ranks = tuple(ranks)
        self.refs = list(refs)
        self._index = {ref: i for i, ref in enumerate(self.refs)}
        self._results: list[object] = [_PENDING] * len(self.refs)
        self._durations: list[dict[str, float]] = [{} for _ in self.refs]
        self._remaining = len(self.refs)
        self._state_lock = threading.Lock()
        self._drive_lock = threading.Lock()
        self._armed = False
        self._consumed = False
        if not self.refs:
            self._complete(result=[])

    # -- resolving replies ----------------------------------------------------------------

    def _unresolved(self) -> list[ray.ObjectRef[Reply]]:
        with self._state_lock:
            return [r for i, r in enumerate(self.refs) if self._results[i] is _PENDING]

    def _settle(self, i: int, reply: Reply | None = None, exc: BaseException | None = None) -> None:
        """Record rank ``i``'s reply (or Ray error); complete the handle when it decides."""
        rank = self.ranks[i]
        error: WorkerError | None = None
        if exc is not None:
            error = ray_error(self.group_name, rank, self.method, exc)
        else:
            assert reply is not None
            ok, value, durations = reply
            if not ok:
                error = failure_error(self.group_name, rank, self.method, cast("Failure", value))
        with self._state_lock:
            if self._results[i] is not _PENDING:
                return
            if error is None:
                self._results[i] = value
                self._durations[i] = durations
            else:
                self._results[i] = None
            self._remaining -= 1
            last = self._remaining == 0
        if error is not None:
            self._complete(exception=error)
        elif last:
            self._complete(result=list(self._results))

    def _fetch(self, refs: Sequence[ray.ObjectRef[Reply]]) -> None:
        for ref in refs:
            try:
                reply = ray.get(ref)
            except ray.exceptions.RayError as exc:
                self._settle(self._index[ref], exc=exc)
            else:
                self._settle(self._index[ref], reply)

    def _drive(self, timeout: float | None) -> None:
        """Wait for replies until the handle completes or time runs out.

        The common case costs one ``ray.get`` of all replies, as a plain Ray call would.
        While some worker is still running, the replies already there are checked every
        :data:`POLL_SECONDS`, so one worker's failure is reported without waiting for the
        others (which may be blocked on the failed one).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._drive_lock.acquire(timeout=-1 if timeout is None else timeout):
            return
        try:
            while not super().done():
                pending = self._unresolved()
                if not pending:
                    return
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                step = POLL_SECONDS if left is None else min(POLL_SECONDS, left)
                try:
                    replies = ray.get(pending, timeout=step)
                except ray.exceptions.GetTimeoutError:
                    pass
                except ray.exceptions.RayError:
                    pass  # a worker died or an object was lost: settled per reply below
                else:
                    for ref, reply in zip(pending, replies, strict=True):
                        self._settle(self._index[ref], reply)
                    continue
                ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
                self._fetch(ready)
                if left is not None and left <= step:
                    return
        finally:
            self._drive_lock.release()

    def _arm(self) -> None:
        """Resolve replies from Ray's callbacks (for async_wait, then, callbacks)."""
        with self._state_lock:
            if self._armed:
                return
            self._armed = True
        for ref in self._unresolved():
            ref.future().add_done_callback(functools.partial(self._on_future, ref))

    def _on_future(self, ref: ray.ObjectRef[Reply], fut: Future[Reply]) -> None:
        try:
            reply = fut.result()
        except ray.exceptions.RayError as exc:
            self._settle(self._index[ref], exc=exc)
        except BaseException as exc:  # cancelled future or unexpected error
            self._settle(self._index[ref], exc=exc)
        else:
            self._settle(self._index[ref], reply)

    # -- AsyncWork interface ----------------------------------------------------------------

    def add_done_callback(self, fn: Callable[[AsyncWork[list[Any]]], None]) -> None:
        """As :meth:`AsyncWork.add_done_callback`; starts watching the ranks' replies first."""
        self._arm()
        super().add_done_callback(fn)

    def done(self) -> bool:
        """Return True once every rank replied or one failed. Never blocks."""
        if super().done():
            return True
        pending = self._unresolved()
        if pending:
            ready, _ = ray.wait(pending, num_returns=len(pending), timeout=0)
            self._fetch(ready)
        return super().done()

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Wait for every rank and return their results, in the order of :attr:`ranks`.

        Args:
            timeout: Seconds to wait; ``None`` waits without limit.

        Returns:
            One result per rank.

        Raises:
            WorkerError: A worker raised (the first failure seen) or died.
            WorkTimeoutError: The call did not finish within ``timeout`` (it keeps running).
        """
        if not super().done():
            self._drive(timeout)
        if not super().done():
            raise WorkTimeoutError(
                f"{self.method}() on group {self.group_name!r} ranks {list(self.ranks)} did "
                f"not finish within {timeout} s"
            )
        return super().wait(0)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Wait like :meth:`wait`; return the WorkerError, or ``None`` on success."""
        try:
            self.wait(timeout)
        except WorkTimeoutError:
            raise
        except BaseException as exc:
            return exc
        return None

    def consume_durations(
        self, reduction: Reduction = "max", *, timeout: float | None = None
    ) -> dict[str, float]:
        """Return the timer durations of this call, reduced over its ranks; once.

        Every ``@Worker.timer`` / ``worker_timer`` tag that finished during the call on
        any of its ranks appears, nested tags included; a tag timed several times in one
        call on one rank sums. The first call waits for the call to finish; later calls
        return ``{}``.

        Args:
            reduction: How to combine ranks: ``"max"`` (default), ``"min"``, ``"mean"``,
                ``"sum"`` or a function of a sequence of floats.
            timeout: Seconds to wait for the call to finish.

        Returns:
            ``tag -> seconds``.

        Raises:
            WorkerError: The call failed.
            WorkTimeoutError: It did not finish within ``timeout``.
            ValueError: ``reduction`` is an unknown name.

        Example:
            >>> group.run_training(batch).consume_durations()  # doctest: +SKIP
            {'run_training': 2.5, 'train_step': 2.25}
        """
        self.wait(timeout)
        reduced = reduce_durations(self._durations, reduction)  # bad reduction: nothing lost
        with self._state_lock:
            if self._consumed:
                return {}
            self._consumed = True
        return reduced

    def __repr__(self) -> str:
        state = "done" if super().done() else "pending"
        where = f"{self.group_name}.{self.method}() ranks={list(self.ranks)}"
        return f"<GroupCallHandle {where} {state}>"
