"""Tasks for the event-loop receive tests (``recv_fileno`` / ``recv_nowait``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import torch
from collective_tasks import PeerContext

from p2p_collective import CollectiveError, CollectiveGroup, Unready


def messages() -> list[Any]:
    """Small plain objects with larger frames between them (each kind recv_nowait leaves)."""
    out: list[Any] = [("request", i, {"key": i % 3}) for i in range(40)]
    out[7] = {"blob": b"\x05" * 300_000}  # over SMALL_OBJECT_MAX: a frame of two messages
    out[15] = {"t": torch.arange(1000)}  # tensors: a frame with metadata
    out[16] = torch.ones(3)  # one small tensor: inline, not a plain object
    out[30] = torch.full((1 << 20,), 2.0)  # 4 MiB: through the segment
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def t_send_all(ctx: PeerContext, gname: str) -> str:
    g = ctx.group(gname)
    g.send("hello")
    ctx.barrier(gname)
    for i, msg in enumerate(messages()):
        g.send(msg, timeout=30)
        if i % 10 == 9:
            time.sleep(0.05)  # the reader empties the stream and waits on the loop again
    ctx.barrier(gname + "/done")
    return g.stats()["send"]["transport"]


def _read(g: CollectiveGroup, n: int) -> tuple[list[Any], dict[str, int]]:
    """Receive ``n`` objects from an asyncio loop: a reader on the descriptor, recv() for
    the frames recv_nowait leaves."""
    counts = {"nowait": 0, "empty": 0, "large": 0}

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        got: list[Any] = []
        done = loop.create_future()
        fd = g.recv_fileno()
        assert fd is not None

        def readable() -> None:
            while len(got) < n:
                obj = g.recv_nowait()
                if obj is Unready.EMPTY:
                    counts["empty"] += 1
                    return
                if obj is Unready.LARGE:
                    counts["large"] += 1
                    loop.remove_reader(fd)
                    work = g.recv(async_op=True, timeout=30)
                    work.add_done_callback(lambda w: loop.call_soon_threadsafe(finish_large, w))
                    return
                counts["nowait"] += 1
                got.append(obj)
            if not done.done():
                done.set_result(None)

        def finish_large(work: Any) -> None:
            got.append(work.wait(0))
            loop.add_reader(fd, readable)
            readable()

        loop.add_reader(fd, readable)
        try:
            await asyncio.wait_for(done, 60)
        finally:
            loop.remove_reader(fd)
        return got

    return asyncio.run(main()), counts


def t_read_all(ctx: PeerContext, gname: str) -> tuple[bool, dict[str, int], Any]:
    g = ctx.group(gname)
    before = g.recv_fileno()
    try:
        g.recv_nowait()
        refused = "no error"
    except CollectiveError as exc:
        refused = str(exc)
    assert g.recv(timeout=30) == "hello"
    transport = g.stats()["recv"]["transport"]
    if transport != "shm":
        ctx.barrier(gname)
        got = [g.recv(timeout=30) for _ in messages()]
        ctx.barrier(gname + "/done")
        return all(map(_same, got, messages())), {"fileno": g.recv_fileno() or 0}, transport
    ctx.barrier(gname)
    got, counts = _read(g, len(messages()))
    ctx.barrier(gname + "/done")
    same = len(got) == len(messages()) and all(map(_same, got, messages()))
    # the group still receives the usual way afterwards
    return same, counts, (before, refused, transport)


def t_close_soon(ctx: PeerContext, gname: str) -> None:
    g = ctx.group(gname)
    g.send("hello")
    ctx.barrier(gname)
    time.sleep(0.3)
    g.close()


def t_wait_for_close(ctx: PeerContext, gname: str) -> tuple[str, float, str, str]:
    g = ctx.group(gname)
    assert g.recv(timeout=30) == "hello"
    fd = g.recv_fileno()
    ctx.barrier(gname)
    if fd is None:
        return "no descriptor", 0.0, "", g.stats()["recv"]["transport"]
    t0 = time.monotonic()

    async def main() -> str:
        loop = asyncio.get_running_loop()
        out = loop.create_future()

        def readable() -> None:
            try:
                got = g.recv_nowait()
            except Exception as exc:
                loop.remove_reader(fd)
                out.set_result(f"{type(exc).__name__}: {exc}")
                return
            if got is not Unready.EMPTY:
                loop.remove_reader(fd)
                out.set_result(f"unexpected {got!r}")

        loop.add_reader(fd, readable)
        return await asyncio.wait_for(out, 30)

    outcome = asyncio.run(main())
    elapsed = time.monotonic() - t0
    try:
        g.recv(timeout=5)
        after = "no error"
    except Exception as exc:
        after = type(exc).__name__
    return outcome, elapsed, after, g.stats()["recv"]["transport"]
