"""wait_any: the first completion among several works wakes the caller at once."""

from __future__ import annotations

import threading
import time

import pytest

from p2p_asyncwork import AsyncResultWork, wait_any
from p2p_asyncwork.internal import CONFIGURED, check_timeout


def test_a_completion_on_another_thread_wakes_the_waiter_without_polling() -> None:
    works = [AsyncResultWork[int]() for _ in range(4)]
    timer = threading.Timer(0.05, works[2].set_result, args=(7,))
    started = time.monotonic()
    timer.start()
    assert wait_any(works, timeout=5.0) is True
    waited = time.monotonic() - started
    assert 0.04 < waited < 1.0
    assert [w.done() for w in works] == [False, False, True, False]
    assert works[2].wait() == 7


def test_a_failure_wakes_it_too_and_the_exception_stays_with_the_work() -> None:
    a, b = AsyncResultWork[int](), AsyncResultWork[int]()
    threading.Timer(0.02, b.set_exception, args=(ValueError("bad bucket"),)).start()
    assert wait_any([a, b], timeout=5.0) is True
    assert isinstance(b.exception(), ValueError)
    assert not a.done()


def test_timeout_empty_and_already_done() -> None:
    a = AsyncResultWork[int]()
    started = time.monotonic()
    assert wait_any([a], timeout=0.05) is False
    assert time.monotonic() - started >= 0.045
    assert wait_any([], timeout=0) is True
    a.set_result(1)
    assert wait_any([AsyncResultWork[int](), a], timeout=0) is True


def test_repeated_waits_over_the_same_works_each_see_the_next_completion() -> None:
    works = [AsyncResultWork[int]() for _ in range(3)]
    seen = []
    for i in range(3):
        threading.Timer(0.01, works[i].set_result, args=(i,)).start()
        assert wait_any([w for w in works if not w.done()], timeout=5.0)
        seen.append([w.done() for w in works].count(True))
    assert seen == [1, 2, 3]


@pytest.mark.parametrize("bad", [True, False, float("nan"), -1, -0.5, "3", [1]])
def test_check_timeout_refuses_bools_nan_negatives_and_non_numbers(bad: object) -> None:
    with pytest.raises(ValueError, match=r"^get\(timeout=\): got .*; allowed: seconds >= 0"):
        check_timeout(bad, "get(timeout=)")


def test_check_timeout_returns_floats_and_names_the_meaning_of_none() -> None:
    assert check_timeout(0) == 0.0
    assert check_timeout(3) == 3.0
    assert check_timeout(float("inf")) == float("inf")
    assert check_timeout(None) is None
    with pytest.raises(ValueError, match=r"or None \(the configured op_timeout\)$"):
        check_timeout(-1, none=CONFIGURED)
