"""TensorBufferPool rules, with exact byte accounting."""

from __future__ import annotations

import threading

import pytest
import torch

from p2p_compress import TensorBufferPool, TensorBufferPoolConfig
from p2p_compress.internal import BufferLease


def stats(pool: TensorBufferPool) -> dict[str, int]:
    return {k: v for k, v in pool.stats().items() if k != "max_bytes"}


def acquire(pool: TensorBufferPool, n: int) -> BufferLease:
    lease = pool.acquire(n)
    assert lease is not None
    return lease


def cached(pool: TensorBufferPool, *sizes: int) -> None:
    """Put idle buffers of these capacities into the pool's cache."""
    leases = [acquire(pool, n) for n in sizes]
    for lease in leases:
        assert lease.release()


def test_new_pool_is_empty() -> None:
    pool = TensorBufferPool(1000)
    assert pool.stats() == {
        "max_bytes": 1000,
        "active_bytes": 0,
        "active_buffers": 0,
        "cached_bytes": 0,
        "cached_buffers": 0,
        "hits": 0,
        "misses": 0,
        "evictions": 0,
        "evicted_bytes": 0,
        "rejections": 0,
        "discards": 0,
    }


def test_exact_allocation_and_release_to_cache() -> None:
    pool = TensorBufferPool(1000)
    lease = acquire(pool, 300)
    buf = lease.buffer
    assert buf.dtype == torch.uint8
    assert buf.device.type == "cpu"
    assert buf.is_contiguous()
    assert (buf.numel(), lease.capacity, lease.nbytes) == (300, 300, 300)
    assert stats(pool)["active_bytes"] == 300
    assert stats(pool)["misses"] == 1
    assert lease.release() is True
    s = stats(pool)
    assert (s["active_bytes"], s["cached_bytes"], s["cached_buffers"]) == (0, 300, 1)


def test_reuse_when_capacity_at_most_twice_the_request() -> None:
    pool = TensorBufferPool(10_000)
    cached(pool, 200)
    lease = acquire(pool, 100)  # 200 <= 2 * 100
    assert lease.capacity == 200
    assert lease.nbytes == 100
    assert lease.buffer.numel() == 200
    s = stats(pool)
    assert (s["hits"], s["misses"], s["active_bytes"], s["cached_bytes"]) == (1, 1, 200, 0)


def test_no_reuse_above_twice_when_budget_allows_exact() -> None:
    pool = TensorBufferPool(10_000)
    cached(pool, 201)
    lease = acquire(pool, 100)  # 201 > 200: allocate exactly
    assert lease.capacity == 100
    s = stats(pool)
    assert (s["hits"], s["misses"], s["active_bytes"], s["cached_bytes"]) == (0, 2, 100, 201)


def test_reuse_oversized_when_exact_allocation_exceeds_budget() -> None:
    pool = TensorBufferPool(1000)
    cached(pool, 900)
    lease = acquire(pool, 200)  # 900 + 200 > 1000: take the 900 buffer
    assert lease.capacity == 900
    s = stats(pool)
    assert (s["hits"], s["evictions"], s["active_bytes"], s["cached_bytes"]) == (1, 0, 900, 0)


def test_smallest_fitting_cached_size_is_taken() -> None:
    pool = TensorBufferPool(10_000)
    cached(pool, 150, 120, 110, 90)
    lease = acquire(pool, 100)
    assert lease.capacity == 110
    assert stats(pool)["cached_bytes"] == 150 + 120 + 90


def test_same_size_buffers_share_a_list() -> None:
    pool = TensorBufferPool(10_000)
    a, b = acquire(pool, 64), acquire(pool, 64)
    a_ptr, b_ptr = a.buffer.data_ptr(), b.buffer.data_ptr()
    a.release()
    b.release()
    assert stats(pool)["cached_buffers"] == 2
    assert stats(pool)["cached_bytes"] == 128
    # LIFO within a size: the buffer released last comes back first.
    assert acquire(pool, 64).buffer.data_ptr() == b_ptr
    assert acquire(pool, 64).buffer.data_ptr() == a_ptr
    assert stats(pool)["hits"] == 2


def test_eviction_starts_from_the_largest_idle_bucket() -> None:
    pool = TensorBufferPool(1000)
    cached(pool, 400, 300, 200)  # all idle: 900 cached
    lease = acquire(pool, 450)  # no cached fits; needs 350 more room: evict 400 only
    assert lease.capacity == 450
    s = stats(pool)
    assert (s["evictions"], s["evicted_bytes"]) == (1, 400)
    assert (s["active_bytes"], s["cached_bytes"], s["cached_buffers"]) == (450, 500, 2)
    lease2 = acquire(pool, 350)  # nothing fits (300, 200 < 350); 450+500+350 > 1000
    assert lease2.capacity == 350
    s = stats(pool)
    # evicts 300 (largest) -> 450+200+350 = 1000 fits exactly
    assert (s["evictions"], s["evicted_bytes"]) == (2, 700)
    assert (s["active_bytes"], s["cached_bytes"], s["cached_buffers"]) == (800, 200, 1)


def test_evicts_several_buckets_when_needed() -> None:
    pool = TensorBufferPool(1000)
    cached(pool, 100, 100, 300, 250)  # 750 idle
    acquire(pool, 600)  # needs 350 free of 250: evict 300 then 250 (largest first)
    s = stats(pool)
    assert (s["evictions"], s["evicted_bytes"]) == (2, 550)
    assert (s["active_bytes"], s["cached_bytes"], s["cached_buffers"]) == (600, 200, 2)


def test_over_budget_returns_none_without_waiting_or_evicting() -> None:
    pool = TensorBufferPool(1000)
    held = acquire(pool, 700)
    cached(pool, 200)
    assert pool.acquire(400) is None  # 700 active + 400 > 1000 even with nothing cached
    s = stats(pool)
    assert (s["rejections"], s["evictions"], s["cached_bytes"]) == (1, 0, 200)
    assert pool.acquire(1001) is None
    assert stats(pool)["rejections"] == 2
    held.release()
    assert pool.acquire(1000) is not None  # evicts both idle buffers
    s = stats(pool)
    assert (s["active_bytes"], s["cached_bytes"], s["evictions"]) == (1000, 0, 2)


def test_discard_frees_instead_of_caching() -> None:
    pool = TensorBufferPool(1000)
    lease = acquire(pool, 500)
    assert lease.discard() is True
    s = stats(pool)
    assert (s["active_bytes"], s["cached_bytes"], s["discards"]) == (0, 0, 1)


def test_lease_returns_exactly_once() -> None:
    pool = TensorBufferPool(1000)
    lease = acquire(pool, 100)
    assert stats(pool)["active_buffers"] == 1
    assert lease.release() is True
    assert not lease.active
    assert lease.release() is False
    assert lease.discard() is False
    assert stats(pool)["cached_bytes"] == 100
    assert stats(pool)["discards"] == 0
    with pytest.raises(ValueError, match="already released"):
        _ = lease.buffer
    other = acquire(pool, 100)
    assert other.discard() is True
    assert other.release() is False
    assert stats(pool)["cached_bytes"] == 0


def test_lease_context_manager_releases() -> None:
    pool = TensorBufferPool(1000)
    with acquire(pool, 10) as lease:
        lease.buffer.fill_(1)
    assert not lease.active
    assert stats(pool)["cached_bytes"] == 10


def test_zero_byte_request() -> None:
    pool = TensorBufferPool(10)
    lease = acquire(pool, 0)
    assert lease.buffer.numel() == 0
    lease.release()
    cached(pool, 5)
    assert acquire(pool, 0).capacity == 0  # reuses the 0-byte buffer, not the 5


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="max_bytes must be an integer >= 1, got 0"):
        TensorBufferPool(0)
    pool = TensorBufferPool(10)
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="nbytes must be an integer >= 0"):
            pool.acquire(bad)  # type: ignore[arg-type]


def test_from_config_and_clear() -> None:
    pool = TensorBufferPool.from_config(TensorBufferPoolConfig(max_bytes=4096))
    assert pool.max_bytes == 4096
    assert TensorBufferPool.from_config(None).max_bytes == 2 * 1024**3
    cached(pool, 100, 200)
    held = acquire(pool, 1000)
    assert pool.clear() == 300
    s = stats(pool)
    assert (s["cached_bytes"], s["cached_buffers"], s["active_bytes"]) == (0, 0, 1000)
    held.release()


def test_threads_never_exceed_budget_and_accounting_balances() -> None:
    pool = TensorBufferPool(64 * 1024)
    errors: list[BaseException] = []
    sizes = [512, 1000, 4096, 3000, 8192, 100, 20_000]

    def worker(seed: int) -> None:
        try:
            held: list[BufferLease] = []
            for i in range(400):
                lease = pool.acquire(sizes[(seed + i) % len(sizes)])
                s = pool.stats()
                assert s["active_bytes"] + s["cached_bytes"] <= s["max_bytes"]
                if lease is not None:
                    lease.buffer[: lease.nbytes].fill_(seed)
                    held.append(lease)
                if len(held) > 3 or (lease is None and held):
                    old = held.pop(0)
                    assert bool((old.buffer[: old.nbytes] == seed).all())
                    (old.release if i % 3 else old.discard)()
            for lease in held:
                lease.release()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    s = pool.stats()
    assert s["active_bytes"] == 0
    assert s["active_buffers"] == 0
    assert s["cached_bytes"] <= pool.max_bytes
    assert s["hits"] + s["misses"] + s["rejections"] == 8 * 400
