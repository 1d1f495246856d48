"""The bookkeeping inside a channel worker: slots, queued items and FIFO waiters (asyncio).

Everything here runs on the channel worker's event loop thread, so no locks are needed.
A *slot* is one item's worth of room: it is taken when a producer's reservation is
granted (before its payload travels), stays taken while the item waits in the queue and
while it is being sent to a consumer, and is given back only when that send has
completed (or the reservation failed). So at most ``maxsize`` items are ever held in
memory, payloads in transit included.

An item counts as *in the channel* from the moment its put is granted: once a put has
returned, its item is either queued or still *arriving* (payload on the wire to the
channel worker). ``qsize`` counts both, and a get whose wait is over (``get_nowait``, or
a timeout) still waits for items that are arriving, so a completed put is never missed.

Waiting producers and consumers are served strictly in arrival order; a freed slot or a
new item is handed straight to the oldest waiter. Items are queued per key (one FIFO
each, see :mod:`p2p_worker._channels._protocol.keys`); a getter waits on its key's FIFO only. The
slots are shared by all keys: ``maxsize`` bounds the channel, not each key.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from p2p_worker._channels._protocol.errors import ChannelClosedError
from p2p_worker._channels._protocol.keys import DEFAULT_KEY, batch_weight, unwrap
from p2p_worker._channels._protocol.payload import payload_nbytes

PASSING_GRACE = 0.25
"""Seconds a put without waiting still waits, when the channel is full only because some
slots are passing (a consumer's acknowledgement or a producer's unused credits on their
way back; both are sent within milliseconds)."""


class _Signal:
    """A named sentinel resolving a waiter without a grant."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


_TIMED_OUT = _Signal("TIMED_OUT")
WAITER_RESET = _Signal("WAITER_RESET")
"""Resolves the waiters of a peer whose link to the channel worker was reset."""
WAITER_CANCELLED = _Signal("WAITER_CANCELLED")
"""Resolves a waiter that its caller withdrew (``ChannelWork.cancel``)."""


@dataclass
class Item:
    """One queued item: the received object, its tensor bytes, key and weight."""

    obj: object
    nbytes: int
    key: Hashable = DEFAULT_KEY
    weight: int = 0


def item_of(obj: object) -> Item:
    """A received object as a queue item (a ``Keyed`` envelope is opened, see ``keys``)."""
    item, key, weight = unwrap(obj)
    return Item(item, payload_nbytes(item), key, weight)


WaiterResult = bool | list[Item] | None | _Signal | ChannelClosedError
"""What a waiting put (a bool: granted) or get (its items, or None) is resolved with.

A :class:`_Signal` when it ends without a grant; :class:`ChannelClosedError` (raised
by the wait) when the channel closes.
"""


@dataclass
class _Waiter:
    peer: str
    token: int
    fut: asyncio.Future[WaiterResult]
    max_items: int = 1
    max_bytes: int | None = None
    draining: bool = False  # its own wait is over: it waits only for arriving items
    key: Hashable = DEFAULT_KEY
    target_weight: int | None = None  # a weighted batch: collect until this weight
    batch: list[Item] = field(default_factory=list)  # what a weighted batch holds so far


@dataclass
class QueueState:
    """Counters of a :class:`ChannelQueue` (a snapshot)."""

    maxsize: int
    held: int
    queued: int
    arriving: int
    waiting_putters: int
    waiting_getters: int
    closed: bool
    credits: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class ChannelQueue:
    """Slots, the item FIFO and the FIFO of waiters of one channel.

    Args:
        maxsize: Most items held at once (0: no bound).

    Example:
        >>> async def demo():
        ...     q = ChannelQueue(maxsize=1)
        ...     assert await q.reserve("p", block=False, timeout=None)
        ...     assert not await q.reserve("p", block=False, timeout=None)  # full
        ...     q.arrived(Item("x", 0))
        ...     got = await q.take("c", 1, None, block=False, timeout=None)
        ...     q.release(len(got))  # the consumer has it: the slot is free again
        ...     return [i.obj for i in got], q.held
        >>> asyncio.run(demo())
        (['x'], 0)
    """

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.held = 0
        self.arriving = 0  # granted reservations whose payload has not arrived yet
        self.credits = 0  # slots lent to producers ahead of their puts (see grant_credits)
        self.queues: dict[Hashable, deque[Item]] = {}
        self._putters: deque[_Waiter] = deque()
        self._getters: deque[_Waiter] = deque()
        self.closed = False

    # -- producers ----------------------------------------------------------------------

    def _has_room(self) -> bool:
        return self.maxsize == 0 or self.held < self.maxsize

    async def reserve(
        self, peer: str, *, block: bool, timeout: float | None, token: int = -1
    ) -> WaiterResult:
        """Take one slot for ``peer``'s next payload.

        Returns:
            True when a slot was taken; False when there was no room (at once when
            ``block`` is false, else after ``timeout``); :data:`WAITER_RESET` when ``peer``'s
            waiters were dropped by :meth:`reset_peer`; :data:`WAITER_CANCELLED` when the
            caller withdrew it (:meth:`cancel`).

        Raises:
            ChannelClosedError: The channel is closed (or closes while waiting).
        """
        self._check_open()
        _prune(self._putters)
        if not self._putters and self._has_room():
            self.held += 1
            self.arriving += 1
            return True
        if not block:
            if self._putters or not self._in_passing():
                return False
            # Full, but some slots are only passing: items a consumer already has whose
            # acknowledgement is on its way, or credits a producer is about to hand back.
            # A get that returned in one process must leave room for a put_nowait in
            # another (RLinf's channel behaves so), so wait briefly for them.
            timeout = PASSING_GRACE
        waiter = _Waiter(peer, token, asyncio.get_running_loop().create_future())
        self._putters.append(waiter)
        return await self._await(waiter, timeout, lambda _: self.arrival_failed(), False)

    def _in_passing(self) -> int:
        """Slots held by neither a queued nor an arriving item (delivered, or lent credits)."""
        return self.held - self.arriving - sum(len(q) for q in self.queues.values())

    def try_reserve(self) -> bool:
        """Take one slot if :meth:`reserve` would grant it at once (nobody waits, room)."""
        _prune(self._putters)
        if self.closed or self._putters or not self._has_room():
            return False
        self.held += 1
        self.arriving += 1
        return True

    def try_take(self, key: Hashable, max_items: int, max_bytes: int | None) -> list[Item] | None:
        """Items :meth:`take` (by count) would return at once; None if it would wait."""
        queue = self.queues.get(key)
        if self.closed or not queue:
            return None
        if any(w.key == key and not w.fut.done() for w in self._getters):
            return None
        return self._pop(queue, max_items, max_bytes)

    def take_small(self, key: Hashable, most: int) -> list[Item]:
        """Up to ``most`` more items of ``key`` from its head, while they have no tensors."""
        queue = self.queues.get(key)
        out: list[Item] = []
        while queue and len(out) < most and queue[0].nbytes == 0:
            out.append(queue.popleft())
        return out

    def grant_credits(self, want: int) -> int:
        """Lend up to ``want`` more slots to a producer ahead of its next puts; return how many.

        Only free room is lent, and none while other producers wait for room. A credit
        holds a slot like an arriving item (so ``maxsize`` still bounds what is held) but
        is not counted as an item until its payload arrives (:meth:`credit_arrived`) or
        is handed back (:meth:`credit_returned`).
        """
        _prune(self._putters)
        if self._putters or want <= 0:
            return 0
        n = want if self.maxsize == 0 else max(0, min(want, self.maxsize - self.held))
        self.held += n
        self.credits += n
        return n

    def settle(self, items: dict[int, list[Item]], got: dict[int, int]) -> tuple[int, int]:
        """Settle items sent to a consumer whose link failed: ``got[token]`` of each arrived.

        ``items`` maps a get's token to the items sent for it; of each, the first
        ``got[token]`` arrived (their slots are freed), the rest go back to the head of
        the channel, in channel order. Returns ``(delivered, sent back)``.
        """
        delivered, back = 0, []
        for token in sorted(items):
            sent = items[token]
            arrived = max(0, min(int(got.get(token, 0)), len(sent)))
            if arrived:
                delivered += arrived
                self.release(arrived)
            back += sent[arrived:]
        if back:
            self.push_front(back)
        return delivered, len(back)

    def credit_arrived(self, item: Item) -> None:
        """A producer used a credit: its item is queued in the slot the credit held."""
        self.credits -= 1
        self._queue_of(item.key).append(item)
        self._dispatch_items()

    def credit_returned(self) -> None:
        """A credit came back unused (or its transfer failed): its slot is free."""
        self.credits -= 1
        self.release(1)

    def release(self, n: int = 1) -> None:
        """Give back ``n`` slots (an item was delivered, or a reservation failed)."""
        self.held -= n
        if self.held < 0:  # pragma: no cover - a bookkeeping bug, never silently
            raise AssertionError(f"channel slot count went negative ({self.held})")
        self._dispatch_slots()

    def _dispatch_slots(self) -> None:
        while self._putters and self._has_room():
            waiter = self._putters.popleft()
            if waiter.fut.done():
                continue
            self.held += 1
            self.arriving += 1
            waiter.fut.set_result(True)

    # -- items --------------------------------------------------------------------------

    def arrived(self, item: Item) -> None:
        """Append an item whose payload has arrived (it holds the slot it reserved)."""
        self.arriving -= 1
        self._queue_of(item.key).append(item)
        self._dispatch_items()
        self._end_drains()

    def arrival_failed(self) -> None:
        """A granted reservation brought no item (transfer failed or put abandoned)."""
        self.arriving -= 1
        self.release(1)
        self._end_drains()

    def push_front(self, items: list[Item]) -> None:
        """Put items back at the head of their keys' FIFOs, in order (a send failed)."""
        for item in reversed(items):
            self._queue_of(item.key).appendleft(item)
        self._dispatch_items()

    def _queue_of(self, key: Hashable) -> deque[Item]:
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = deque()
        return q

    @property
    def queued(self) -> int:
        """Items queued under every key."""
        return sum(len(q) for q in self.queues.values())

    def queued_for(self, key: Hashable) -> int:
        """Items queued under ``key``."""
        q = self.queues.get(key)
        return len(q) if q else 0

    async def take(
        self,
        peer: str,
        max_items: int,
        max_bytes: int | None,
        *,
        block: bool,
        timeout: float | None,
        token: int = -1,
        key: Hashable = DEFAULT_KEY,
        target_weight: int | None = None,
    ) -> WaiterResult:
        """Remove items from the head of ``key``'s FIFO for ``peer``.

        By count (``target_weight`` None): the first item is always taken; further ones
        only while they are already queued, up to ``max_items`` and while their tensor
        bytes keep the total within ``max_bytes``. By weight: items are collected, also
        as they arrive, until their weights (see ``batch_weight``) reach
        ``target_weight`` or the next one would exceed it; the first is always taken.
        The items keep their slots until the caller :meth:`release` s them.

        Returns:
            A non-empty list of items; None when none came: the wait (none when
            ``block`` is false, else ``timeout``) is over and no item is arriving any
            more (a weighted batch that got some items by then returns them);
            :data:`WAITER_RESET` or :data:`WAITER_CANCELLED` (see :meth:`reserve`).

        Raises:
            ChannelClosedError: The channel is closed (or closes while waiting).
        """
        self._check_open()
        _prune(self._getters)
        loop = asyncio.get_running_loop()
        waiter = _Waiter(
            peer, token, loop.create_future(), max_items, max_bytes, not block, key, target_weight
        )
        queue = self.queues.get(key)
        ahead = any(w.key == key and not w.fut.done() for w in self._getters)
        if queue and not ahead and self._serve(waiter):
            return waiter.fut.result()
        if not block and not self.arriving:
            return waiter.batch or None
        self._getters.append(waiter)
        try:
            result = await self._await(
                waiter, None if waiter.draining else timeout, self.push_front
            )
            if result is _TIMED_OUT and self.arriving and not waiter.fut.done():
                waiter.draining = True  # its time is up, but items are on their way in
                result = await self._await(waiter, None, self.push_front)
        except asyncio.CancelledError:
            self._give_back_partial(waiter)
            raise
        if result is _TIMED_OUT or result is None:
            waiter.fut.cancel()
            partial, waiter.batch = waiter.batch, []
            return partial or None
        if result is WAITER_RESET or result is WAITER_CANCELLED:
            self._give_back_partial(waiter)
        return result

    def _give_back_partial(self, waiter: _Waiter) -> None:
        partial, waiter.batch = waiter.batch, []
        if partial:
            self.push_front(partial)

    def _serve(self, waiter: _Waiter) -> bool:
        """Give ``waiter`` items of its key; resolve it and return True once it is served."""
        queue = self.queues.get(waiter.key)
        if not queue:
            return False
        if waiter.target_weight is None:
            waiter.fut.set_result(self._pop(queue, waiter.max_items, waiter.max_bytes))
            return True
        total = sum(batch_weight(i.weight) for i in waiter.batch)
        while queue:
            nxt = batch_weight(queue[0].weight)
            if waiter.batch and total + nxt > waiter.target_weight:
                break
            waiter.batch.append(queue.popleft())
            total += nxt
            if total >= waiter.target_weight:
                break
        full = total >= waiter.target_weight or bool(queue and waiter.batch)
        if full:
            batch, waiter.batch = waiter.batch, []
            waiter.fut.set_result(batch)
        return full

    def _pop(self, queue: deque[Item], max_items: int, max_bytes: int | None) -> list[Item]:
        out = [queue.popleft()]
        total = out[0].nbytes
        while queue and len(out) < max_items:
            nxt = queue[0].nbytes
            if max_bytes is not None and total + nxt > max_bytes:
                break
            out.append(queue.popleft())
            total += nxt
        return out

    def _dispatch_items(self) -> None:
        """Hand queued items to the oldest getters of their keys."""
        if not self._getters:
            return
        served = False
        for waiter in self._getters:
            if not waiter.fut.done() and self.queues.get(waiter.key):
                served = self._serve(waiter) or served
        if served:
            self._getters = deque(w for w in self._getters if not w.fut.done())

    def _end_drains(self) -> None:
        """Nothing is arriving any more: getters that only waited for arrivals get None."""
        if self.arriving:
            return
        for waiter in self._getters:
            if waiter.draining and not waiter.fut.done():
                partial, waiter.batch = waiter.batch, []
                waiter.fut.set_result(partial or None)

    # -- waiting ------------------------------------------------------------------------

    async def _await(
        self,
        waiter: _Waiter,
        timeout: float | None,
        give_back: Callable[[list[Item]], None],
        timed_out: WaiterResult = None,
    ) -> WaiterResult:
        """Wait for ``waiter``; on timeout return ``timed_out`` (or _TIMED_OUT if None)."""
        try:
            await asyncio.wait({waiter.fut}, timeout=timeout)
        except asyncio.CancelledError:
            # The caller went away: return what it was granted, if anything.
            if waiter.fut.done() and not waiter.fut.cancelled():
                _give_back(waiter.fut.result(), give_back)
            else:
                waiter.fut.cancel()
            raise
        if waiter.fut.done():
            result = waiter.fut.result()
            if isinstance(result, ChannelClosedError):
                raise result
            return result
        if timed_out is None:  # a getter: the caller decides whether to keep waiting
            return _TIMED_OUT
        waiter.fut.cancel()  # timed out; the dispatchers skip cancelled waiters
        return timed_out

    def reset_peer(self, peer: str) -> int:
        """Resolve every waiter of ``peer`` with :data:`WAITER_RESET`; return how many."""
        count = 0
        for waiters in (self._putters, self._getters):
            for waiter in waiters:
                if waiter.peer == peer and not waiter.fut.done():
                    waiter.fut.set_result(WAITER_RESET)
                    count += 1
        return count

    def cancel(self, peer: str, token: int) -> bool:
        """Withdraw ``peer``'s waiting call ``token``; False if it is not waiting."""
        for waiters in (self._putters, self._getters):
            for waiter in waiters:
                if waiter.peer == peer and waiter.token == token and not waiter.fut.done():
                    waiter.fut.set_result(WAITER_CANCELLED)
                    return True
        return False

    def close(self) -> None:
        """Fail every waiter and every later call with :class:`ChannelClosedError`."""
        self.closed = True
        for waiters in (self._putters, self._getters):
            while waiters:
                waiter = waiters.popleft()
                if not waiter.fut.done():
                    waiter.fut.set_result(ChannelClosedError("the channel was destroyed"))

    def _check_open(self) -> None:
        if self.closed:
            raise ChannelClosedError("the channel was destroyed")

    def state(self) -> QueueState:
        """A snapshot of the counters."""
        _prune(self._putters)
        _prune(self._getters)
        return QueueState(
            maxsize=self.maxsize,
            held=self.held,
            queued=self.queued,
            arriving=self.arriving,
            waiting_putters=len(self._putters),
            waiting_getters=len(self._getters),
            closed=self.closed,
            credits=self.credits,
        )


def _prune(waiters: deque[_Waiter]) -> None:
    while waiters and waiters[0].fut.done():
        waiters.popleft()


def _give_back(result: WaiterResult, give_back: Callable[[list[Item]], None]) -> None:
    """Undo a grant its caller did not live to see: a put's slot, a get's items."""
    if result is True:
        give_back([])  # a put's slot: its callback frees it
    elif isinstance(result, list):
        give_back(result)
