"""The actor protocol run in-process (no Ray cluster): stage set before __init__, probe."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from p2p_worker import Worker, WorkerAddress, WorkerInfo
from p2p_worker._process._actor import Failure, Setup, make_failure, make_shim_class
from p2p_worker._runtime._state import JobContext, current_runtime, set_current_runtime


class Recorder(Worker):
    def __init__(self, value: int) -> None:
        self.seen = (os.environ.get("RANK"), os.environ.get("MASTER_PORT"), self._rank)
        super().__init__()
        self.value = value

    def add(self, x: int) -> int:
        with self.worker_timer("add"):
            return self.value + x

    def fail(self) -> None:
        raise ValueError("nope")


@pytest.fixture(autouse=True)
def restore_environment() -> Iterator[None]:
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    set_current_runtime(None)


def make_setup(codec: str | None, *args: Any) -> Setup:
    job = JobContext("127.0.0.1", 1, None, codec, ())
    info = WorkerInfo(WorkerAddress("rec", 2), 2, 0, None, "127.0.0.1", world_size=3, local_rank=2)
    env = {"RANK": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "4242", "WORLD_SIZE": "3"}
    return Setup(job, info, env, None, args)


def fresh() -> Any:
    shim = make_shim_class(Recorder)
    assert issubclass(shim, Recorder)
    assert shim.__name__ == "Recorder"
    return shim.__new__(shim)


def test_setup_sets_the_stage_before_user_init() -> None:
    obj = fresh()
    ok, value, _ = obj._p2p_setup(make_setup(None, 5))
    assert ok
    assert value is None
    assert obj.seen == ("2", "4242", 2)
    assert (obj.value, obj._world_size, obj.worker_info.address.get_name()) == (5, 3, "rec:2")
    assert os.environ["GLOO_SOCKET_IFNAME"] in ("lo", "lo0")
    assert current_runtime() is obj._p2p_runtime
    ok, result, durations = obj._p2p_call("add", (3,), {})
    assert ok
    assert result == 8
    assert set(durations) == {"add"}
    ok, failure, _ = obj._p2p_call("fail", (), {})
    assert not ok
    assert isinstance(failure, Failure)
    assert failure.exc_type == "ValueError"
    assert "nope" in failure.traceback
    assert isinstance(failure.exc, ValueError)
    ok, result, _ = obj._p2p_call("add", ((1,), {}))  # arguments packed once for a group
    assert ok
    assert result == 6


def test_codec_probe_runs_before_user_init_and_fails_the_start() -> None:
    obj = fresh()
    ok, failure, _ = obj._p2p_setup(make_setup("lz4", 1))
    assert ok  # lz4 is installed and passes its self-test
    obj = fresh()
    ok, failure, _ = obj._p2p_setup(make_setup("brotli", 1))
    assert not ok
    assert isinstance(failure, Failure)
    assert "brotli" in failure.message
    assert "probe" in failure.traceback
    assert not hasattr(obj, "value")  # the user's __init__ never ran


def test_unpicklable_exceptions_keep_their_text() -> None:
    class Local(Exception):
        def __reduce__(self) -> Any:
            raise TypeError("cannot pickle")

    try:
        raise Local("local only")
    except Local as exc:
        failure = make_failure(exc)
    assert failure.exc is None
    assert failure.message == "local only"
    assert "Local" in failure.exc_type
    assert "local only" in failure.traceback
