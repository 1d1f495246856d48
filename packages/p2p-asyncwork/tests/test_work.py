from __future__ import annotations

import threading
import time

import pytest

from p2p_asyncwork import (
    AsyncFuncWork,
    AsyncResultWork,
    AsyncWork,
    WorkTimeoutError,
)


def complete_later(work: AsyncResultWork[int], value: int, delay: float = 0.05) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(delay), work.set_result(value)))
    t.start()
    return t


def test_wait_returns_result_completed_from_another_thread() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    assert not work.done()
    t = complete_later(work, 7)
    assert work.wait(timeout=5) == 7
    assert work.done()
    assert work.exception() is None
    t.join()


def test_wait_timeout_raises_work_timeout_error_which_is_a_timeout_error() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    start = time.monotonic()
    with pytest.raises(WorkTimeoutError) as info:
        work.wait(timeout=0.1)
    assert isinstance(info.value, TimeoutError)
    assert "0.1 s" in str(info.value)
    assert 0.08 <= time.monotonic() - start < 2
    # the work is still usable afterwards
    work.set_result(3)
    assert work.wait(timeout=0) == 3


def test_many_waiters_all_wake_and_racing_completions_are_never_missed() -> None:
    # Waiters that arrive before, during and after completion (the event a blocked
    # waiter needs is made lazily) all see the one result.
    def wait_into(work: AsyncResultWork[int], seen: list[int]) -> None:
        seen.append(work.wait(timeout=5))

    for _ in range(200):
        work: AsyncResultWork[int] = AsyncResultWork()
        seen: list[int] = []
        waiters = [threading.Thread(target=wait_into, args=(work, seen)) for _ in range(4)]
        for t in waiters[:2]:
            t.start()
        setter = threading.Thread(target=work.set_result, args=(5,))
        setter.start()
        for t in waiters[2:]:
            t.start()
        for t in [*waiters, setter]:
            t.join(10)
        assert seen == [5, 5, 5, 5]
        assert work.exception(timeout=0) is None


def test_first_completion_wins() -> None:
    work: AsyncResultWork[str] = AsyncResultWork()
    work.set_result("first")
    work.set_exception(RuntimeError("late"))
    work.set_result("second")
    assert work.wait() == "first"


def test_done_never_blocks() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    start = time.monotonic()
    for _ in range(10_000):
        assert not work.done()
    assert time.monotonic() - start < 1.0


def test_then_passes_result_first_then_args_and_kwargs() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    seen: list[tuple[int, int, int]] = []

    def postprocess(buf: int, a: int, *, b: int) -> int:
        seen.append((buf, a, b))
        return buf + a + b

    w2 = work.then(postprocess, 10, b=100)
    assert isinstance(w2, AsyncFuncWork)
    assert not w2.done()
    work.set_result(1)
    assert w2.wait(timeout=5) == 111
    assert seen == [(1, 10, 100)]


def test_then_on_completed_work_runs_immediately() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    work.set_result(5)
    w2 = work.then(lambda v: v * 2)
    assert w2.done()
    assert w2.wait() == 10


def test_chain_walk_next_and_last() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    w2 = work.then(lambda v: v + 1)
    w3 = w2.then(lambda v: v + 1)
    assert work.get_next_work() is w2
    assert w2.get_next_work() is w3
    assert w3.get_next_work() is None
    assert work.get_last_work() is w3
    work.set_result(0)
    assert w3.wait(timeout=5) == 2


def test_callback_returning_work_defers_to_last_of_that_chain() -> None:
    first: AsyncResultWork[int] = AsyncResultWork()
    inner: AsyncResultWork[int] = AsyncResultWork()
    inner_tail = inner.then(lambda v: v * 100)
    outer = first.then(lambda _: inner)
    first.set_result(1)
    assert not outer.done()
    inner.set_result(3)
    assert outer.wait(timeout=5) == 300
    assert inner_tail.done()


def test_exception_in_work_propagates_through_chain_without_calling_callbacks() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    called = []
    w2 = work.then(lambda v: called.append(v))
    w3 = w2.then(lambda v: called.append(v))
    err = ValueError("boom in the work")
    work.set_exception(err)
    for w in (work, w2, w3):
        with pytest.raises(ValueError, match="boom in the work") as info:
            w.wait(timeout=5)
        assert info.value is err
        assert w.exception() is err
    assert called == []


def test_exception_in_callback_fails_that_work_and_the_rest() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()

    def bad(v: int) -> int:
        raise KeyError(f"callback failed on {v}")

    w2 = work.then(bad)
    w3 = w2.then(lambda v: v)
    work.set_result(9)
    assert work.wait() == 9
    for w in (w2, w3):
        with pytest.raises(KeyError, match="callback failed on 9"):
            w.wait(timeout=5)


def test_then_rejects_non_callable() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    with pytest.raises(TypeError, match="func must be callable"):
        work.then(42)  # type: ignore[arg-type]
    work.set_result(1)
    assert work.wait() == 1


def test_chains_completed_concurrently_from_many_threads() -> None:
    works: list[AsyncResultWork[int]] = [AsyncResultWork() for _ in range(200)]
    tails = [w.then(lambda v: v + 1).then(lambda v: v * 2) for w in works]
    threads = [threading.Thread(target=w.set_result, args=(i,)) for i, w in enumerate(works)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [t.wait(timeout=5) for t in tails] == [(i + 1) * 2 for i in range(200)]


def test_repr_states() -> None:
    w: AsyncResultWork[int] = AsyncResultWork()
    assert "pending" in repr(w)
    w.set_exception(RuntimeError("x"))
    assert "failed: RuntimeError" in repr(w)


def test_base_class_is_generic_handle() -> None:
    assert issubclass(AsyncResultWork, AsyncWork)


def test_add_done_callback_runs_in_order_and_at_once_when_already_done() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    seen: list[tuple[str, int]] = []
    work.add_done_callback(lambda w: seen.append(("first", w.wait())))
    work.add_done_callback(lambda w: seen.append(("second", w.wait())))
    assert seen == []
    work.set_result(5)
    assert seen == [("first", 5), ("second", 5)]
    work.add_done_callback(lambda w: seen.append(("late", w.wait())))
    assert seen[-1] == ("late", 5)


def test_a_failing_done_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    seen: list[int] = []

    def broken(_: object) -> None:
        raise RuntimeError("callback bug")

    work.add_done_callback(broken)
    work.add_done_callback(lambda w: seen.append(w.wait()))
    with caplog.at_level("ERROR", logger="p2p_asyncwork"):
        work.set_result(3)
    assert seen == [3]
    assert work.wait(timeout=1.0) == 3
    assert [str(r.exc_info[1]) for r in caplog.records if r.exc_info] == ["callback bug"]
    with caplog.at_level("ERROR", logger="p2p_asyncwork"):
        work.add_done_callback(broken)  # already done: runs now, still only logged
    assert [str(r.exc_info[1]) for r in caplog.records if r.exc_info] == ["callback bug"] * 2


def test_add_done_callback_sees_the_failure_of_a_failed_work() -> None:
    work: AsyncResultWork[int] = AsyncResultWork()
    errors: list[BaseException | None] = []
    work.add_done_callback(lambda w: errors.append(w.exception()))
    work.set_exception(ValueError("lost"))
    assert len(errors) == 1
    assert isinstance(errors[0], ValueError)
    assert str(errors[0]) == "lost"
