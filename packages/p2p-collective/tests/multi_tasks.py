"""Tasks run by the four spawned members of the N-member group tests (test_multi_*.py)."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import time
import traceback
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from conftest import make_store

from p2p_collective import Collective, MultiCollectiveGroup, create_multi_group

N = 4
NAMES = [f"m{r}" for r in range(N)]


class Ctx:
    def __init__(self, rank: int, port: int) -> None:
        self.rank = rank
        self.store = dist.TCPStore(
            "127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60)
        )
        self.coll = Collective(NAMES[rank], self.store, timeout=30.0)

    def group(self, gname: str) -> MultiCollectiveGroup:
        return create_multi_group(self.coll, NAMES, group_name=gname)


def serve(rank: int, port: int, commands: Any, results: Any) -> None:
    torch.set_num_threads(1)
    ctx = Ctx(rank, port)
    while True:
        item = commands.get()
        if item is None:
            ctx.coll.close()
            return
        task, args = item
        try:
            results.put(("ok", task(ctx, *args)))
        except BaseException as exc:
            results.put(("err", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


class Quad:
    """Four spawned members that run tasks on command."""

    def __init__(self) -> None:
        self.store = make_store()
        c = mp.get_context("spawn")
        self.cmd = [c.Queue() for _ in range(N)]
        self.res = [c.Queue() for _ in range(N)]
        self.procs = [
            c.Process(
                target=serve, args=(r, self.store.port, self.cmd[r], self.res[r]), daemon=True
            )
            for r in range(N)
        ]
        for p in self.procs:
            p.start()

    def run(self, task: Callable[..., Any], *args: Any, timeout: float = 120.0) -> list[Any]:
        for q in self.cmd:
            q.put((task, args))
        out = []
        for r in range(N):
            status, value = self.res[r].get(timeout=timeout)
            if status != "ok":
                raise AssertionError(f"member {r} failed: {value}")
            out.append(value)
        return out

    def close(self) -> None:
        for q in self.cmd:
            q.put(None)
        for p in self.procs:
            p.join(10)
            if p.is_alive():
                p.kill()


# -- tasks -------------------------------------------------------------------------------


def inputs(rank: int, dtype: torch.dtype) -> torch.Tensor:
    return (torch.arange(6, dtype=torch.float64) + 1 + rank * 10).to(dtype)


def t_all_ops(ctx: Ctx, gname: str, kind: str, async_op: bool) -> dict[str, Any]:
    g = ctx.group(gname)
    r = ctx.rank

    def mk(dtype: torch.dtype = torch.float64) -> Any:
        t = inputs(r, dtype)
        return t.numpy() if kind == "numpy" else t

    def done(x: Any) -> Any:
        return x.wait(timeout=60) if async_op else x

    def plain(x: Any) -> list[float]:
        return np.asarray(x).tolist()

    out: dict[str, Any] = {}
    for op in ("sum", "product", "min", "max"):
        x = mk()
        res = done(g.allreduce(x, op=op, async_op=async_op))
        assert res is x
        out[f"allreduce_{op}"] = plain(x)
    x = mk(torch.int64)
    done(g.allreduce(x, op="sum", async_op=async_op))
    out["allreduce_int64"] = plain(x)
    x = mk()
    done(g.reduce(x, dst=2, op="sum", async_op=async_op))
    out["reduce"] = plain(x)
    out["allgather"] = [plain(v) for v in done(g.allgather(mk(), async_op=async_op))]
    into = [mk() * 0 for _ in range(N)]
    res = done(g.allgather(mk(), into, async_op=async_op))
    assert res is into
    out["allgather_into"] = [plain(v) for v in into]
    outp = mk() * 0
    ins = [mk() * (i + 1) for i in range(N)]
    done(g.reduce_scatter(outp, ins, op="sum", async_op=async_op))
    out["reduce_scatter"] = plain(outp)
    x = mk()
    done(g.broadcast_tensor(x, src=1, async_op=async_op))
    out["broadcast_tensor"] = plain(x)
    done(g.barrier(async_op=async_op))
    return out


def payloads() -> list[Any]:
    big = torch.arange(300_000, dtype=torch.float32)
    return [
        {"w": torch.ones(3, 2), "b": torch.arange(4)},
        OrderedDict([("z", torch.zeros(2)), ("a", torch.full((2,), 7.0))]),
        [torch.tensor(1.5), big],
        (torch.arange(3, dtype=torch.int8),),
        big,
        {"step": 3, "name": "x" * 5000, "t": torch.ones(2)},
        None,
    ]


def t_broadcast_objects(ctx: Ctx, gname: str, src: int) -> list[Any]:
    g = ctx.group(gname)
    got = []
    for p in payloads():
        got.append(g.broadcast(p if ctx.rank == src else None, src=src, timeout=60))
    w = g.broadcast({"k": torch.ones(4)} if ctx.rank == src else None, src=src, async_op=True)
    got.append(w.wait(timeout=60))
    return got


def t_interleaved(ctx: Ctx, gname: str) -> list[Any]:
    """Ranks 0 and 1 interleave async P2P sends with async collectives of all four."""
    g = ctx.group(gname)
    r = ctx.rank
    works: list[Any] = []
    p2p = ctx.coll.create_collective_group(["m0", "m1"]) if r in (0, 1) else None
    for i in range(5):
        if r == 0:
            works.append(p2p.send({"i": torch.tensor(i)}, async_op=True))
        elif r == 1:
            works.append(p2p.recv(async_op=True))
        works.append(g.allreduce(torch.full((3,), float(i + r)), async_op=True))
        works.append(g.broadcast(i * 100 if r == 0 else None, src=0, async_op=True))
    values = [w.wait(timeout=60) for w in works]
    return [
        v.tolist() if isinstance(v, torch.Tensor) else (int(v["i"]) if isinstance(v, dict) else v)
        for v in values
    ]


def t_barrier(ctx: Ctx, gname: str) -> bool:
    g = ctx.group(gname)
    if ctx.rank == 3:
        time.sleep(1.0)
        ctx.store.set(f"{gname}/late", b"1")
    g.barrier(timeout=60)
    return bool(ctx.store.check([f"{gname}/late"]))


def t_partial_then_retry(ctx: Ctx, gname: str) -> list[str]:
    """Rank 3 joins late: the first op of the others times out cleanly, the retry works."""
    g = ctx.group(gname)
    seen = []
    if ctx.rank == 3:
        time.sleep(4.0)
    else:
        try:
            g.allreduce(torch.ones(2), timeout=1.5)
            seen.append("no error")
        except Exception as exc:
            seen.append(type(exc).__name__)
    x = torch.ones(2)
    g.allreduce(x, timeout=60)
    seen.append(str(x.tolist()))
    return seen


def t_dies(ctx: Ctx, gname: str, victim: int) -> dict[str, Any]:
    g = ctx.group(gname)
    g.allreduce(torch.ones(4), timeout=60)
    if ctx.rank == victim:
        time.sleep(0.5)
        os._exit(3)
    return after_a_death(g, lambda: g.allreduce(torch.ones(1 << 16), timeout=120))


def after_a_death(g: MultiCollectiveGroup, first: Callable[[], object]) -> dict[str, Any]:
    """What a survivor sees: ``first()`` (during which a member dies), then a barrier.

    ``first`` / ``first_msg``: the error of ``first()`` (or ``"no error"``); ``seconds``:
    how long it took; ``second`` / ``second_cause``: the barrier's error and its cause.
    """
    t0 = time.monotonic()
    out: dict[str, Any] = {}
    try:
        first()
        out["first"] = "no error"
    except Exception as exc:
        out["first"] = type(exc).__name__
        out["first_msg"] = str(exc)
    out["seconds"] = time.monotonic() - t0
    try:
        g.barrier(timeout=5)
        out["second"] = "no error"
    except Exception as exc:
        out["second"] = type(exc).__name__
        out["second_cause"] = type(exc.__cause__).__name__
    return out


def t_send_recv(ctx: Ctx, gname: str) -> list[float]:
    """Point-to-point inside an N-member group (ranks 0 -> 1), then a barrier."""
    g = ctx.group(gname)
    t = torch.zeros(2)
    if ctx.rank == 0:
        g.send_tensor(torch.tensor([7.0, 8.0]), 1, timeout=60)
    elif ctx.rank == 1:
        g.recv_tensor(t, 0, timeout=60)
    g.barrier(timeout=60)
    return t.tolist()


def t_ring_reduce_scatter(ctx: Ctx, gname: str) -> dict[str, list[float]]:
    """reduce_scatter large enough for the ring, every op, output aliasing an input."""
    g = ctx.group(gname)
    r = ctx.rank
    numel = 1 << 16  # 512 KiB of float64 per input: over RING_MIN_BYTES
    base = torch.arange(numel, dtype=torch.float64) % 7
    out: dict[str, list[float]] = {}
    for op in ("sum", "product", "min", "max"):
        ins = [base + (i + 1) * (r + 1) for i in range(N)]
        keep = [x.clone() for x in ins]
        res = torch.empty(numel, dtype=torch.float64)
        g.reduce_scatter(res, ins, op=op, timeout=120)
        assert all(torch.equal(a, b) for a, b in zip(ins, keep, strict=True))  # unchanged
        out[op] = res[:8].tolist() + res[-8:].tolist()
    ins = [torch.full((numel,), float(i + r), dtype=torch.float32) for i in range(N)]
    g.reduce_scatter(ins[r], ins, timeout=120)  # the output is this member's own input
    out["alias"] = [ins[r][0].item(), ins[r][-1].item()]
    return out
