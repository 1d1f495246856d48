"""Buckets lent by reference to targets on the same node: the holder's shared arena.

A holder (the source, or the first target on a node) keeps its buckets in flight in one
anonymous shared-memory file (``memfd_create``: it never appears in ``/dev/shm``, and
the kernel frees it when the last process that maps it unmaps it or dies). Its
same-node children map that file (``/proc/<holder pid>/fd/<fd>``) and copy each bucket
straight from it into their own tensors: the holder writes a bucket once, whatever the
number of children, and no bucket is copied through a socket or a ring on the way.

Layout: a header page (the arena's id, then one 64-byte line per child holding the
count of lent buckets that child has finished reading), then ``regions`` regions of
``region_bytes`` each, one per bucket slot. The holder frees a region only when every
child it was lent to has counted past it, or has gone (:class:`Lender`).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch

from p2p_collective import CollectiveConfig

HEADER_BYTES = 4096
"""The header page: the arena id (16 bytes at 0), then one 64-byte line per child."""
MAX_CHILDREN = HEADER_BYTES // 64 - 1
"""Children one arena lends to at most (the rest get their buckets by value)."""
_ID_BYTES = 16
_POLL = 0.0005  # seconds between looks while waiting for the lent buckets at the end
_POLL_FIRST = 0.00005  # the watcher's first look after a change; it backs off to _POLL_MAX
_POLL_MAX = 0.001


class Liveness(Protocol):
    """What the lender asks of a child's pair group: whether the child is gone."""

    @property
    def peer_gone(self) -> bool:
        """True once the peer has died or closed its side."""
        ...


class _Mapped:
    """A mapping of an arena's file: its bytes, and the header's counter per child line."""

    def __init__(self, mm: mmap.mmap) -> None:
        self._mm: mmap.mmap | None = mm
        self._bytes = torch.frombuffer(mm, dtype=torch.uint8)
        self._counters = np.frombuffer(mm, dtype=np.uint64, count=HEADER_BYTES // 8)

    def _count(self, child: int, value: int | None = None) -> int:
        """Child line ``child``'s count (set to ``value`` first, when given)."""
        at = (child + 1) * 8  # one 64-byte line per child, after the id's line
        if value is not None:
            self._counters[at] = value
        return int(self._counters[at])

    def _unmap(self) -> None:
        """Drop the views and unmap (deferred to garbage collection while a view survives)."""
        self._counters = np.zeros(0, dtype=np.uint64)
        self._bytes = torch.zeros(0, dtype=torch.uint8)
        mm, self._mm = self._mm, None
        if mm is not None:
            with contextlib.suppress(BufferError):
                mm.close()


class Arena(_Mapped):
    """The holder's shared file: ``regions`` bucket regions of ``region_bytes`` each.

    Raises:
        OSError: memfd_create, ftruncate or mmap failed.
    """

    def __init__(self, regions: int, region_bytes: int) -> None:
        self.regions = regions
        self.region_bytes = region_bytes
        self.nbytes = HEADER_BYTES + regions * region_bytes
        self.id = secrets.token_hex(_ID_BYTES // 2)
        self.pid = os.getpid()
        self.fd = os.memfd_create("p2p-weights", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, self.nbytes)
            super().__init__(mmap.mmap(self.fd, self.nbytes))
        except BaseException:
            os.close(self.fd)
            raise
        stamp = torch.frombuffer(bytearray(self.id.encode()), dtype=torch.uint8)
        self._bytes[:_ID_BYTES].copy_(stamp)
        self._base = self._bytes.data_ptr()
        self.dirty = False
        """Set when a child may still read a region the holder gave up on: never reuse it."""

    def region(self, index: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """Region ``index`` as a 1-D tensor of ``numel`` values of ``dtype``."""
        nbytes = numel * dtype.itemsize
        if not 0 <= index < self.regions or nbytes > self.region_bytes:
            raise ValueError(f"arena: region {index} of {nbytes} bytes does not fit")
        start = HEADER_BYTES + index * self.region_bytes
        return self._bytes[start : start + nbytes].view(dtype)

    def offset_of(self, tensor: torch.Tensor) -> int | None:
        """Where ``tensor``'s bytes start in the arena, or None if they lie elsewhere."""
        off = tensor.data_ptr() - self._base
        nbytes = tensor.numel() * tensor.element_size()
        if off >= HEADER_BYTES and off + nbytes <= self.nbytes and tensor.is_contiguous():
            return off
        return None

    def reset(self, child: int) -> None:
        """Set child line ``child``'s count to 0 (before the child is told of the arena)."""
        self._count(child, 0)

    def finished(self, child: int) -> int:
        """How many lent buckets child line ``child`` has finished reading."""
        return self._count(child)

    def close(self) -> None:
        """Unmap and close (children that still map it keep their pages until they unmap)."""
        if self._mm is not None:
            self._unmap()
            with contextlib.suppress(OSError):
                os.close(self.fd)


def lending_off() -> str | None:
    """Why this process takes no part in lending (``P2P_WEIGHTS_LEND=0``), or None."""
    value = os.environ.get("P2P_WEIGHTS_LEND", "1").strip().lower()
    return f"P2P_WEIGHTS_LEND={value} in {os.getpid()}'s environment" if value in _OFF else None


_OFF = ("0", "false", "no", "off")


def lending(config: CollectiveConfig) -> bool:
    """Whether a source with this collective ``config`` lets same-node targets share.

    Not when the collective moves nothing through shared memory, when its links are
    emulated (every process then stands for a node of its own), or when
    ``P2P_WEIGHTS_LEND=0`` is in the source's environment.
    """
    return config.shared_memory and config.net_emulation is None and lending_off() is None


def fit_arena(arena: Arena | None, regions: int, region_bytes: int) -> Arena:
    """``arena`` if it is clean and its regions are large enough, else a new one.

    Raises:
        OSError: A new arena could not be made.
    """
    if (
        arena is not None
        and not arena.dirty
        and arena.regions >= regions
        and arena.region_bytes >= region_bytes
    ):
        return arena
    if arena is not None:
        arena.close()
    return Arena(regions, region_bytes)


class Borrowed(_Mapped):
    """A child's mapping of its holder's arena.

    Raises:
        OSError: The holder's file cannot be opened or mapped from this process.
        ValueError: What is mapped is not the arena named (another file, another size).
    """

    def __init__(self, pid: int, fd: int, nbytes: int, arena_id: str) -> None:
        self.key = (pid, fd, nbytes, arena_id)
        path = f"/proc/{pid}/fd/{fd}"
        own = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(own).st_size
            if size != nbytes:
                raise ValueError(f"{path} holds {size} bytes, the arena {nbytes}")
            super().__init__(mmap.mmap(own, nbytes))
        finally:
            os.close(own)
        got = bytes(self._bytes[:_ID_BYTES].tolist())
        if got != arena_id.encode():
            self.close()
            raise ValueError(f"{path} is not arena {arena_id} (it holds {got!r})")
        self.nbytes = nbytes

    def view(self, offset: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """The lent bucket at ``offset``: ``numel`` values of ``dtype``.

        Raises:
            ValueError: The range does not lie in the arena's regions.
        """
        nbytes = numel * dtype.itemsize
        if offset < HEADER_BYTES or offset + nbytes > self.nbytes or offset % dtype.itemsize:
            raise ValueError(f"lent bucket at {offset} (+{nbytes}) lies outside the arena")
        return self._bytes[offset : offset + nbytes].view(dtype)

    def finish(self, child: int, count: int) -> None:
        """Tell the holder that this child has finished reading ``count`` lent buckets."""
        self._count(child, count)

    def close(self) -> None:
        """Unmap (deferred to garbage collection while a view of it survives)."""
        self._unmap()


class Lender:
    """Frees lent bucket slots as the children finish reading them (one holder, one run).

    Each lent bucket's release waits in its child's queue; a thread looks at the
    children's counters while something is lent (50 us after a change, backing off to
    1 ms while nothing changes: small buckets come back within tens of microseconds,
    large ones in milliseconds), and frees everything a child holds as soon as its pair
    group reports it gone.
    """

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.shared: dict[int, int] = {}
        """Bucket index -> bytes lent (each bucket counted once, however many children)."""
        self._lock = threading.Condition()
        self._lines: dict[str, int] = {}
        self._groups: dict[str, Liveness] = {}
        self._lent: dict[str, int] = {}
        self._pending: dict[str, deque[Callable[[], None]]] = {}
        self._closed = False
        self._thread: threading.Thread | None = None

    def line(self, child: str, group: Liveness) -> int | None:
        """The counter line given to ``child`` (None: the arena has no line left)."""
        with self._lock:
            if child not in self._lines:
                if len(self._lines) >= MAX_CHILDREN:
                    return None
                self._lines[child] = len(self._lines)
                self.arena.reset(self._lines[child])
                self._groups[child] = group
                self._lent[child] = 0
                self._pending[child] = deque()
            return self._lines[child]

    def lend(self, child: str, index: int, nbytes: int, release: Callable[[], None]) -> None:
        """``child`` was told to read bucket ``index``: ``release`` runs once it has."""
        with self._lock:
            self.shared[index] = nbytes
            self._lent[child] += 1
            self._pending[child].append(release)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="p2p-weights-lender", daemon=True
                )
                self._thread.start()
            self._lock.notify()

    def finish(self, deadline: float | None) -> None:
        """Wait until every lent bucket is read or its child gone; then stop watching.

        A child still reading at ``deadline`` has its buckets freed anyway and the arena
        is marked dirty (it is not reused by a later run).
        """
        end = deadline if deadline is not None else float("inf")
        while True:
            with self._lock:
                if not any(self._pending.values()):
                    break
            if time.monotonic() >= end:
                self.arena.dirty = True
                break
            time.sleep(_POLL)
        with self._lock:
            self._closed = True
            pending = [r for q in self._pending.values() for r in q]
            for q in self._pending.values():
                q.clear()
            self._lock.notify()
        for release in pending:
            release()
        if self._thread is not None:
            self._thread.join(5.0)

    def _watch(self) -> None:
        pause = _POLL_FIRST
        while True:
            freed: list[Callable[[], None]] = []
            with self._lock:
                if self._closed:
                    return
                if not any(self._pending.values()):
                    self._lock.wait()
                    pause = _POLL_FIRST
                    continue
                for child, queue in self._pending.items():
                    if not queue:
                        continue
                    done = self._lent[child] - len(queue)  # released so far
                    seen = self.arena.finished(self._lines[child])
                    gone = self._groups[child].peer_gone
                    while queue and (gone or done < seen):
                        freed.append(queue.popleft())
                        done += 1
            for release in freed:
                release()
            if freed:
                pause = _POLL_FIRST
            else:
                time.sleep(pause)
                pause = min(2 * pause, _POLL_MAX)
