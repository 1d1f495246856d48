"""Work handles from p2p-asyncwork: wait, chain, await, and errors.

Runs on its own: ``python docs/examples/async_handles.py``.
"""

from __future__ import annotations

import asyncio
import threading

from p2p_asyncwork import AsyncResultWork, AsyncWork, WorkTimeoutError


def produce_later(work: AsyncResultWork[list[int]], value: list[int]) -> None:
    """Complete ``work`` from another thread, the way a send/recv queue thread does."""
    threading.Timer(0.05, work.set_result, args=(value,)).start()


def blocking_wait() -> None:
    work: AsyncResultWork[list[int]] = AsyncResultWork()
    assert not work.done()  # done() never blocks
    produce_later(work, [1, 2, 3])
    assert work.wait(timeout=5.0) == [1, 2, 3]


def postprocess(buf: list[int], scale: int) -> int:
    # For example: move to CPU, convert a dtype, or notify another subsystem.
    return sum(buf) * scale


def chaining() -> None:
    work: AsyncResultWork[list[int]] = AsyncResultWork()
    w2 = work.then(postprocess, 10)  # an AsyncFuncWork: runs when `work` completes
    w3 = w2.then(str)
    assert work.get_next_work() is w2
    assert work.get_last_work() is w3
    work.set_result([1, 2, 3])
    assert w3.wait(timeout=5.0) == "60"


def returning_a_work() -> None:
    # A callback that returns another AsyncWork defers completion to that work.
    outer: AsyncResultWork[None] = AsyncResultWork()
    inner: AsyncResultWork[str] = AsyncResultWork()
    chained = outer.then(lambda _: inner)
    outer.set_result(None)
    assert not chained.done()
    inner.set_result("from the inner work")
    assert chained.wait(timeout=5.0) == "from the inner work"


async def awaiting() -> None:
    works: list[AsyncResultWork[list[int]]] = [AsyncResultWork() for _ in range(3)]
    for i, work in enumerate(works):
        produce_later(work, [i])
    first = await works[0].async_wait()  # suspends the coroutine, parks no thread
    rest = await asyncio.gather(works[1], works[2])  # a work is awaitable itself
    assert [first, *rest] == [[0], [1], [2]]


def errors() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    chained: AsyncWork[int] = work.then(lambda v: v + 1)
    work.set_exception(RuntimeError("the transfer failed"))
    # wait() re-raises the stored error, on this work and on every work chained after it;
    # exception() waits the same way and returns it instead.
    for handle in (work, chained):
        err = handle.exception(timeout=5.0)
        assert isinstance(err, RuntimeError)
        assert str(err) == "the transfer failed"

    pending: AsyncResultWork[int] = AsyncResultWork()
    try:
        pending.wait(timeout=0.01)
    except WorkTimeoutError as exc:  # also a TimeoutError; the work keeps running
        print(f"timed out as expected: {exc}")


def main() -> None:
    blocking_wait()
    chaining()
    returning_a_work()
    asyncio.run(awaiting())
    errors()
    print("async_handles: ok")


if __name__ == "__main__":
    main()
