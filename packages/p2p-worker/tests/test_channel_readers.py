"""The channel worker's readers (``_channels._server.readers``) over real groups.

Two Collectives in this process joined by a real rendezvous store: the shared-memory
link (descriptor, read from the event loop) and the gloo link (shared memory off: the
request reader falls back to a receiving thread).
"""

from __future__ import annotations

import asyncio
import datetime
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import pytest
import torch
import torch.distributed as dist

from p2p_collective import (
    Collective,
    CollectiveGroup,
    CollectiveTimeoutError,
    PeerError,
    parse_collective_config,
)
from p2p_worker._channels._server.readers import PayloadReader, RequestReader


@pytest.fixture(params=[True, False], ids=["shm", "gloo"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[CollectiveGroup, CollectiveGroup]]:
    """(sender, receiver): two connected groups between two Collectives of this process."""
    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30)
    )
    config = parse_collective_config({"shared_memory": request.param})
    colls = [Collective(name, store, timeout=30.0, config=config) for name in ("tx", "rx")]
    tx, rx = (
        cast("CollectiveGroup", c.create_collective_group(["tx", "rx"], group_name="readers"))
        for c in colls
    )
    empty = torch.empty(0, dtype=torch.uint8)
    shake = threading.Thread(target=lambda: tx.send_tensor(empty, timeout=30))
    shake.start()
    rx.recv_tensor(empty, timeout=30)  # the receiving link is connected
    shake.join()
    assert (rx.recv_fileno() is not None) == request.param  # shared memory has one
    yield tx, rx
    for coll in colls:
        coll.close()


def payloads() -> list[Any]:
    out: list[Any] = [("item", i) for i in range(30)]
    out[5] = {"t": torch.arange(100_000)}  # with tensors: an ordinary receive
    out[6] = b"\x01" * 300_000  # over the small-object size: an ordinary receive
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    return bool(a == b)


def test_expected_payloads_come_in_order_large_ones_included(
    pair: tuple[CollectiveGroup, CollectiveGroup],
) -> None:
    tx, rx = pair
    sent = payloads()

    async def main() -> list[tuple[bool, Any, Any]]:
        loop = asyncio.get_running_loop()
        got: list[tuple[bool, Any, Any]] = []
        done = loop.create_future()

        def take(credit: bool, obj: Any, exc: BaseException | None) -> None:
            got.append((credit, obj, exc))
            if len(got) == len(sent) and not done.done():
                done.set_result(None)

        reader = PayloadReader(loop, rx, 30.0, take)
        for i in range(10):  # announced before start: they wait for it
            reader.expect(i % 2 == 0)
        if not reader.start():
            return [(False, None, "no descriptor")]
        for i in range(10, len(sent)):
            reader.expect(i % 2 == 0)
        await loop.run_in_executor(None, lambda: [tx.send(p, timeout=30) for p in sent])
        await asyncio.wait_for(done, 30)
        reader.stop()
        return got

    got = asyncio.run(main())
    if got == [(False, None, "no descriptor")]:
        assert rx.recv_fileno() is None  # gloo: the channel worker posts receives instead
        return
    assert [exc for _, _, exc in got] == [None] * len(sent)
    assert [credit for credit, _, _ in got] == [i % 2 == 0 for i in range(len(sent))]
    assert all(_same(obj, want) for (_, obj, _), want in zip(got, sent, strict=True))


def _two_expected(
    rx: CollectiveGroup,
    timeout: float,
    act: Callable[[], None],
    credits: tuple[bool, bool] = (False, True),
) -> tuple[list[tuple[bool, Any, Any]], float]:
    """Expect two payloads on ``rx``, run ``act`` (in a thread); what came, and when."""

    async def main() -> tuple[list[tuple[bool, Any, Any]], float]:
        loop = asyncio.get_running_loop()
        got: list[tuple[bool, Any, Any]] = []
        reader = PayloadReader(loop, rx, timeout, lambda *a: got.append(a))
        assert reader.start()
        t0 = time.monotonic()
        for credit in credits:
            reader.expect(credit)
        await loop.run_in_executor(None, act)
        while len(got) < 2 and time.monotonic() - t0 < 10:
            await asyncio.sleep(0.02)
        return got, time.monotonic() - t0

    return asyncio.run(main())


@pytest.mark.parametrize("pair", [True], indirect=True, ids=["shm"])
def test_a_late_payload_fails_every_expected_one_after_the_timeout(
    pair: tuple[CollectiveGroup, CollectiveGroup],
) -> None:
    tx, rx = pair
    got, elapsed = _two_expected(rx, 0.5, lambda: None)
    assert [(credit, obj) for credit, obj, _ in got] == [(False, None), (True, None)]
    assert all(isinstance(exc, CollectiveTimeoutError) for _, _, exc in got)
    assert "did not arrive within 0.5 s" in str(got[0][2])
    assert 0.5 <= elapsed < 2.5
    # nothing was consumed: the group still receives what comes later
    tx.send("later", timeout=30)
    assert rx.recv(timeout=30) == "later"


@pytest.mark.parametrize("pair", [True], indirect=True, ids=["shm"])
def test_the_sender_closing_fails_the_expected_payloads_at_once(
    pair: tuple[CollectiveGroup, CollectiveGroup],
) -> None:
    tx, rx = pair

    def send_one_then_close() -> None:
        tx.send(("one",), timeout=30)
        time.sleep(0.2)
        tx.close()

    got, elapsed = _two_expected(rx, 60.0, send_one_then_close, credits=(True, False))
    assert got[0] == (True, ("one",), None)
    assert got[1][:2] == (False, None)
    assert isinstance(got[1][2], PeerError)
    assert elapsed < 5.0


def test_requests_arrive_in_order_from_the_loop_or_a_thread(
    pair: tuple[CollectiveGroup, CollectiveGroup],
) -> None:
    tx, rx = pair
    sent = payloads()

    async def main() -> tuple[list[Any], list[BaseException], str]:
        loop = asyncio.get_running_loop()
        got: list[Any] = []
        failed: list[BaseException] = []
        reader = RequestReader(loop, rx, got.append, failed.append)
        reader.start()
        await loop.run_in_executor(None, lambda: [tx.send(p, timeout=30) for p in sent])
        t0 = time.monotonic()
        while len(got) < len(sent) and time.monotonic() - t0 < 30:
            await asyncio.sleep(0.02)
        tx.close()  # the peer leaves: reported once
        while not failed and time.monotonic() - t0 < 30:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)
        reader.stop()
        return got, failed, reader.mode

    got, failed, mode = asyncio.run(main())
    assert mode == ("loop" if rx.recv_fileno() is not None else "thread")
    assert len(got) == len(sent)
    assert all(_same(a, b) for a, b in zip(got, sent, strict=True))
    assert len(failed) == 1
    assert isinstance(failed[0], PeerError), repr(failed[0])
