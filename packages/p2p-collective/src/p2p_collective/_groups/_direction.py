"""One direction of a group: a FIFO of operations executed strictly one at a time.

Operations run in submission order, never concurrently, so the messages of two
operations never interleave on the wire. A synchronous operation submitted while the
direction is idle runs at once in the caller's thread (no thread hand-off, which keeps
small-message latency close to a raw gloo message); everything else is executed by the
direction's own daemon thread, started on first need.

An operation that fails after it may have touched the wire breaks the direction: it
completes its own handle with the error, and every queued and later operation fails fast
with :class:`GroupBrokenError` whose ``__cause__`` is that first error. An operation that
fails before touching the wire (it raises :class:`CleanFailure`) leaves the direction
usable.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Generic, Literal, TypeVar, cast, overload

from p2p_asyncwork import AsyncResultWork, WorkTimeoutError
from p2p_collective._deadline import remaining
from p2p_collective._errors import (
    CleanFailure,
    CollectiveTimeoutError,
    GroupBrokenError,
    GroupClosedError,
    PeerError,
    PeerGoneError,
)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

_GRACE = 2.0  # seconds a waiting caller allows past the deadline the executor enforces


@dataclass
class DirectionStats:
    """Counters of one direction (updated only by the executing operation)."""

    messages: int = 0  # completed operations (frames, or send_tensor/recv_tensor calls)
    payload_bytes: int = 0  # tensor bytes plus pickled object bytes
    wire_bytes: int = 0  # every byte on the wire, headers included
    transport_messages: int = 0  # gloo messages
    busy_seconds: float = 0.0  # time spent executing operations
    failures: int = 0

    def as_dict(self) -> dict[str, int | float]:
        """A plain-dict copy."""
        return asdict(self)


class _Op(Generic[T_co]):
    # Covariant so that the queue holds operations of any result type (``_Op[object]``);
    # an operation's handle is only ever completed with the result of its own ``run``.
    __slots__ = ("deadline", "label", "run", "started", "work")

    def __init__(self, run: Callable[[float | None], T_co], label: str, deadline: float | None):
        self.run = run
        self.label = label
        self.deadline = deadline
        self.started = False
        self.work: AsyncResultWork[T_co] | None = None  # created by handle()

    def handle(self) -> AsyncResultWork[T_co]:
        if self.work is None:
            self.work = AsyncResultWork()
        return self.work


class Direction:
    """Ordered executor of one direction's operations."""

    def __init__(self, name: str, on_break: Callable[[BaseException], None] | None = None) -> None:
        self.name = name
        self.on_break = on_break  # called (executing thread) when an operation breaks it
        self.stats = DirectionStats()
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # fast paths take the bare lock
        self._queue: deque[_Op[object]] = deque()
        self._busy = False
        self._closed = False
        self._broken: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._current: _Op[object] | None = None
        self._sleepers = 0  # threads in self._cond.wait(): only they need a notify
        # Of those, the ones waiting for the running operation to end (not for new work):
        # an operation that ends wakes the idle executor only when something waits.
        self._idle_waiters = 0

    # -- submission ---------------------------------------------------------------------

    @overload
    def submit(
        self,
        run: Callable[[float | None], T],
        *,
        label: str,
        deadline: float | None,
        async_op: Literal[False],
        eager: bool = False,
    ) -> T: ...
    @overload
    def submit(
        self,
        run: Callable[[float | None], T],
        *,
        label: str,
        deadline: float | None,
        async_op: Literal[True],
        eager: bool = False,
    ) -> AsyncResultWork[T]: ...
    @overload
    def submit(
        self,
        run: Callable[[float | None], T],
        *,
        label: str,
        deadline: float | None,
        async_op: bool,
        eager: bool = False,
    ) -> T | AsyncResultWork[T]: ...

    def submit(
        self,
        run: Callable[[float | None], T],
        *,
        label: str,
        deadline: float | None,
        async_op: bool,
        eager: bool = False,
    ) -> T | AsyncResultWork[T]:
        """Queue ``run(deadline)``; return its handle (async) or its result (sync).

        With ``eager`` an asynchronous operation submitted while the direction is idle
        runs at once in the caller's thread, like a synchronous one; its handle is
        returned complete (a failure is stored in it, not raised).

        Raises:
            GroupBrokenError: The direction is broken (synchronous calls only; an async
                call returns a handle that has already failed).
            GroupClosedError: The direction is closed (likewise).
            CollectiveTimeoutError: A synchronous call ran out of time.
            Exception: What the operation raised (synchronous calls).
        """
        if not async_op or eager:
            with self._lock:
                inline = not (self._busy or self._queue or self._closed or self._broken is not None)
                if inline:
                    self._busy = True
            if inline:  # fast path: idle, run it right here in the caller's thread
                result, error = self._perform(run, label, deadline, None)
                if async_op:
                    done: AsyncResultWork[T] = AsyncResultWork()
                    if error is not None:
                        done.set_exception(error)
                    else:
                        done.set_result(cast("T", result))  # no error: run returned it
                    return done
                if error is not None:
                    raise error
                return cast("T", result)  # no error: run returned it
        op = _Op(run, label, deadline)
        work = op.handle()
        with self._cond:
            err = self._unusable_error(label)
            if err is None:
                self._queue.append(op)
                if async_op or threading.current_thread() is not self._thread:
                    self._ensure_thread()
                    self._cond.notify_all()
        if err is not None:
            work.set_exception(err)
            return work if async_op else work.wait()
        if async_op:
            return work
        if threading.current_thread() is self._thread:
            # A then-callback on this direction's own thread waits for a synchronous op:
            # execute the queue here, in order, up to and including that op.
            self._drain_until(op)
            return work.wait()
        return self._wait_sync(op)

    def run_if_idle(self, run: Callable[[float | None], T], label: str) -> tuple[bool, T | None]:
        """Run ``run(None)`` here and now if the direction is idle; never wait.

        Returns:
            ``(True, result)``, or ``(False, None)`` when another operation runs or is
            queued (nothing was run).

        Raises:
            GroupBrokenError, GroupClosedError: The direction is unusable.
            Exception: What ``run`` raised (a failure that may have touched the wire
                breaks the direction, as for any operation).
        """
        with self._lock:
            err = self._unusable_error(label)
            idle = err is None and not (self._busy or self._queue)
            if idle:
                self._busy = True
        if err is not None:
            raise err
        if not idle:
            return False, None
        result, error = self._perform(run, label, None, None)
        if error is not None:
            raise error
        return True, result

    def _unusable_error(self, label: str) -> BaseException | None:
        if self._closed:
            return GroupClosedError(f"{self.name}: {label} after the group was closed")
        if self._broken is not None:
            # broken by a dead peer: a PeerError too (PeerGoneError is both)
            cls = PeerGoneError if isinstance(self._broken, PeerError) else GroupBrokenError
            err = cls(
                f"{self.name}: {label} refused, an earlier failure broke this direction"
                f" ({type(self._broken).__name__}: {self._broken}); close the group on both"
                " sides and create a new one"
            )
            err.__cause__ = self._broken
            return err
        return None

    def _wait_sync(self, op: _Op[T]) -> T:
        work = op.handle()
        left = remaining(op.deadline)
        try:
            return work.wait(None if left is None else left + _GRACE)
        except WorkTimeoutError:
            pass
        err = CollectiveTimeoutError(
            f"{self.name}: {op.label} did not complete before its deadline"
            + (" (it was still running; the direction is now broken)" if op.started else "")
        )
        failed: list[tuple[_Op[object], BaseException]] = []
        with self._cond:
            if op.started and not work.done():
                failed = self._break_locked(err)
        _fail_all(failed)
        work.set_exception(err)
        return work.wait()

    # -- execution ----------------------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._busy or not self._queue):
                    self._sleep()
                if self._closed and not self._queue:
                    return
                if self._busy:
                    continue
                op = self._queue.popleft()
                self._busy = True
            self._execute(op)
            del op  # hold nothing (the group, its process groups) while idle

    def _sleep(self) -> None:
        self._sleepers += 1
        try:
            self._cond.wait()
        finally:
            self._sleepers -= 1

    def _drain_until(self, target: _Op[object]) -> None:
        while not target.handle().done():
            with self._cond:
                while self._busy:
                    self._idle_waiters += 1
                    try:
                        self._sleep()
                    finally:
                        self._idle_waiters -= 1
                if not self._queue:
                    return
                op = self._queue.popleft()
                self._busy = True
            self._execute(op)

    def _execute(self, op: _Op[T]) -> None:
        """Run one popped, queued operation and complete its handle."""
        result, error = self._perform(op.run, op.label, op.deadline, op)
        work = op.handle()
        if error is not None:
            work.set_exception(error)
        else:  # run returned it, or the op was abandoned (its handle is done already)
            work.set_result(cast("T", result))

    def _perform(
        self,
        run: Callable[[float | None], T],
        label: str,
        deadline: float | None,
        op: _Op[object] | None,
    ) -> tuple[T | None, BaseException | None]:
        """Run one operation (``_busy`` is set by the caller); return (result, error).

        ``op`` is the queued operation, or None for one run inline (nobody else waits
        on it).
        """
        result: T | None = None
        error: BaseException | None = None
        started = False
        t0 = time.perf_counter()
        try:
            if op is not None and op.work is not None and op.work.done():
                return None, None  # abandoned by a timed-out caller
            if deadline is not None and time.monotonic() >= deadline:
                error = CollectiveTimeoutError(
                    f"{self.name}: {label} timed out while waiting in the queue"
                )
                return None, error
            started = True
            if op is not None:
                op.started = True
                self._current = op
            try:
                result = run(deadline)
            except CleanFailure as clean:
                error = clean.error
                _scrub(error)
            except BaseException as exc:
                error = exc
                _scrub(exc)
                with self._cond:
                    failed = self._break_locked(exc)
                _fail_all(failed)
                if self.on_break is not None:
                    self.on_break(exc)
            return result, error
        finally:
            stats = self.stats
            if started:
                stats.busy_seconds += time.perf_counter() - t0
            if error is not None:
                stats.failures += 1
            with self._lock:
                self._busy = False
                self._current = None
                # The idle executor sleeps until work is queued: wake it (and anyone
                # waiting for this operation to end) only when that is what they wait for.
                if self._sleepers and (self._queue or self._idle_waiters or self._closed):
                    self._cond.notify_all()

    def abort(self, exc: BaseException) -> None:
        """Break the direction with ``exc`` and fail the running operation's handle.

        Called from another thread (the liveness watcher) when the peer is gone. The
        thread running the operation may stay blocked in the transport until its
        deadline; its late outcome is ignored.
        """
        with self._cond:
            current = self._current
            failed = self._break_locked(exc)
        _fail_all(failed)
        if current is not None and current.work is not None:
            current.work.set_exception(exc)

    def _break_locked(self, exc: BaseException) -> list[tuple[_Op[object], BaseException]]:
        """Mark broken; return the queued ops and their errors, to fail outside the lock."""
        if self._broken is not None:
            return []
        self._broken = exc
        failed: list[tuple[_Op[object], BaseException]] = []
        while self._queue:
            pending = self._queue.popleft()
            err = self._unusable_error(pending.label)
            if err is not None:
                failed.append((pending, err))
        return failed

    # -- state --------------------------------------------------------------------------

    @property
    def broken(self) -> BaseException | None:
        """The error that broke this direction, or None."""
        return self._broken

    def snapshot(self) -> dict[str, int | float]:
        """Stats as a plain dict, plus the direction's state."""
        with self._cond:
            out = self.stats.as_dict()
            out["queued"] = len(self._queue)
            out["broken"] = self._broken is not None
        return out

    def begin_close(self) -> None:
        """Refuse new operations and fail queued ones with GroupClosedError (never blocks)."""
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        _fail_all(
            [
                (op, GroupClosedError(f"{self.name}: {op.label} cancelled by close()"))
                for op in pending
            ]
        )

    def finish_close(self, deadline: float | None) -> bool:
        """Wait until the running operation (if any) has ended and the thread has exited.

        An operation already on the wire cannot be interrupted; it ends when it
        completes, fails (for instance because the peer closed too) or reaches its own
        deadline. Waiting here lets it end while the interpreter is still fully alive: a
        thread that returns from a gloo call during interpreter shutdown aborts the
        process.

        Returns:
            True when the direction is idle and its thread has exited.
        """
        me = threading.current_thread()
        with self._cond:
            while self._busy and self._thread is not me:
                left = remaining(deadline)
                if left == 0.0:
                    return False
                self._sleepers += 1
                self._idle_waiters += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._sleepers -= 1
                    self._idle_waiters -= 1
        thread = self._thread
        if thread is not None and thread is not me:
            thread.join(remaining(deadline))
            return not thread.is_alive()
        return True

    def close(self, timeout: float | None) -> None:
        """:meth:`begin_close`, then :meth:`finish_close` within ``timeout`` seconds."""
        self.begin_close()
        self.finish_close(None if timeout is None else time.monotonic() + timeout)


def _scrub(exc: BaseException) -> None:
    """Drop the local variables of an error's finished frames (and its causes' frames).

    A failed operation's error is kept (by its handle, and as the cause of a broken
    direction); its traceback frames would otherwise keep the payload and the process
    group alive. The traceback itself (files, lines) stays intact.
    """
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc]
    while stack:
        err = stack.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        traceback.clear_frames(err.__traceback__)
        stack += [err.__cause__, err.__context__]


def _fail_all(failed: list[tuple[_Op[object], BaseException]]) -> None:
    for op, err in failed:
        op.handle().set_exception(err)
