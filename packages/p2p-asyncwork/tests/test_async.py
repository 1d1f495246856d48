from __future__ import annotations

import asyncio
import threading
import time

import pytest

from p2p_asyncwork import AsyncResultWork


def test_await_and_async_wait_return_result() -> None:
    async def main() -> tuple[int, int]:
        w1: AsyncResultWork[int] = AsyncResultWork()
        w2: AsyncResultWork[int] = AsyncResultWork()
        threading.Timer(0.05, w1.set_result, args=(1,)).start()
        threading.Timer(0.05, w2.set_result, args=(2,)).start()
        return await w1, await w2.async_wait()

    assert asyncio.run(main()) == (1, 2)


def test_async_wait_reraises_stored_exception() -> None:
    async def main() -> None:
        w: AsyncResultWork[int] = AsyncResultWork()
        chained = w.then(lambda v: v)
        threading.Timer(0.02, w.set_exception, args=(OSError("peer went away"),)).start()
        await chained

    with pytest.raises(OSError, match="peer went away"):
        asyncio.run(main())


def test_async_wait_on_completed_work_does_not_suspend() -> None:
    async def main() -> str:
        w: AsyncResultWork[str] = AsyncResultWork()
        w.set_result("ready")
        return await w

    assert asyncio.run(main()) == "ready"


def test_ten_thousand_concurrent_awaits_use_bounded_threads() -> None:
    n = 10_000
    works: list[AsyncResultWork[int]] = [AsyncResultWork() for _ in range(n)]
    peak_threads = 0

    async def main() -> list[int]:
        nonlocal peak_threads
        tasks = [asyncio.ensure_future(w.async_wait()) for w in works]
        await asyncio.sleep(0.05)  # every waiter is now suspended on a pending work
        peak_threads = threading.active_count()

        def producer() -> None:
            for i, w in enumerate(works):
                w.set_result(i)

        t = threading.Thread(target=producer)
        t.start()
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=60)
        t.join()
        return list(results)

    before = threading.active_count()
    start = time.monotonic()
    results = asyncio.run(main())
    assert results == list(range(n))
    # no thread per waiter: at most a handful more than before (the producer, loop helpers)
    assert peak_threads <= before + 2
    assert time.monotonic() - start < 60


def test_completion_after_loop_closed_is_harmless() -> None:
    w: AsyncResultWork[int] = AsyncResultWork()

    async def start_waiting() -> None:
        task = asyncio.ensure_future(w.async_wait())
        await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(start_waiting())
    w.set_result(1)  # the loop is closed: must not raise
    assert w.wait() == 1
