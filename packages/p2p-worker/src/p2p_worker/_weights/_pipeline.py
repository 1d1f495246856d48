"""What keeps a sync's memory bounded and its calls asynchronous.

:class:`Slots` bounds the buckets in flight on one side (received or prepared, being
applied or forwarded); a bucket's slot is freed when its last user releases it.
:func:`run_async` runs a sync on a thread of its own and hands back an ``AsyncWork``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch

from p2p_asyncwork import AsyncResultWork, AsyncWork
from p2p_collective import CollectiveTimeoutError
from p2p_compress import TensorBufferPool
from p2p_compress.internal import BufferLease
from p2p_worker._weights._arena import Arena
from p2p_worker._weights._edges import remaining
from p2p_worker._weights._layout import Layout

T = TypeVar("T")


class Slot:
    """One bucket in flight: call it once per user; the last call frees the slot.

    Buffers borrowed for the bucket (:meth:`buffer`) go back to the pool with the slot,
    so that the next bucket writes into pages already faulted in: a fresh 32 MiB
    allocation costs 15-40 ms of page faults here, more than sending it over shared
    memory. With an arena, the slot's first buffer is its arena region instead (what
    same-node children read by reference).
    """

    __slots__ = ("_free", "_leases", "_left", "_lock", "_pool", "_region", "_sem")

    def __init__(
        self,
        sem: threading.BoundedSemaphore,
        users: int,
        pool: TensorBufferPool | None,
        region: tuple[Arena, int, Callable[[int], None]] | None = None,
    ) -> None:
        self._sem = sem
        self._pool = pool
        self._left = max(1, users)
        self._lock = threading.Lock()
        self._leases: list[BufferLease] = []
        self._region = region
        self._free = region

    def buffer(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D tensor of ``numel`` elements of ``dtype`` that lives as long as the slot."""
        nbytes = numel * dtype.itemsize
        with self._lock:
            region, self._region = self._region, None
        if region is not None and nbytes <= region[0].region_bytes:
            return region[0].region(region[1], numel, dtype)
        with self._lock:  # a freed slot would never give a lease back: none for it
            lease = None if self._pool is None or not self._left else self._pool.acquire(nbytes)
            if lease is not None:
                self._leases.append(lease)
        if lease is None:  # no pool, or over its budget: a buffer of its own
            return torch.empty(numel, dtype=dtype)
        return lease.buffer[:nbytes].view(dtype)

    def __call__(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
            leases, self._leases = (self._leases, []) if last else ([], self._leases)
        if last:
            for lease in leases:
                lease.release()
            if self._free is not None:
                self._free[2](self._free[1])
            self._sem.release()


class Slots:
    """At most ``count`` buckets in flight; each slot is freed by its last release.

    Args:
        count: Buckets in flight at most.
        pool: Where the slots' bucket buffers come from and go back to (None: each
            bucket allocates its own).
        arena: Shared regions (at least ``count``): each slot's first buffer is one of
            them, so that same-node children can read it by reference.
    """

    def __init__(
        self, count: int, pool: TensorBufferPool | None = None, arena: Arena | None = None
    ) -> None:
        self._sem = threading.BoundedSemaphore(count)
        self._pool = pool
        self._arena = arena
        self._regions = list(range(count)) if arena is not None else []
        self._regions_lock = threading.Lock()

    def _give_back(self, region: int) -> None:
        with self._regions_lock:
            self._regions.append(region)

    def take(self, users: int, deadline: float | None, what: str) -> Slot:
        """Wait for a free slot; return it (call it ``users`` times to release it).

        Raises:
            CollectiveTimeoutError: No slot freed up before ``deadline``.
        """
        if not self._sem.acquire(timeout=remaining(deadline)):
            raise CollectiveTimeoutError(f"weight sync: {what}: no bucket slot freed up in time")
        region = None
        if self._arena is not None:
            with self._regions_lock:
                region = (self._arena, self._regions.pop(), self._give_back)
        slot = Slot(self._sem, users, self._pool, region)
        if users == 0:
            slot()
        return slot


class BucketPools:
    """One side's bucket buffers, kept from one sync to the next.

    The pool holds at most ``count`` of the layout's largest buckets (the buffers of the
    slots in flight, then idle until the next sync); a new layout with bigger buckets
    gets a new pool.
    """

    def __init__(self, count: int) -> None:
        self._count = count
        self._bucket = 0
        self._pool: TensorBufferPool | None = None

    def get(self, layout: Layout) -> TensorBufferPool:
        """The pool for ``layout``'s buckets."""
        largest = max((b.nbytes for b in layout.buckets), default=1)
        if self._pool is None or largest > self._bucket:
            self._pool = TensorBufferPool(max(1, self._count * largest))
            self._bucket = largest
        return self._pool


def run_async(fn: Callable[[], T], name: str) -> AsyncWork[T]:
    """Run ``fn`` on a new daemon thread; the handle completes with its result or error."""
    work: AsyncResultWork[T] = AsyncResultWork()

    def body() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the waiter
            work.set_exception(exc)
        else:
            work.set_result(result)

    threading.Thread(target=body, name=name, daemon=True).start()
    return work
