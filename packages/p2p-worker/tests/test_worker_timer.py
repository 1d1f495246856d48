from __future__ import annotations

import time

import pytest

from p2p_worker import Worker, WorkerError
from p2p_worker._process._timer import collect_durations, reduce_durations


class Local(Worker):
    @Worker.timer("outer")
    def outer(self) -> int:
        time.sleep(0.01)
        self.inner()
        self.inner()
        return 7

    @Worker.timer("inner")
    def inner(self) -> None:
        with self.worker_timer("innermost"):
            time.sleep(0.005)


def test_nested_timers_sum_per_tag_within_a_call() -> None:
    w = Local()
    with collect_durations() as durations:
        assert w.outer() == 7
    assert set(durations) == {"outer", "inner", "innermost"}
    assert durations["outer"] >= durations["inner"] >= durations["innermost"] >= 0.01
    assert Local.outer.__name__ == "outer"  # wraps keeps the name


def test_timers_outside_a_call_stay_local() -> None:
    w = Local()
    w.inner()
    assert set(w.__dict__["_p2p_local_durations"]) == {"inner", "innermost"}


def test_reduce_durations() -> None:
    per_rank = [{"a": 1.0, "b": 4.0}, {"a": 3.0}, {"a": 2.0, "c": 0.5}]
    assert reduce_durations(per_rank) == {"a": 3.0, "b": 4.0, "c": 0.5}
    assert reduce_durations(per_rank, "min")["a"] == 1.0
    assert reduce_durations(per_rank, "sum")["a"] == 6.0
    assert reduce_durations(per_rank, "mean")["a"] == 2.0
    assert reduce_durations(per_rank, lambda xs: len(xs))["a"] == 3.0
    with pytest.raises(ValueError, match="reduction='median'"):
        reduce_durations(per_rank, "median")
    with pytest.raises(TypeError, match="reduction must be"):
        reduce_durations(per_rank, 3)  # type: ignore[arg-type]


def test_bad_tags() -> None:
    with pytest.raises(TypeError, match="tag"):
        Worker.timer("")
    with pytest.raises(TypeError, match="tag"), Local().worker_timer(3):  # type: ignore[arg-type]
        pass


def test_standalone_worker_has_no_info() -> None:
    w = Local()
    assert (w._rank, w._world_size) == (0, 1)
    with pytest.raises(WorkerError, match="not launched"):
        _ = w.worker_info
    with pytest.raises(WorkerError, match="not launched"):
        w.send("x", "g", 0)
    with pytest.raises(WorkerError, match="not launched"):
        Local.create_group().outer()
