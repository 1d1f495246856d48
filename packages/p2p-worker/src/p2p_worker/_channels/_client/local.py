"""LocalChannel: RLinf's in-process channel, per-key FIFOs in this process's memory.

No channel worker, no transfer: an item put is the same object a get returns. Threads of
one process share it; it does not leave the process (pickling it is refused).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Any, NoReturn

from p2p_asyncwork.internal import check_timeout
from p2p_worker._channels._protocol.errors import ChannelEmpty, ChannelFull
from p2p_worker._channels._protocol.keys import DEFAULT_KEY, check_key, check_weight


class LocalChannel:
    """A channel held in this process (RLinf's ``LocalChannel``; ``Channel.create(local=True)``).

    Each key is its own FIFO, bounded by ``maxsize`` items (RLinf's rule: every key's
    queue gets the channel's ``maxsize``; 0: no bound). Blocking calls wait for another
    thread of this process, up to ``timeout`` seconds; ``*_nowait`` never wait and raise
    :class:`~p2p_worker.ChannelFull` / :class:`~p2p_worker.ChannelEmpty` (also
    :class:`asyncio.QueueFull` / :class:`asyncio.QueueEmpty`, RLinf's errors). There is
    nothing to wait for asynchronously, so ``async_op=True`` is refused, as in RLinf.

    Args:
        maxsize: Most items each key holds (int >= 0; 0: no bound).

    Raises:
        TypeError: ``maxsize`` is not an int.
        ValueError: ``maxsize`` is negative.

    Example:
        >>> ch = LocalChannel(maxsize=2)
        >>> ch.put("a", weight=1); ch.put("b", weight=2, key="k")
        >>> ch.qsize(), ch.get(key="k"), ch.get_batch(target_weight=1)
        (1, 'b', ['a'])
        >>> ch.get_nowait()
        Traceback (most recent call last):
        ...
        p2p_worker._channels._protocol.errors.ChannelEmpty: local channel: key 'default_queue' is empty
    """  # noqa: E501

    def __init__(self, maxsize: int = 0) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int):
            raise TypeError(f"maxsize must be an int, got {maxsize!r}")
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0 (0: no bound), got {maxsize}")
        self._maxsize = maxsize
        self._queues: dict[Hashable, deque[tuple[object, int]]] = {DEFAULT_KEY: deque()}
        self._bounds: dict[Hashable, int] = {DEFAULT_KEY: maxsize}
        self._changed = threading.Condition(threading.Lock())

    def __reduce__(self) -> NoReturn:
        raise TypeError("a LocalChannel lives in one process and cannot be pickled")

    def __repr__(self) -> str:
        return f"<LocalChannel maxsize={self._maxsize} keys={len(self._queues)}>"

    def __str__(self) -> str:
        """The default key's items (RLinf's ``str(channel)``)."""
        return str(self.peek_all())

    @property
    def is_local(self) -> bool:
        """True: RLinf's ``Channel.is_local``."""
        return True

    def create_queue(self, key: Hashable, maxsize: int = 0) -> None:
        """Make ``key``'s FIFO with its own bound, unless it exists (RLinf's)."""
        check_key(key)
        check_weight(maxsize, "maxsize")
        with self._changed:
            if key not in self._queues:
                self._queues[key] = deque()
                self._bounds[key] = maxsize

    def _queue(self, key: Hashable) -> deque[tuple[object, int]]:
        """``key``'s FIFO, made with the channel's bound on first use (holding the lock)."""
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            self._bounds[key] = self._maxsize
        return queue

    def _full(self, key: Hashable) -> bool:
        bound = self._bounds.get(key, self._maxsize)
        return bound > 0 and len(self._queues.get(key, ())) >= bound

    def qsize(self, key: Hashable = DEFAULT_KEY) -> int:
        """Items under ``key``."""
        with self._changed:
            return len(self._queues.get(check_key(key), ()))

    def empty(self, key: Hashable = DEFAULT_KEY) -> bool:
        """Whether ``key`` holds no item."""
        return self.qsize(key) == 0

    def full(self, key: Hashable = DEFAULT_KEY) -> bool:
        """Whether ``key``'s FIFO holds its bound."""
        with self._changed:
            return self._full(check_key(key))

    def maxsize(self, key: Hashable = DEFAULT_KEY) -> int:
        """``key``'s bound (RLinf's method; the channel's for a key not used yet)."""
        with self._changed:
            return self._bounds.get(check_key(key), self._maxsize)

    @staticmethod
    def _no_async(async_op: bool, what: str) -> None:
        if async_op:
            raise ValueError(
                f"async_op=True: a local channel does not support asynchronous {what} "
                f"(nothing travels); call it with async_op=False"
            )

    def put(
        self,
        item: object,
        weight: int = 0,
        key: Hashable = DEFAULT_KEY,
        nowait: bool = False,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> None:
        """Append ``item`` to ``key``'s FIFO; wait up to ``timeout`` s while it is full.

        Raises:
            ChannelFull: ``nowait`` and full, or still full after ``timeout``.
            TypeError, ValueError: A bad weight, key or timeout, or ``async_op=True``.
        """
        self._no_async(async_op, "puts")
        check_key(key)
        check_weight(weight)
        deadline = _deadline(0.0 if nowait else check_timeout(timeout))
        with self._changed:
            while self._full(key):
                if not self._changed.wait(_left(deadline)) and _expired(deadline):
                    raise ChannelFull(f"local channel: key {key!r} is full")
            self._queue(key).append((item, weight))
            self._changed.notify_all()

    def put_nowait(self, item: object, weight: int = 0, key: Hashable = DEFAULT_KEY) -> None:
        """Append ``item`` if there is room now.

        Raises:
            ChannelFull: ``key``'s FIFO is full.
        """
        self.put(item, weight, key, nowait=True)

    def get(
        self,
        key: Hashable = DEFAULT_KEY,
        nowait: bool = False,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Remove and return ``key``'s oldest item; wait up to ``timeout`` s for one.

        Raises:
            ChannelEmpty: ``nowait`` and empty, or still empty after ``timeout``.
            TypeError, ValueError: A bad key or timeout, or ``async_op=True``.
        """
        self._no_async(async_op, "gets")
        check_key(key)
        deadline = _deadline(0.0 if nowait else check_timeout(timeout))
        with self._changed:
            while not self._queues.get(key):
                if not self._changed.wait(_left(deadline)) and _expired(deadline):
                    raise ChannelEmpty(f"local channel: key {key!r} is empty")
            item = self._queues[key].popleft()[0]
            self._changed.notify_all()
            return item

    def get_nowait(self, key: Hashable = DEFAULT_KEY) -> Any:
        """Remove and return ``key``'s oldest item if there is one.

        Raises:
            ChannelEmpty: ``key`` holds no item.
        """
        return self.get(key, nowait=True)

    def get_batch(
        self,
        target_weight: int = 0,
        key: Hashable = DEFAULT_KEY,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> list[Any]:  # the caller's items, of the types it put
        """Take ``key``'s items, oldest first, until their weights reach ``target_weight``.

        ``Channel.get_batch``'s rule: waiting for more as needed, it stops before an item
        that would exceed the target; the first item is always taken and an item of
        weight 0 counts as 1. After ``timeout`` s a batch returns what it holds.

        Raises:
            ChannelEmpty: No item came within ``timeout``.
            TypeError, ValueError: A bad weight, key or timeout, or ``async_op=True``.
        """
        self._no_async(async_op, "batches")
        check_key(key)
        check_weight(target_weight, "target_weight")
        deadline = _deadline(check_timeout(timeout))
        batch: list[object] = []
        total = 0
        with self._changed:
            while True:
                queue = self._queues.get(key)
                while queue:
                    weight = max(queue[0][1], 1)
                    if batch and total + weight > target_weight:
                        return batch
                    batch.append(queue.popleft()[0])
                    total += weight
                    self._changed.notify_all()
                    if total >= target_weight:
                        return batch
                if not self._changed.wait(_left(deadline)) and _expired(deadline):
                    if batch:
                        return batch
                    raise ChannelEmpty(f"local channel: key {key!r} is empty")

    def peek_all(self, key: Hashable = DEFAULT_KEY) -> list[object]:
        """``key``'s items, oldest first, left in place."""
        with self._changed:
            return [item for item, _ in self._queues.get(check_key(key), ())]


def _deadline(timeout: float | None) -> float | None:
    return None if timeout is None else time.monotonic() + timeout


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def _expired(deadline: float | None) -> bool:
    return deadline is not None and time.monotonic() >= deadline
