"""TensorBufferPool: bounded, non-blocking reuse of CPU ``torch.uint8`` buffers."""

from __future__ import annotations

import bisect
import threading
from types import TracebackType
from typing import Any

import torch

from p2p_compress._config import DEFAULT_POOL_BYTES, TensorBufferPoolConfig


class BufferLease:
    """One pooled buffer on loan; give it back exactly once.

    :meth:`release` returns the buffer to the pool's cache; :meth:`discard` frees it
    (used when compression did not shrink the data). Only the first of these calls
    acts; later calls return False and change nothing. A lease is also a context
    manager that releases on exit.

    Attributes:
        nbytes: the requested size in bytes.
        capacity: the buffer's size in bytes (>= ``nbytes``).
    """

    __slots__ = ("_buffer", "_pool", "capacity", "nbytes")

    def __init__(self, pool: TensorBufferPool, buffer: torch.Tensor, nbytes: int) -> None:
        self._pool: TensorBufferPool | None = pool
        self._buffer = buffer
        self.nbytes = nbytes
        self.capacity = buffer.numel()

    @property
    def buffer(self) -> torch.Tensor:
        """The whole buffer: a 1-d CPU ``torch.uint8`` tensor of ``capacity`` elements.

        Raises:
            ValueError: the lease was already released or discarded.
        """
        if self._pool is None:
            raise ValueError("the buffer lease was already released or discarded")
        return self._buffer

    @property
    def active(self) -> bool:
        """True until :meth:`release` or :meth:`discard` is called."""
        return self._pool is not None

    def release(self) -> bool:
        """Return the buffer to the pool's cache; True the first time, then False."""
        return self._finish(cache=True)

    def discard(self) -> bool:
        """Free the buffer instead of caching it; True the first time, then False."""
        return self._finish(cache=False)

    def _finish(self, cache: bool) -> bool:
        pool = self._pool
        if pool is None or not pool._return(self, cache):
            return False
        self._pool = None
        return True

    def __enter__(self) -> BufferLease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "active" if self.active else "returned"
        return f"<BufferLease nbytes={self.nbytes} capacity={self.capacity} {state}>"


class TensorBufferPool:
    """A process-wide cache of CPU ``torch.uint8`` buffers bounded by ``max_bytes``.

    ``max_bytes`` bounds the active (leased) plus cached (idle) capacity. Idle buffers
    are indexed by capacity, one list per size. :meth:`acquire` takes the smallest
    cached buffer that fits when its capacity is at most twice the request, or when
    allocating the exact size would exceed the budget; otherwise it allocates exactly
    the request, evicting idle buffers from the largest size bucket first when the new
    allocation needs room. It never waits: when nothing fits the budget it returns None
    and the caller keeps its tensor raw. Thread-safe. Bytes are counted by capacity.

    Args:
        max_bytes: the budget in bytes, >= 1 (default 2 GiB).

    Raises:
        ValueError: ``max_bytes`` is not an integer >= 1.

    Example:
        >>> pool = TensorBufferPool(max_bytes=1 << 20)
        >>> lease = pool.acquire(1000)
        >>> lease.buffer.numel(), pool.stats()["active_bytes"]
        (1000, 1000)
        >>> lease.release()
        True
        >>> pool.acquire(600).capacity  # 1000 <= 2 * 600: reused
        1000
    """

    def __init__(self, max_bytes: int = DEFAULT_POOL_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be an integer >= 1, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._idle: dict[int, list[torch.Tensor]] = {}
        self._sizes: list[int] = []  # sorted capacities with a non-empty idle list
        self._active: dict[int, BufferLease] = {}
        self._active_bytes = 0
        self._cached_bytes = 0
        self._counts = dict.fromkeys(
            ("hits", "misses", "evictions", "evicted_bytes", "rejections", "discards"), 0
        )

    @classmethod
    def from_config(cls, config: TensorBufferPoolConfig | None) -> TensorBufferPool:
        """Create an empty pool from a parsed ``tensor_buffer_pool`` section (None: default)."""
        return cls((config or TensorBufferPoolConfig()).max_bytes)

    def acquire(self, nbytes: int) -> BufferLease | None:
        """Lease a buffer of at least ``nbytes`` bytes without waiting.

        Args:
            nbytes: bytes needed, >= 0.

        Returns:
            A lease whose ``buffer`` has ``capacity >= nbytes`` elements, or None when
            neither a cached buffer fits nor an exact allocation fits the budget (even
            after evicting every idle buffer).

        Raises:
            ValueError: ``nbytes`` is not an integer >= 0.
        """
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
        with self._lock:
            used = self._active_bytes + self._cached_bytes
            sizes = self._sizes
            at = bisect.bisect_left(sizes, nbytes)
            if at < len(sizes):
                capacity = sizes[at]
                if capacity <= 2 * nbytes or used + nbytes > self.max_bytes:
                    return self._reuse_locked(capacity, nbytes)
            if self._active_bytes + nbytes > self.max_bytes:
                self._counts["rejections"] += 1
                return None
            while used + nbytes > self.max_bytes:
                used -= self._evict_largest_locked()
            # Allocation only reserves address space (pages fault in on first write),
            # so it is cheap enough to do under the lock.
            lease = BufferLease(self, torch.empty(nbytes, dtype=torch.uint8), nbytes)
            self._active_bytes += nbytes
            self._active[id(lease)] = lease
            self._counts["misses"] += 1
            return lease

    def stats(self) -> dict[str, Any]:
        """Return a consistent snapshot of the pool's accounting.

        Returns:
            ``max_bytes``; ``active_bytes`` / ``active_buffers`` (leased);
            ``cached_bytes`` / ``cached_buffers`` (idle); ``hits`` (reused a cached
            buffer); ``misses`` (allocated a new one); ``evictions`` / ``evicted_bytes``
            (idle buffers dropped for room); ``rejections`` (acquire returned None);
            ``discards`` (leases freed by :meth:`BufferLease.discard`).
        """
        with self._lock:
            out: dict[str, Any] = {
                "max_bytes": self.max_bytes,
                "active_bytes": self._active_bytes,
                "active_buffers": len(self._active),
                "cached_bytes": self._cached_bytes,
                "cached_buffers": sum(len(v) for v in self._idle.values()),
            }
            out.update(self._counts)
        return out

    def clear(self) -> int:
        """Drop every cached buffer (active leases are untouched); return bytes freed."""
        with self._lock:
            freed = self._cached_bytes
            self._idle.clear()
            self._sizes.clear()
            self._cached_bytes = 0
        return freed

    def _reuse_locked(self, capacity: int, nbytes: int) -> BufferLease:
        bucket = self._idle[capacity]
        buffer = bucket.pop()
        if not bucket:
            del self._idle[capacity]
            self._sizes.remove(capacity)
        self._cached_bytes -= capacity
        self._active_bytes += capacity
        self._counts["hits"] += 1
        lease = BufferLease(self, buffer, nbytes)
        self._active[id(lease)] = lease
        return lease

    def _evict_largest_locked(self) -> int:
        capacity = self._sizes[-1]
        bucket = self._idle[capacity]
        bucket.pop()
        if not bucket:
            del self._idle[capacity]
            self._sizes.pop()
        self._cached_bytes -= capacity
        self._counts["evictions"] += 1
        self._counts["evicted_bytes"] += capacity
        return capacity

    def _return(self, lease: BufferLease, cache: bool) -> bool:
        with self._lock:
            if self._active.pop(id(lease), None) is not lease:
                return False
            capacity = lease.capacity
            self._active_bytes -= capacity
            if not cache:
                self._counts["discards"] += 1
                return True
            bucket = self._idle.get(capacity)
            if bucket is None:
                bucket = self._idle[capacity] = []
                bisect.insort(self._sizes, capacity)
            bucket.append(lease._buffer)
            self._cached_bytes += capacity
            return True

    def __repr__(self) -> str:
        s = self.stats()
        return (
            f"<TensorBufferPool max_bytes={s['max_bytes']} active={s['active_bytes']} "
            f"cached={s['cached_bytes']}>"
        )
