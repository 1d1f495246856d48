"""Recycling of large receive buffers once the tensors built on them are garbage.

A received tensor must be freshly allocated, but fresh memory is expensive to fill:
measured on loopback, the page faults of receiving 64 MiB into a new ``torch.empty``
buffer cut throughput to well under half of receiving into a reused buffer. So large
received tensors are built on pooled buffers: each tensor owns a NumPy view of a pooled
block, and when the tensor's storage is freed (the user dropped the tensor and all its
views) the view dies and a finalizer returns the block to the pool. Nothing is reused
while any tensor still refers to it.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt
    from torch._C._distributed_c10d import Work

try:
    import numpy as _np
except ImportError:  # pragma: no cover - numpy is optional; without it nothing is pooled
    _np = None  # type: ignore[assignment]

POOL_MIN_BYTES = 1 << 20
"""Receive buffers smaller than this come straight from the allocator."""
_GRAIN = 1 << 20


class ReceiveBufferPool:
    """Bounded cache of idle receive blocks, shared by the groups of one Collective.

    Args:
        max_idle_bytes: Most bytes kept idle for reuse; 0 disables pooling.
    """

    def __init__(self, max_idle_bytes: int) -> None:
        self._max_idle = max_idle_bytes if _np is not None else 0
        self._lock = threading.Lock()
        self._idle: dict[int, deque[npt.NDArray[np.uint8]]] = {}
        self._idle_bytes = 0
        self._hits = 0
        self._misses = 0
        self._closed = False

    def take(self, nbytes: int) -> torch.Tensor:
        """A flat uint8 CPU tensor of ``nbytes`` bytes, pooled when large enough."""
        if nbytes < POOL_MIN_BYTES or self._max_idle == 0:
            return torch.empty(nbytes, dtype=torch.uint8)
        cap = -(-nbytes // _GRAIN) * _GRAIN
        base = None
        with self._lock:
            blocks = self._idle.get(cap)
            if blocks:
                base = blocks.pop()
                self._idle_bytes -= cap
                self._hits += 1
            else:
                self._misses += 1
        if base is None:
            base = _np.empty(cap, dtype=_np.uint8)
        view = base[:nbytes]
        weakref.finalize(view, self._give_back, base, cap).atexit = False
        return torch.from_numpy(view)

    def _give_back(self, base: npt.NDArray[np.uint8], cap: int) -> None:
        with self._lock:
            if self._closed or self._idle_bytes + cap > self._max_idle:
                return  # dropped: freed by the garbage collector
            self._idle.setdefault(cap, deque()).append(base)
            self._idle_bytes += cap

    def stats(self) -> dict[str, int]:
        """``idle_bytes``, ``hits`` and ``misses`` (pooled takes only)."""
        with self._lock:
            return {"idle_bytes": self._idle_bytes, "hits": self._hits, "misses": self._misses}

    def close(self) -> None:
        """Drop every idle block; blocks still in use are freed when their tensors are."""
        with self._lock:
            self._closed = True
            self._idle.clear()
            self._idle_bytes = 0


class PostedRecv:
    """A receive handed to gloo and not waited for yet (the tensor stays referenced)."""

    __slots__ = ("tensor", "work")

    def __init__(self, work: Work | None, tensor: torch.Tensor) -> None:
        self.work = work  # None: the link's receive completes without a gloo work
        self.tensor = tensor
