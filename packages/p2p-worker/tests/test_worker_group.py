"""WorkerGroup on a real embedded Ray cluster: environment, calls, timers, errors."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from p2p_asyncwork import WorkTimeoutError
from p2p_worker import (
    Cluster,
    GroupCallHandle,
    PackedPlacementStrategy,
    Worker,
    WorkerAddress,
    WorkerError,
    WorkerGroup,
    WorkerInfo,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
GROUP = "my_worker_group"


class MyWorker(Worker):
    def __init__(self, tag: str = "default") -> None:
        # Recorded before super().__init__(): the stage must already be set.
        self.env_before_init = {k: os.environ.get(k) for k in ENV_KEYS}
        self.rank_before_init = self._rank
        self.world_before_init = self._world_size
        super().__init__()
        self.tag = tag

    def hello(self) -> int:
        return self._rank

    def init_view(self) -> tuple[dict[str, str | None], int, int, WorkerInfo, str]:
        return (
            self.env_before_init,
            self.rank_before_init,
            self.world_before_init,
            self.worker_info,
            self.tag,
        )

    def initialize(self) -> torch.Tensor:
        # Seed 004's first example, on CPU: gloo instead of NCCL.
        if not torch.distributed.is_initialized():
            torch.distributed.init_process_group(backend="gloo")
        test_tensor = torch.ones(size=(1, 1), dtype=torch.float32)
        torch.distributed.all_reduce(test_tensor)
        return test_tensor

    @Worker.timer("step")
    def step(self, base: float) -> int:
        time.sleep(base * (self._rank + 1))
        self.sub()
        return self._rank

    @Worker.timer("sub")
    def sub(self) -> None:
        with self.worker_timer("leaf"):
            time.sleep(0.01)

    def fail_on(self, rank: int) -> str:
        if self._rank == rank:
            raise KeyError(f"no key on rank {rank}")
        return "ok"

    def exit_on(self, rank: int) -> str:
        if self._rank == rank:
            sys.exit(2)
        return "ok"

    def echo(self, *args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
        return (self._rank, args, kwargs)

    def tensor_sum(self, t: torch.Tensor, scale: int = 1) -> float:
        return float(t.sum()) * scale

    def sleep_then(self, seconds: float) -> int:
        time.sleep(seconds)
        return self._rank

    def shutdown(self) -> str:  # same name as the group's own shutdown()
        return "worker-side shutdown"


@pytest.fixture(scope="module")
def group(ray_session: object) -> Iterator[WorkerGroup[MyWorker]]:
    with Cluster(num_nodes=1) as cluster:
        g = MyWorker.create_group(tag="t1").launch(
            cluster, PackedPlacementStrategy(4, cpus_per_worker=0), name=GROUP
        )
        yield g


def test_environment_and_info_are_set_before_init(group: WorkerGroup[MyWorker]) -> None:
    views = group.init_view().wait(timeout=60)
    ports = {v[0]["MASTER_PORT"] for v in views}
    assert len(ports) == 1
    assert int(ports.pop() or 0) > 0
    for rank, (env, rank_before, world_before, info, tag) in enumerate(views):
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "4")
        assert (rank_before, world_before, tag) == (rank, 4, "t1")
        assert info.address == WorkerAddress(GROUP, rank)
        assert info.address.get_name() == f"{GROUP}:{rank}"
        assert (info.rank, info.node_id, info.node_ip, info.world_size) == (
            rank,
            0,
            "127.0.0.1",
            4,
        )
        assert info.gpu_id is None
        assert info.available_gpus == []
        assert info.local_rank == rank
    assert [i.rank for i in group.worker_infos] == [0, 1, 2, 3]
    assert len({i.pid for i in group.worker_infos}) == 4


def test_seed_example_process_group_and_execute_on(group: WorkerGroup[MyWorker]) -> None:
    assert group.initialize().wait(timeout=120)[0].tolist() == [[4.0]]
    # This executes the hello method only on ranks 0 and 3.
    assert group.execute_on(0, 3).hello().wait(timeout=60) == [0, 3]


def test_execute_on_order_and_one_shot(group: WorkerGroup[MyWorker]) -> None:
    handle = group.execute_on(3, 1).hello()
    assert handle.ranks == (3, 1)
    assert handle.wait(timeout=60) == [3, 1]
    assert group.hello().wait(timeout=60) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="out of range"):
        group.execute_on(4)
    with pytest.raises(ValueError, match="distinct"):
        group.execute_on(1, 1)
    with pytest.raises(ValueError, match="at least one rank"):
        group.execute_on()
    with pytest.raises(TypeError, match="ints"):
        group.execute_on("0")  # type: ignore[arg-type]


def test_timers_nested_tags_max_reduction_consumed_once(group: WorkerGroup[MyWorker]) -> None:
    handle = group.step(0.02)
    assert handle.wait(timeout=60) == [0, 1, 2, 3]
    durations = handle.consume_durations()
    assert set(durations) == {"step", "sub", "leaf"}
    # Rank 3 sleeps 4 x 0.02 s plus the nested 0.01 s: the max covers it.
    assert durations["step"] >= 0.09
    assert durations["step"] >= durations["sub"] >= durations["leaf"] >= 0.01
    assert handle.consume_durations() == {}

    low = group.step(0.02).consume_durations("min", timeout=60)
    assert set(low) == {"step", "sub", "leaf"}
    assert low["step"] >= 0.03

    only_0 = group.execute_on(0).step(0.02)
    assert only_0.wait(timeout=60) == [0]
    d0 = only_0.consume_durations()
    assert set(d0) == {"step", "sub", "leaf"}
    assert d0["step"] >= 0.03
    d3 = group.execute_on(3).step(0.02).consume_durations(timeout=60)
    assert d3["step"] >= 0.09
    assert group.hello().consume_durations(timeout=60) == {}


def test_error_reaches_caller_and_workers_survive(group: WorkerGroup[MyWorker]) -> None:
    with pytest.raises(WorkerError) as info:
        group.fail_on(2).wait(timeout=60)
    err = info.value
    assert (err.group_name, err.rank, err.method) == (GROUP, 2, "fail_on")
    assert "KeyError" in str(err)
    assert f"{GROUP}:2" in str(err)
    assert err.remote_traceback is not None
    assert "fail_on" in err.remote_traceback
    assert isinstance(err.__cause__, KeyError)
    assert group.hello().wait(timeout=60) == [0, 1, 2, 3]

    with pytest.raises(WorkerError, match="SystemExit") as info:
        group.exit_on(1).wait(timeout=60)
    assert info.value.rank == 1
    assert group.hello().wait(timeout=60) == [0, 1, 2, 3]


def test_methods_bound_on_the_group(group: WorkerGroup[MyWorker]) -> None:
    assert "hello" in dir(group)
    assert group.hello.__doc__ == MyWorker.hello.__doc__
    assert group.echo(1, k="v").wait(timeout=60) == [(r, (1,), {"k": "v"}) for r in range(4)]
    assert group.call("shutdown").wait(timeout=60) == ["worker-side shutdown"] * 4
    assert len(group) == group.world_size == 4
    with pytest.raises(AttributeError, match="not a public method"):
        group.no_such_method()  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="not a public method"):
        group.call("_p2p_setup")
    handle = group.hello()
    assert isinstance(handle, GroupCallHandle)
    assert "hello" in repr(handle)
    handle.wait(timeout=60)


def test_large_arguments_reach_every_worker(group: WorkerGroup[MyWorker]) -> None:
    big = torch.ones(1 << 19)  # 2 MiB: put in the object store once for all workers
    assert group.tensor_sum(big, scale=2).wait(timeout=60) == [2.0 * (1 << 19)] * 4
    assert group.execute_on(1).tensor_sum(big).wait(timeout=60) == [float(1 << 19)]


def test_handle_is_an_async_work(group: WorkerGroup[MyWorker]) -> None:
    handle = group.sleep_then(0.3)
    assert not handle.done()

    async def main() -> list[int]:
        return await handle.async_wait()

    assert asyncio.run(main()) == [0, 1, 2, 3]
    assert handle.done()
    assert group.hello().then(sum).wait(timeout=60) == 6

    async def awaited() -> list[int]:
        return await group.execute_on(2).hello()

    assert asyncio.run(awaited()) == [2]


def test_wait_timeout_leaves_the_call_running(group: WorkerGroup[MyWorker]) -> None:
    handle = group.execute_on(0).sleep_then(1.0)
    with pytest.raises(WorkTimeoutError):
        handle.wait(timeout=0.05)
    assert handle.wait(timeout=60) == [0]
