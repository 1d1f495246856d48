"""Scenarios run by the spawned members of test_multi_channel.py (one function per scenario)."""

from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import traceback
from typing import Any

import torch
import torch.distributed as dist

from p2p_collective import Collective, CollectiveGroup, FramingError, MultiChannelProcessGroup

CPU = CollectiveGroup.CPU


class ListHandler(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _pair(rank: int, port: int, name: str, channels: int) -> MultiChannelProcessGroup:
    pg = MultiChannelProcessGroup(cur_rank=rank, num_channels=channels)
    pg.init(f"tcp://127.0.0.1:{port}", world_size=2, rank=rank, group_name=name, timeout=60)
    return pg


def channels_independent(rank: int, port: int) -> Any:
    """Rank 0 sends on channel 0, then 1; rank 1 receives channel 1 first."""
    with _pair(rank, port, "indep", 2) as pg:
        big = torch.arange(1 << 20, dtype=torch.int32)  # 4 MiB: its own payload message
        if rank == 0:
            work = pg.send(big, CPU, 0, async_op=True, timeout=60)
            pg.send(torch.full((3,), 7.0), CPU, 1, timeout=60)
            work.wait(timeout=60)
            back = torch.empty(2, dtype=torch.int64)
            pg.recv(back, CPU, 1, timeout=60)
            return back.tolist()
        small = torch.empty(3)
        pg.recv(small, CPU, 1, timeout=60)
        got = torch.empty_like(big)
        work = pg.recv(got, CPU, 0, async_op=True, timeout=60)
        assert work.wait(timeout=60) is got
        pg.send(torch.tensor([5, 6]), CPU, 1, timeout=60)
        return small.tolist(), bool(torch.equal(got, big))


def both_directions(rank: int, port: int) -> Any:
    """Each side sends and receives at once on one channel, many times, in order."""
    with _pair(rank, port, "both", 1) as pg:
        sends, recvs = [], []
        for i in range(20):
            sends.append(pg.send(torch.full((1000,), float(rank * 100 + i)), CPU, 0, True))
            buf = torch.empty(1000)
            recvs.append((buf, pg.recv(buf, CPU, 0, True)))
        for w in sends:
            w.wait(timeout=60)
        out = []
        for buf, w in recvs:
            w.wait(timeout=60)
            out.append(float(buf[0]))
        return out


def size_mismatch(rank: int, port: int) -> Any:
    """A receive of 4 elements for a send of 8 is a FramingError, logged once."""
    logger = logging.getLogger(f"mc-test-{rank}")
    handler = ListHandler()
    logger.addHandler(handler)
    pg = MultiChannelProcessGroup(cur_rank=rank, num_channels=1, logger=logger)
    pg.init(f"tcp://127.0.0.1:{port}", world_size=2, rank=rank, group_name="mismatch")
    try:
        if rank == 0:
            pg.send(torch.ones(8), CPU, 0, timeout=30)
            return handler.messages
        try:
            pg.recv(torch.empty(4), CPU, 0, timeout=30)
        except FramingError as exc:
            return type(exc).__name__, handler.messages
        return "no error", handler.messages
    finally:
        pg.close()


def broadcast_three(rank: int, port: int) -> Any:
    """Three members on a Collective each: send/recv refused, broadcasts from src 1 and 2."""
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
    )
    coll = Collective(f"member{rank}", store, timeout=60)
    pg = MultiChannelProcessGroup(cur_rank=rank, num_channels=2)
    pg.init(world_size=3, group_name="three", collective=coll)
    try:
        try:
            pg.send(torch.ones(1), CPU, 0)
            refused = "no error"
        except ValueError as exc:
            refused = str(exc)
        a = torch.full((4,), float(rank))
        pg.broadcast(a, CPU, 0, src=1, timeout=60)
        # src holds 0..3; the others receive into a non-contiguous view
        b = torch.arange(4.0).reshape(2, 2) if rank == 2 else torch.zeros(2, 2).t()
        work = pg.broadcast(b, CPU, 1, src=2, async_op=True, timeout=60)
        assert work.wait(timeout=60) is b
        return refused, a.tolist(), b.tolist()
    finally:
        pg.close()
        coll.close()


def serve(scenario: str, rank: int, port: int, results: Any) -> None:
    torch.set_num_threads(1)
    try:
        results.put((rank, "ok", globals()[scenario](rank, port)))
    except BaseException as exc:
        results.put((rank, "err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def run(scenario: str, members: int, port: int, timeout: float = 120.0) -> list[Any]:
    """Run ``scenario`` in ``members`` spawned processes; return their results by rank."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [
        ctx.Process(target=serve, args=(scenario, r, port, results), daemon=True)
        for r in range(members)
    ]
    for p in procs:
        p.start()
    try:
        got = [results.get(timeout=timeout) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=15)
            if p.is_alive():
                p.kill()
    out: list[Any] = [None] * members
    for rank, status, value in got:
        if status != "ok":
            raise AssertionError(f"member {rank} failed:\n{value}")
        out[rank] = value
    return out
