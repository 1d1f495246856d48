from __future__ import annotations

import multiprocessing as mp
import socket
from concurrent.futures import Future
from datetime import timedelta
from typing import Any

import pytest
import torch

from p2p_asyncwork import AsyncChannelWork, AsyncCollWork, AsyncFuncWork


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gloo_peer(rank: int, port: int, q: Any) -> None:
    import torch.distributed as dist

    try:
        store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timedelta(seconds=30))
        pg = dist.ProcessGroupGloo(store, rank, 2, timedelta(seconds=30))
        if rank == 0:
            t = torch.arange(1000, dtype=torch.float32)
            works = [pg.send([t], 1, 0), pg.send([t * 2], 1, 1)]
            sent = AsyncCollWork(works, result="sent").wait(timeout=20)
            # broadcast from rank 0, wrapped with then()
            b = torch.full((4,), 7.0)
            bw = AsyncCollWork(pg.broadcast([b], dist.BroadcastOptions()), result=b)
            total = bw.then(lambda x: float(x.sum())).wait(timeout=20)
            q.put(("rank0", sent, total))
        else:
            a = torch.empty(1000)
            b2 = torch.empty(1000)
            w = AsyncCollWork([pg.recv([a], 0, 0), pg.recv([b2], 0, 1)], result=(a, b2))
            chained = w.then(lambda ab: float(ab[0].sum() + ab[1].sum()))
            total_recv = chained.wait(timeout=20)
            assert isinstance(chained, AsyncFuncWork)
            bc = torch.zeros(4)
            bw = AsyncCollWork(pg.broadcast([bc], dist.BroadcastOptions()), result=bc)
            got = bw.wait(timeout=20)
            q.put(("rank1", total_recv, got.tolist()))
        # a receive that fails: the peer tears down its group -> error is stored, not hung
        store.set(f"done{rank}", b"1")
        store.wait(["done0", "done1"], timedelta(seconds=20))
    except BaseException as exc:  # report to the parent instead of dying silently
        q.put(("error", rank, repr(exc)))


@pytest.mark.timeout(120)
def test_async_coll_work_with_real_gloo_between_two_processes() -> None:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_gloo_peer, args=(r, port, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    results = {}
    for _ in range(2):
        item = q.get(timeout=90)
        assert item[0] != "error", item
        results[item[0]] = item[1:]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    expected = float(torch.arange(1000, dtype=torch.float32).sum()) * 3
    assert results["rank0"] == ("sent", 28.0)
    assert results["rank1"] == (expected, [7.0, 7.0, 7.0, 7.0])


class _FakeTorchFuture:
    """A collaborator standing in for torch's Future (the lower layer's type)."""

    def __init__(self) -> None:
        self.callbacks: list[Any] = []
        self.error: BaseException | None = None

    def add_done_callback(self, cb: Any) -> None:
        self.callbacks.append(cb)

    def wait(self) -> None:
        if self.error is not None:
            raise self.error

    def finish(self, error: BaseException | None = None) -> None:
        self.error = error
        for cb in self.callbacks:
            cb(self)


class _Work:
    def __init__(self) -> None:
        self.fut = _FakeTorchFuture()

    def get_future(self) -> _FakeTorchFuture:
        return self.fut

    def wait(self) -> None:
        self.fut.wait()


def test_coll_work_completes_after_all_and_fails_on_first_error() -> None:
    a, b = _Work(), _Work()
    w = AsyncCollWork([a, b], result=42)
    a.fut.finish()
    assert not w.done()
    b.fut.finish()
    assert w.wait(timeout=1) == 42

    c, d = _Work(), _Work()
    w2 = AsyncCollWork((c, d))
    c.fut.finish(RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="closed by peer"):
        w2.wait(timeout=1)


def test_coll_work_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one work"):
        AsyncCollWork([])
    with pytest.raises(TypeError, match=r"element 1 .int. is not a work"):
        AsyncCollWork([_Work(), 3])  # type: ignore[list-item]


class _Ref:
    def __init__(self) -> None:
        self.f: Future[Any] = Future()

    def future(self) -> Future[Any]:
        return self.f


def test_channel_work_resolves_transforms_and_fails() -> None:
    ref = _Ref()
    w = AsyncChannelWork(ref, transform=lambda v: v["item"])
    assert not w.done()
    ref.f.set_result({"item": [1, 2]})
    assert w.wait(timeout=1) == [1, 2]

    ref2 = _Ref()
    w2 = AsyncChannelWork(ref2).then(lambda v: v)
    ref2.f.set_exception(ConnectionError("actor died"))
    with pytest.raises(ConnectionError, match="actor died"):
        w2.wait(timeout=1)

    with pytest.raises(TypeError, match="has no future"):
        AsyncChannelWork(object())  # type: ignore[arg-type]
