"""The shared arena of a weight sync: a real second process maps it, reads, counts."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from typing import Any

import pytest
import torch

from p2p_compress import TensorBufferPool
from p2p_worker._weights._arena import MAX_CHILDREN, Arena, Borrowed, Lender, fit_arena
from p2p_worker._weights._pipeline import Slots

REGION = 1 << 20


def reader(pid: int, fd: int, nbytes: int, arena_id: str, jobs: Any, out: Any) -> None:
    """Another process: map the arena, sum each lent region, count it done."""
    borrowed = Borrowed(pid, fd, nbytes, arena_id)
    count = 0
    while True:
        job = jobs.get()
        if job is None:
            break
        offset, numel = job
        out.put(int(borrowed.view(offset, numel, torch.int32).sum()))
        count += 1
        borrowed.finish(0, count)
    borrowed.close()


class Child:
    """The lender's view of a child's pair group: only whether it is gone."""

    def __init__(self) -> None:
        self.peer_gone = False


def test_another_process_reads_lent_regions_and_frees_them_by_counting() -> None:
    arena = Arena(3, REGION)
    ctx = mp.get_context("spawn")
    jobs, out = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=reader, args=(arena.pid, arena.fd, arena.nbytes, arena.id, jobs, out))
    proc.start()
    lender = Lender(arena)
    assert lender.line("r:1", Child()) == 0
    slots = Slots(3, None, arena)
    freed: list[int] = []
    try:
        for index in range(8):  # more buckets than regions: each region is reused
            slot = slots.take(1, time.monotonic() + 30, f"bucket {index}")
            buf = slot.buffer(REGION // 4, torch.int32)
            offset = arena.offset_of(buf)
            assert offset is not None  # the slot's first buffer is its arena region
            buf.fill_(index + 1)
            lender.lend("r:1", index, REGION, lambda i=index, s=slot: (freed.append(i), s()))
            jobs.put((offset, REGION // 4))
            assert out.get(timeout=30) == (index + 1) * (REGION // 4)
        lender.finish(time.monotonic() + 30)
    finally:
        jobs.put(None)
        proc.join(30)
    assert freed == list(range(8))  # in order, each once, after the child counted it
    assert sum(lender.shared.values()) == 8 * REGION
    assert not arena.dirty
    arena.close()


def test_a_gone_child_frees_its_buckets_and_a_late_one_makes_the_arena_dirty() -> None:
    arena = Arena(2, REGION)
    lender = Lender(arena)
    gone, slow = Child(), Child()
    lender.line("gone", gone)
    lender.line("slow", slow)
    freed: list[str] = []
    lender.lend("gone", 0, 10, lambda: freed.append("gone"))
    lender.lend("slow", 0, 10, lambda: freed.append("slow"))
    gone.peer_gone = True
    deadline = time.monotonic() + 5
    while "gone" not in freed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert freed == ["gone"]  # the other child has not read yet
    lender.finish(time.monotonic() + 0.2)  # it never will: freed at the deadline
    assert freed == ["gone", "slow"]
    assert arena.dirty  # a late reader may still look: never reused
    again = fit_arena(arena, 2, REGION)
    assert again is not arena
    assert fit_arena(again, 2, REGION // 2) is again  # clean and big enough: kept
    bigger = fit_arena(again, 2, 2 * REGION)
    assert bigger is not again  # too small: a new one (the old one closed)
    crowd = Lender(bigger)  # one counter line per child, as many as the header holds
    lines = [crowd.line(f"c{i}", Child()) for i in range(MAX_CHILDREN + 1)]
    assert lines == [*range(MAX_CHILDREN), None]  # the next child gets buckets by value
    assert crowd.line("c0", Child()) == 0
    bigger.close()


def test_a_wrong_arena_is_refused_by_name() -> None:
    arena = Arena(1, REGION)
    with pytest.raises(ValueError, match="is not arena"):
        Borrowed(arena.pid, arena.fd, arena.nbytes, "0" * 16)
    with pytest.raises(ValueError, match="bytes, the arena"):
        Borrowed(arena.pid, arena.fd, arena.nbytes + 4096, arena.id)
    with pytest.raises(FileNotFoundError, match="/fd/10000"):
        Borrowed(os.getpid(), 10_000, arena.nbytes, arena.id)
    mapped = Borrowed(arena.pid, arena.fd, arena.nbytes, arena.id)
    with pytest.raises(ValueError, match="outside the arena"):
        mapped.view(0, 16, torch.uint8)  # the header is not a region
    with pytest.raises(ValueError, match="outside the arena"):
        mapped.view(arena.nbytes - 8, 16, torch.uint8)
    arena.region(0, 4, torch.int32).copy_(torch.tensor([1, 2, 3, 4], dtype=torch.int32))
    assert mapped.view(4096, 4, torch.int32).tolist() == [1, 2, 3, 4]  # still usable
    with pytest.raises(ValueError, match="does not fit"):
        arena.region(1, 4, torch.int32)
    mapped.close()
    arena.close()


def test_a_slots_second_buffer_and_a_freed_region_come_back_for_the_next_slot() -> None:
    arena = Arena(2, REGION)
    slots = Slots(2, TensorBufferPool(4 * REGION), arena)
    first = slots.take(1, None, "a")
    region = first.buffer(16, torch.uint8)
    other = first.buffer(16, torch.uint8)
    assert arena.offset_of(region) is not None
    assert arena.offset_of(other) is None  # from the pool: a slot has one region
    second = slots.take(1, None, "b")
    regions = {arena.offset_of(region), arena.offset_of(second.buffer(16, torch.uint8))}
    assert len(regions) == 2
    done = threading.Event()

    def third() -> None:
        slot = slots.take(1, time.monotonic() + 10, "c")
        regions.add(arena.offset_of(slot.buffer(16, torch.uint8)))
        done.set()

    threading.Thread(target=third, daemon=True).start()
    assert not done.wait(0.2)  # both regions in use: it waits
    first()
    assert done.wait(10)
    assert len(regions) == 2  # the freed region was handed out again
