"""The channel worker's bookkeeping (slots, FIFO items and waiters), on a real event loop."""

from __future__ import annotations

import asyncio
import pickle
import queue
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from p2p_asyncwork import P2PError
from p2p_worker import (
    ChannelClosedError,
    ChannelEmpty,
    ChannelError,
    ChannelExistsError,
    ChannelFull,
    ChannelNotFoundError,
    WorkerError,
)
from p2p_worker._channels._protocol.keys import DEFAULT_KEY
from p2p_worker._channels._protocol.payload import payload_nbytes
from p2p_worker._channels._server.queue import (
    PASSING_GRACE,
    WAITER_CANCELLED,
    WAITER_RESET,
    ChannelQueue,
    Item,
)


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 30))


async def put(q: ChannelQueue, obj: Any, nbytes: int = 0) -> None:
    """What a put does: reserve a slot, then the payload arrives."""
    assert await q.reserve("producer", block=False, timeout=None) is True
    q.arrived(Item(obj, nbytes))


def objs(items: list[Item]) -> list[Any]:
    return [i.obj for i in items]


def test_slots_bound_what_is_held() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=2)
        assert await q.reserve("p", block=False, timeout=None) is True
        assert await q.reserve("p", block=False, timeout=None) is True
        assert await q.reserve("p", block=False, timeout=None) is False
        assert await q.reserve("p", block=True, timeout=0.05) is False
        q.arrived(Item("a", 0))
        q.arrived(Item("b", 0))
        got = await q.take("c", 1, None, block=False, timeout=None)
        assert objs(got) == ["a"]
        # Taken but not yet delivered: the slot is still held.
        assert q.held == 2
        assert await q.reserve("p", block=False, timeout=None) is False
        q.release(1)
        assert await q.reserve("p", block=False, timeout=None) is True
        assert q.state().held == 2

    run(main())


def test_a_put_without_waiting_waits_briefly_for_a_slot_that_is_only_passing() -> None:
    # A consumer has the item (its get returned) but its acknowledgement is still on the
    # way: a put_nowait elsewhere must find room once it lands, not fail at once.
    async def main() -> None:
        q = ChannelQueue(maxsize=1)
        await put(q, "a")
        loop = asyncio.get_running_loop()
        started = loop.time()
        # an item queued (not passing): refused at once
        assert await q.reserve("p", block=False, timeout=None) is False
        assert loop.time() - started < 0.05
        assert objs(await q.take("c", 1, None, block=False, timeout=None)) == ["a"]
        loop.call_later(0.03, q.release, 1)  # the acknowledgement lands
        started = loop.time()
        assert await q.reserve("p", block=False, timeout=None) is True
        assert 0.02 < loop.time() - started < PASSING_GRACE
        q.arrived(Item("b", 0))
        assert objs(await q.take("c", 1, None, block=False, timeout=None)) == ["b"]
        # no acknowledgement comes: refused after the grace, and nothing is held for it
        started = loop.time()
        assert await q.reserve("p", block=False, timeout=None) is False
        assert loop.time() - started + 0.01 >= PASSING_GRACE
        assert (q.held, q.arriving) == (1, 0)
        q.release(1)
        assert await q.reserve("p", block=False, timeout=None) is True

    run(main())


def test_unbounded_channel_never_refuses() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=0)
        for _ in range(100):
            assert await q.reserve("p", block=False, timeout=None) is True
        assert q.held == 100

    run(main())


def test_waiting_producers_are_served_in_arrival_order() -> None:
    async def main() -> list[str]:
        q = ChannelQueue(maxsize=1)
        assert await q.reserve("first", block=False, timeout=None)
        order: list[str] = []

        async def wait_slot(name: str) -> None:
            assert await q.reserve(name, block=True, timeout=None) is True
            order.append(name)

        tasks = [asyncio.create_task(wait_slot(f"p{i}")) for i in range(4)]
        await asyncio.sleep(0.01)
        # A non-blocking reservation must not jump the queue of waiters.
        assert await q.reserve("late", block=False, timeout=None) is False
        for _ in range(4):
            q.release(1)
            await asyncio.sleep(0.01)
        await asyncio.gather(*tasks)
        return order

    assert run(main()) == ["p0", "p1", "p2", "p3"]


def test_waiting_consumers_are_served_in_arrival_order_and_items_fifo() -> None:
    async def main() -> dict[str, list[Any]]:
        q = ChannelQueue(maxsize=0)
        got: dict[str, list[Any]] = {}

        async def wait_item(name: str) -> None:
            got[name] = objs(await q.take(name, 1, None, block=True, timeout=None))

        tasks = [asyncio.create_task(wait_item(f"c{i}")) for i in range(3)]
        await asyncio.sleep(0.01)
        for x in ("x0", "x1", "x2"):
            await put(q, x, 0)
        await asyncio.gather(*tasks)
        return got

    assert run(main()) == {"c0": ["x0"], "c1": ["x1"], "c2": ["x2"]}


def test_take_times_out_and_returns_nothing() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=0)
        assert await q.take("c", 1, None, block=False, timeout=None) is None
        assert await q.take("c", 1, None, block=True, timeout=0.05) is None
        await put(q, "late", 0)  # nobody stale may swallow it
        assert objs(await q.take("c", 1, None, block=False, timeout=None)) == ["late"]

    run(main())


def test_an_arriving_item_counts_as_held() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=0)
        assert await q.reserve("p", block=False, timeout=None)
        assert q.state().arriving == 1
        # Non-blocking and timed-out takes wait for the payload already on its way in.
        nowait = asyncio.create_task(q.take("c", 1, None, block=False, timeout=None))
        timed = asyncio.create_task(q.take("c2", 1, None, block=True, timeout=0.01))
        await asyncio.sleep(0.05)
        assert not nowait.done()
        assert not timed.done()
        q.arrived(Item("first", 0))
        assert objs(await nowait) == ["first"]
        # Nothing arrives any more: the one still waiting gives up at once.
        assert await timed is None
        # An arrival that fails ends such waits too.
        assert await q.reserve("p", block=False, timeout=None)
        waiting = asyncio.create_task(q.take("c", 1, None, block=False, timeout=None))
        await asyncio.sleep(0.01)
        q.arrival_failed()
        assert await waiting is None
        assert (q.held, q.arriving) == (1, 0)  # "first" is still held until delivered

    run(main())


def test_batch_by_count_and_bytes() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=0)
        for i, size in enumerate([100, 100, 100, 500, 100]):
            await put(q, i, size)
        assert objs(await q.take("c", 2, None, block=False, timeout=None)) == [0, 1]
        # 100 + 100 fits in 250; adding 500 would not.
        assert objs(await q.take("c", 10, 250, block=False, timeout=None)) == [2]
        # The first item is always taken, however large.
        assert objs(await q.take("c", 10, 50, block=False, timeout=None)) == [3]
        assert objs(await q.take("c", 10, None, block=False, timeout=None)) == [4]

    run(main())


def test_push_front_puts_failed_items_back_at_the_head_in_order() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=0)
        for i in range(4):
            await put(q, i, 0)
        taken = await q.take("c", 2, None, block=False, timeout=None)
        q.push_front(taken)
        assert objs(await q.take("c", 10, None, block=False, timeout=None)) == [0, 1, 2, 3]

    run(main())


def test_push_front_hands_items_to_a_waiting_consumer() -> None:
    async def main() -> list[Any]:
        q = ChannelQueue(maxsize=0)
        waiter = asyncio.create_task(q.take("c", 5, None, block=True, timeout=None))
        await asyncio.sleep(0.01)
        q.push_front([Item("a", 0), Item("b", 0)])
        return objs(await waiter)

    assert run(main()) == ["a", "b"]


def test_reset_wakes_only_that_peers_waiters() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=1)
        assert await q.reserve("x", block=False, timeout=None)
        dead_put = asyncio.create_task(q.reserve("dead", block=True, timeout=None))
        dead_get = asyncio.create_task(q.take("dead", 1, None, block=True, timeout=None))
        live_get = asyncio.create_task(q.take("live", 1, None, block=True, timeout=None))
        await asyncio.sleep(0.01)
        assert q.reset_peer("dead") == 2
        assert await dead_put is WAITER_RESET
        assert await dead_get is WAITER_RESET
        q.arrived(Item("item", 0))
        assert objs(await live_get) == ["item"]

    run(main())


def test_cancel_withdraws_a_waiting_call() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=0)
        first = asyncio.create_task(q.take("c", 1, None, block=True, timeout=None, token=7))
        second = asyncio.create_task(q.take("c", 1, None, block=True, timeout=None, token=8))
        await asyncio.sleep(0.01)
        assert q.cancel("c", 7) is True
        assert q.cancel("c", 7) is False  # already withdrawn
        assert q.cancel("other", 8) is False  # someone else's token
        assert await first is WAITER_CANCELLED
        await put(q, "kept", 0)
        assert objs(await second) == ["kept"]

    run(main())


def test_a_cancelled_caller_gives_its_grant_back() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=1)
        assert await q.reserve("p", block=False, timeout=None)
        waiting = asyncio.create_task(q.reserve("p2", block=True, timeout=None))
        getter = asyncio.create_task(q.take("c", 1, None, block=True, timeout=None))
        await asyncio.sleep(0.01)
        # Grant both, then cancel the callers before they resume: nothing may leak.
        q.arrived(Item("item", 0))  # handed to the getter
        q.release(1)  # as if delivered: the slot goes to the waiting producer
        waiting.cancel()
        getter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        with pytest.raises(asyncio.CancelledError):
            await getter
        assert (q.held, q.arriving) == (0, 0)
        assert objs(await q.take("c", 1, None, block=False, timeout=None)) == ["item"]

    run(main())


def test_close_fails_waiters_and_later_calls() -> None:
    async def main() -> None:
        q = ChannelQueue(maxsize=0)
        waiter = asyncio.create_task(q.take("c", 1, None, block=True, timeout=None))
        await asyncio.sleep(0.01)
        q.close()
        with pytest.raises(ChannelClosedError):
            await waiter
        with pytest.raises(ChannelClosedError):
            await q.reserve("p", block=False, timeout=None)

    run(main())


@dataclass
class Sample:
    obs: torch.Tensor
    reward: torch.Tensor
    step: int


def test_payload_nbytes_counts_tensor_bytes() -> None:
    assert payload_nbytes(torch.zeros(10, dtype=torch.float64)) == 80
    assert payload_nbytes([torch.zeros(2), torch.zeros(3, dtype=torch.int8)]) == 11
    assert payload_nbytes({"a": torch.zeros(4), "b": "text"}) == 16
    assert payload_nbytes(Sample(torch.zeros(4), torch.zeros(1), 3)) == 20
    assert payload_nbytes(("plain", 1)) == 0


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (ChannelError, None),
        (ChannelFull, queue.Full),
        (ChannelEmpty, queue.Empty),
        (ChannelNotFoundError, LookupError),
        (ChannelExistsError, None),
        (ChannelClosedError, None),
    ],
)
def test_errors_pickle_with_message_and_cause(cls: type[Exception], builtin: type | None) -> None:
    assert issubclass(cls, ChannelError)
    assert issubclass(cls, WorkerError)
    assert issubclass(cls, P2PError)
    if builtin is not None:
        assert issubclass(cls, builtin)
    try:
        try:
            raise OSError("the cause")
        except OSError as cause:
            raise cls("channel 'x': what happened") from cause
    except cls as err:
        back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert str(back) == "channel 'x': what happened"
    assert isinstance(back.__cause__, OSError)
    assert str(back.__cause__) == "the cause"


def test_at_once_paths_never_overtake_a_waiter() -> None:
    """try_reserve / try_take (the channel worker's task-free path) yield to waiters."""

    async def main() -> None:
        q = ChannelQueue(maxsize=1)
        assert q.try_take(DEFAULT_KEY, 1, None) is None  # nothing queued: the get must wait
        assert q.try_reserve() is True
        assert q.try_reserve() is False  # full
        waiting = asyncio.create_task(q.reserve("p2", block=True, timeout=None))
        await asyncio.sleep(0.01)
        q.arrived(Item("a", 0))
        got = q.try_take(DEFAULT_KEY, 5, None)
        assert got is not None
        assert objs(got) == ["a"]
        q.release(1)  # the freed slot goes to the waiting putter, not to try_reserve
        assert await waiting is True
        assert q.try_reserve() is False
        q.arrived(Item("b", 0))
        getter = asyncio.create_task(q.take("c1", 1, None, block=True, timeout=None))
        await asyncio.sleep(0.01)  # it was served at once (the item was there)
        assert objs(await getter) == ["b"]
        late = asyncio.create_task(q.take("c2", 1, None, block=True, timeout=None))
        await asyncio.sleep(0.01)
        q.release(1)
        assert q.try_reserve() is True
        q.arrived(Item("c", 0))  # handed to the waiting getter
        assert objs(await late) == ["c"]
        assert q.try_take(DEFAULT_KEY, 1, None) is None
        q.close()
        assert q.try_reserve() is False

    run(main())


def test_settle_frees_the_slots_of_arrived_items_and_puts_the_rest_back_in_order() -> None:
    async def main() -> None:
        q = ChannelQueue(8)
        for i in range(5):
            await put(q, i)
        head = q.queues[DEFAULT_KEY]
        sent = {5: [head[2], head[3]], 1: [head[0]], 3: [head[1]]}
        for _ in range(4):
            head.popleft()
        # gets 1, 3, 5 took items 0, 1, (2, 3); get 1's item did not arrive, of get 5's
        # only the first did (a token not sent for is ignored)
        assert q.settle(sent, {3: 1, 5: 1, 9: 4}) == (2, 2)
        assert objs(list(head)) == [0, 3, 4]  # back at the head, in channel order
        assert q.held == 3  # two slots freed
        assert q.settle({}, {}) == (0, 0)

    run(main())


def test_payload_counts_per_link_generation_are_final_once_no_receive_is_posted() -> None:
    from p2p_worker._channels._server.peers import Payloads

    p = Payloads()
    for _ in range(3):
        p.post(0)
    p.done(0, True)
    assert (p.arrived(0), p.final(0)) == (1, None)  # two receives still posted
    p.done(0, True)
    p.done(0, False)  # failed when the link was reset
    assert (p.arrived(0), p.final(0)) == (2, 2)
    assert p.final(1) == 0  # nothing was posted on generation 1
    p.forget_before(Payloads.KEEP)
    assert p.known_from == 1
    assert 0 not in p.counts
