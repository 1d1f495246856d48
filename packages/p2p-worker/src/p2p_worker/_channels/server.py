"""The channel worker: an asyncio Ray actor (a :class:`Worker`) that holds one channel.

Control travels as Ray actor calls on this actor; payloads travel as ``Worker``
send/recv through the collective groups between each peer and this worker, so tensors
take the optimized path and the job's compression applies as for any send/recv.

- ``put_begin``: waits (FIFO) for a free slot, takes it, posts a ``recv`` from the
  producer and answers ``granted(gen)``; the producer then sends its item. When the
  payload has arrived it is appended to the queue; a failed or abandoned transfer frees
  the slot. No payload ever travels without a slot, so ``maxsize`` bounds memory.
  A grant may also lend *credits*: further free slots, each with a receive posted
  ahead, so the producer's next puts are plain sends without a call. Credits count
  against ``maxsize`` like items; an idle producer hands unused ones back (it sends a
  ``Void`` for each), and a caller's own credit payloads are waited for before its
  ``get_begin``/``qsize``/``state`` (``sync``), so its own puts are always visible to it.
- ``get_begin``: waits (FIFO) for items, removes up to the requested number from the
  head, posts one ``send`` per item to the consumer and answers ``granted(gen, k)``; the
  consumer then receives ``k`` objects. An item whose send fails goes back to the head;
  a delivered item frees its slot.

Each peer has one link (a collective group with a generation number in its name). A
failed transfer resets that peer's link: the group is closed (its queued operations
fail at once), the generation is bumped, and the peer's waiting calls answer
``RESET``. Peers learn the current generation from every answer and move to
the new group, so a dead or confused peer never blocks the others for longer than one
transfer timeout.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from typing import Any

import ray
import torch

from p2p_worker._channels.keys import DEFAULT_KEY, unwrap
from p2p_worker._channels.proto import CANCELLED as CANCELLED_ANSWER
from p2p_worker._channels.proto import (
    NO_ROOM,
    ChannelSpec,
    Hello,
    channel_address,
    granted,
    link_group_name,
)
from p2p_worker._channels.proto import RESET as RESET_ANSWER
from p2p_worker._channels.queue import (
    CANCELLED,
    RESET,
    ChannelQueue,
    Item,
    Void,
    payload_nbytes,
)
from p2p_worker._info import WorkerInfo
from p2p_worker._runtime import JobContext, WorkerRuntime
from p2p_worker._worker_base import WorkerBase

logger = logging.getLogger(__name__)

WATCH_PERIOD = 2.0  # seconds between checks that the job's rendezvous store is alive
MAX_CREDITS = 8  # most put credits one grant lends
TURN_WAIT = 30.0  # seconds a call waits for a peer's earlier call of its kind to arrive


class _Tokens:
    """Which of a peer's calls (numbered 0, 1, 2, ... by the peer) ran, run, or are withdrawn."""

    def __init__(self) -> None:
        self.low = 0  # every token below has finished
        self.done: set[int] = set()
        self.active: set[int] = set()
        self.cancelled: set[int] = set()  # withdrawn before they arrived

    def start(self, token: int) -> bool:
        """Mark ``token`` running; False (and finished) if it was withdrawn already."""
        if token in self.cancelled:
            self.cancelled.discard(token)
            self.finish(token)
            return False
        self.active.add(token)
        return True

    def finish(self, token: int) -> None:
        self.active.discard(token)
        self.done.add(token)
        while self.low in self.done:
            self.done.discard(self.low)
            self.low += 1

    def withdraw_early(self, token: int) -> bool:
        """Withdraw a call that has not arrived yet; False if it ran or runs."""
        if token < self.low or token in self.done or token in self.active:
            return False
        self.cancelled.add(token)
        return True


class _Turns:
    """Lets a peer's calls of one kind pass a point in the order the peer issued them.

    Ray may start the calls of one caller on an asyncio actor out of order, so a call
    numbered ``seq`` waits in :meth:`turn` until every lower one has :meth:`passed`. A
    lower number whose call has not even :meth:`arrive` d after ``TURN_WAIT`` seconds is
    skipped (logged): that call was lost, and the later ones must not wait for it forever.
    """

    def __init__(self) -> None:
        self.low = 0  # every seq below has passed
        self.done: set[int] = set()
        self.arrived: set[int] = set()
        self.waiters: list[tuple[int, asyncio.Future[None]]] = []

    def arrive(self, seq: int) -> None:
        """Call ``seq`` has arrived (it will pass)."""
        if seq >= self.low:
            self.arrived.add(seq)

    def passed(self, seq: int) -> None:
        """Call ``seq`` is past the point (idempotent; a negative ``seq`` is not ordered)."""
        if seq < self.low:
            return
        self.done.add(seq)
        while self.low in self.done:
            self.done.discard(self.low)
            self.arrived.discard(self.low)
            self.low += 1
        keep = []
        for want, fut in self.waiters:
            if want <= self.low:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((want, fut))
        self.waiters = keep

    async def turn(self, seq: int, what: str) -> None:
        """Wait until every call below ``seq`` has passed (or was skipped as lost)."""
        while seq > self.low:
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append((seq, fut))
            done, _ = await asyncio.wait({fut}, timeout=TURN_WAIT)
            if done:
                return
            lost = [n for n in range(self.low, seq) if n not in self.arrived]
            if lost:
                logger.warning(
                    "channel: %s call %d waited %.0f s for its peer's calls %s, which never"
                    " came; going on without them",
                    what,
                    seq,
                    TURN_WAIT,
                    lost,
                )
            for n in lost:
                self.passed(n)


class _Sends:
    """The sends of one granted get, completing one by one."""

    __slots__ = ("failed", "items", "left")

    def __init__(self, items: list[Item]) -> None:
        self.items = items
        self.left = len(items)
        self.failed: list[int] = []


class _Peer:
    __slots__ = ("gen", "group", "name", "posting", "seen", "syncs", "taking", "tokens")

    def __init__(self, name: str) -> None:
        self.name = name
        self.gen = 0
        self.group: Any = None
        self.tokens = _Tokens()
        self.new_handle()
        self.seen = 0  # payloads (items or voids) received from the peer on this gen
        self.syncs: list[tuple[int, asyncio.Future[None]]] = []  # (count, woken at count)

    def new_handle(self) -> None:
        """The peer opened a new handle: it numbers its calls from 0 again."""
        self.tokens = _Tokens()
        # A peer's gets take items, and post their sends, in the order it issued them:
        # it receives the items of its gets in that order.
        self.taking = _Turns()
        self.posting = _Turns()

    def wake(self, everyone: bool = False) -> None:
        """Wake the calls waiting for this peer's credit payloads to have arrived."""
        keep = []
        for count, fut in self.syncs:
            if everyone or self.seen >= count:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((count, fut))
        self.syncs = keep


class ChannelWorker(WorkerBase):
    """The worker that holds one channel's items; one Ray actor per channel.

    Created by ``create_channel``; never instantiate it yourself. It runs as a detached
    Ray actor on the requested node, so it outlives the worker that created it, and it
    exits by itself when the job's rendezvous store goes away (the driver's
    ``Cluster`` shut down or died) or when the channel is destroyed.

    Args:
        spec: The channel's name, identity, bound and job context.
    """

    def __init__(self, spec: ChannelSpec) -> None:
        super().__init__()
        node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        address = channel_address(spec.name)
        self._spec = spec
        self._p2p_runtime = WorkerRuntime(spec.job, address, node_ip)
        self._p2p_info = WorkerInfo(
            address=address,
            rank=0,
            node_id=spec.node_rank,
            gpu_id=None,
            node_ip=node_ip,
            ray_node_id=ray.get_runtime_context().get_node_id(),
            pid=os.getpid(),
        )
        self._queue = ChannelQueue(spec.maxsize)
        self._peers: dict[str, _Peer] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._counts = {"puts": 0, "gets": 0, "failures": 0, "resets": 0, "voids": 0}
        self._stop = threading.Event()
        threading.Thread(
            target=_watch_store, args=(spec.job, self._stop), name="p2p-channel-watch", daemon=True
        ).start()

    # -- links --------------------------------------------------------------------------

    def _peer(self, name: str) -> _Peer:
        peer = self._peers.get(name)
        if peer is None:
            peer = self._peers[name] = _Peer(name)
        return peer

    def _group(self, peer: _Peer) -> Any:
        if peer.group is None:
            me = self.worker_address.get_name()
            peer.group = self.collective.create_collective_group(
                [me, peer.name], group_name=link_group_name(self._spec.uid, peer.name, peer.gen)
            )
        return peer.group

    def _reset(self, peer: _Peer, group: Any, why: BaseException | None) -> None:
        """Drop ``peer``'s link (if ``group`` is still it): close, bump, wake its waiters."""
        if peer.group is not group or group is None:
            return
        if why is not None:
            logger.warning(
                "channel %r: transfer with %s failed (%s: %s); resetting its link",
                self._spec.name,
                peer.name,
                type(why).__name__,
                why,
            )
        peer.group = None
        peer.gen += 1
        peer.seen = 0
        peer.wake(everyone=True)
        self._counts["resets"] += 1
        group.close(timeout=0.0)
        self._queue.reset_peer(peer.name)

    def _when_done(self, work: Any, fn: Any, *args: Any) -> None:
        """Run ``fn(*args, work)`` on the event loop once ``work`` has completed."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        # No task per transfer: the completing thread schedules a plain callback.
        work._add_done_callback(lambda w: loop.call_soon_threadsafe(fn, *args, w))

    # -- control calls (Ray) ------------------------------------------------------------

    async def hello(self, peer_name: str) -> Hello:
        """Open a fresh link to ``peer_name`` and connect both its directions."""
        peer = self._peer(peer_name)
        self._reset(peer, peer.group, None)
        peer.new_handle()
        group = self._group(peer)
        timeout = self._spec.transfer_timeout
        for work in (
            group.send_tensor(torch.empty(0, dtype=torch.uint8), async_op=True, timeout=timeout),
            group.recv_tensor(torch.empty(0, dtype=torch.uint8), async_op=True, timeout=timeout),
        ):
            self._when_done(work, self._finish_hello, peer, group)
        return Hello(
            self._spec.name,
            self._spec.uid,
            self._spec.maxsize,
            self.worker_address.get_name(),
            peer.gen,
            timeout,
        )

    def _finish_hello(self, peer: _Peer, group: Any, work: Any) -> None:
        exc = work.exception(0)
        if exc is not None:
            self._reset(peer, group, exc)

    async def put_begin(
        self, peer_name: str, token: int, block: bool, timeout: float | None, credits: int = 0
    ) -> int:
        """Reserve a slot for the producer's next item and post the receive for it.

        With ``credits`` > 0 it also lends up to that many more free slots (see
        ``ChannelQueue.grant_credits``) and posts one more receive for each: the
        producer's next puts are then plain sends, without a call. The answer's count
        is the number of credits lent.
        """
        peer = self._peer(peer_name)
        tokens = peer.tokens
        if not tokens.start(token):
            return CANCELLED_ANSWER
        try:
            got = await self._queue.reserve(peer_name, block=block, timeout=timeout, token=token)
        finally:
            tokens.finish(token)
        if got is CANCELLED:
            return CANCELLED_ANSWER
        if got is RESET:
            return RESET_ANSWER
        if not got:
            return NO_ROOM
        group = self._group(peer)
        work = group.recv(async_op=True, timeout=self._spec.transfer_timeout)
        self._when_done(work, self._finish_recv, peer, group)
        lent = self._queue.grant_credits(min(credits, self._credit_cap()))
        for _ in range(lent):
            # An idle producer hands its credits back within a fraction of a second, so
            # the transfer timeout bounds a credit's receive like any other.
            work = group.recv(async_op=True, timeout=self._spec.transfer_timeout)
            self._when_done(work, self._finish_credit, peer, group)
        return granted(peer.gen, lent)

    def _credit_cap(self) -> int:
        """Most credits one grant lends: a quarter of the channel, so producers share it."""
        maxsize = self._spec.maxsize
        return MAX_CREDITS if maxsize == 0 else min(MAX_CREDITS, maxsize // 4)

    def _finish_credit(self, peer: _Peer, group: Any, work: Any) -> None:
        exc = work.exception(0)
        if exc is not None:
            self._counts["failures"] += 1
            self._queue.credit_returned()
            self._reset(peer, group, exc)
            return
        obj = work.wait(0)
        if isinstance(obj, Void):
            self._queue.credit_returned()
        else:
            self._counts["puts"] += 1
            self._queue.credit_arrived(_item(obj))
        self._seen(peer, group)

    def _seen(self, peer: _Peer, group: Any) -> None:
        """One more payload of ``peer`` arrived on ``group``: wake the calls waiting for it."""
        if peer.group is group:
            peer.seen += 1
            peer.wake()

    async def _sync(self, peer_name: str | None, gen: int, sent: int) -> None:
        """Wait until the ``sent`` payloads of ``peer_name`` on ``gen`` have arrived.

        A caller's own puts are then visible to its later calls (``qsize``, ``get``).
        """
        peer = self._peers.get(peer_name) if peer_name is not None else None
        if peer is None or peer.gen != gen or peer.seen >= sent:
            return
        fut = asyncio.get_running_loop().create_future()
        peer.syncs.append((sent, fut))
        await asyncio.wait({fut}, timeout=self._spec.transfer_timeout)

    def _finish_recv(self, peer: _Peer, group: Any, work: Any) -> None:
        exc = work.exception(0)
        if exc is not None:
            self._counts["failures"] += 1
            self._queue.arrival_failed()
            self._reset(peer, group, exc)
            return
        obj = work.wait(0)
        if isinstance(obj, Void):
            self._counts["voids"] += 1
            self._queue.arrival_failed()
        else:
            self._counts["puts"] += 1
            self._queue.arrived(_item(obj))
        self._seen(peer, group)

    async def get_begin(
        self,
        peer_name: str,
        token: int,
        max_items: int,
        max_bytes: int | None,
        block: bool,
        timeout: float | None,
        sync: tuple[int, int] = (0, 0),
        key: Any = DEFAULT_KEY,
        target_weight: int | None = None,
        seq: int = -1,
    ) -> int:
        """Take items from the head of ``key``'s FIFO and post their sends.

        Up to ``max_items`` (and ``max_bytes``), or, with ``target_weight``, until their
        weights reach it (see ``ChannelQueue.take``). ``sync`` is the caller's ``(gen,
        payloads sent)``: its own puts are waited for first, so a process always gets
        what it put before. ``seq`` numbers the caller's gets (0, 1, ...): they take
        items and post their sends in that order, whatever order they arrive in.
        """
        peer = self._peer(peer_name)
        taking, posting = peer.taking, peer.posting
        taking.arrive(seq)
        posting.arrive(seq)
        try:
            await self._sync(peer_name, *sync)
            if seq >= 0:
                await taking.turn(seq, "get")
            return await self._get(
                peer, token, seq, max_items, max_bytes, block, timeout, key, target_weight
            )
        finally:
            taking.passed(seq)
            posting.passed(seq)

    async def _get(
        self,
        peer: _Peer,
        token: int,
        seq: int,
        max_items: int,
        max_bytes: int | None,
        block: bool,
        timeout: float | None,
        key: Any,
        target_weight: int | None,
    ) -> int:
        tokens, taking, posting = peer.tokens, peer.taking, peer.posting
        if not tokens.start(token):
            return CANCELLED_ANSWER
        # The take registers its place synchronously, before its first wait: the next
        # get of this peer may go once this one is in line.
        taking.passed(seq)
        try:
            items = await self._queue.take(
                peer.name,
                max_items,
                max_bytes,
                block=block,
                timeout=timeout,
                token=token,
                key=key,
                target_weight=target_weight,
            )
        finally:
            tokens.finish(token)
        if items is CANCELLED:
            return CANCELLED_ANSWER
        if items is RESET:
            return RESET_ANSWER
        if items is None:
            return NO_ROOM
        if seq >= 0:
            await posting.turn(seq, "get")
        group = self._group(peer)
        works = []
        for item in items:
            try:
                works.append(
                    group.send(item.obj, async_op=True, timeout=self._spec.transfer_timeout)
                )
            except Exception as exc:  # the object could not be encoded again: keep it
                self._queue.push_front(items[len(works) :])
                if not works:
                    raise RuntimeError(f"cannot send the head item: {exc}") from exc
                break
        batch = _Sends(items[: len(works)])
        for i, work in enumerate(works):
            self._when_done(work, self._finish_send, peer, group, batch, i)
        return granted(peer.gen, len(works))

    def _finish_send(self, peer: _Peer, group: Any, batch: _Sends, index: int, work: Any) -> None:
        exc = work.exception(0)
        if exc is None:
            self._counts["gets"] += 1
            self._queue.release(1)  # delivered: its slot is free
        else:
            self._counts["failures"] += 1
            batch.failed.append(index)
            self._reset(peer, group, exc)  # fails the rest of the batch at once
        batch.left -= 1
        if not batch.left and batch.failed:  # back to the head, in channel order
            self._queue.push_front([batch.items[i] for i in sorted(batch.failed)])

    async def cancel(self, peer_name: str, token: int) -> bool:
        """Withdraw the peer's call ``token`` if it still waits (or has not arrived yet).

        Returns:
            True when the call will answer ``CANCELLED`` and nothing is put or
            taken; False when it was already granted or answered.
        """
        peer = self._peers.get(peer_name)
        if peer is None:
            return False
        if self._queue.cancel(peer_name, token):
            return True
        return peer.tokens.withdraw_early(token)

    async def reset_link(self, peer_name: str, gen: int) -> None:
        """A peer saw a transfer fail on generation ``gen``: reset its link if still current."""
        peer = self._peers.get(peer_name)
        if peer is not None and peer.gen == gen and peer.group is not None:
            self._reset(peer, peer.group, RuntimeError("the peer reported a failed transfer"))

    async def qsize(
        self, peer_name: str | None = None, sync: tuple[int, int] = (0, 0), key: Any = DEFAULT_KEY
    ) -> int:
        """Items under ``key``, after the caller's puts.

        The default key also counts arriving items (granted, payload on its way, key not
        known yet).
        """
        await self._sync(peer_name, *sync)
        arriving = self._queue.arriving if key == DEFAULT_KEY else 0
        return self._queue.queued_for(key) + arriving

    async def state(
        self, peer_name: str | None = None, sync: tuple[int, int] = (0, 0)
    ) -> dict[str, Any]:
        """Counters of the channel (see ``Channel.stats``), after the caller's puts."""
        await self._sync(peer_name, *sync)
        st = self._queue.state()
        return {
            "name": self._spec.name,
            "maxsize": st.maxsize,
            "held": st.held,
            "queued": st.queued,
            "arriving": st.arriving,
            "waiting_putters": st.waiting_putters,
            "waiting_getters": st.waiting_getters,
            "credits": st.credits,
            "keys": {repr(k): len(q) for k, q in self._queue.queues.items() if q},
            "closed": st.closed,
            "peers": {p.name: p.gen for p in self._peers.values()},
            **self._counts,
        }

    async def destroy(self) -> None:
        """Fail every waiting call, close every link and stop the watchdog."""
        self._queue.close()
        for peer in self._peers.values():
            if peer.group is not None:
                peer.group.close(timeout=0.0)
                peer.group = None
        self._stop.set()


def _item(obj: Any) -> Item:
    """A received object as a queue item (a :class:`Keyed` envelope is opened)."""
    item, key, weight = unwrap(obj)
    return Item(item, payload_nbytes(item), key, weight)


def _watch_store(job: JobContext, stop: threading.Event) -> None:
    """Stop this actor once the job's rendezvous store is gone (the job has ended).

    A plain TCP connect probes the store (a store client would log a C++ trace on
    every failed request); two refusals in a row end the actor.
    """
    misses = 0
    while not stop.wait(WATCH_PERIOD):
        try:
            with socket.create_connection((job.store_host, job.store_port), timeout=5.0):
                misses = 0
        except OSError:
            misses += 1
            if misses >= 2:
                logger.info("channel worker: the job's rendezvous store is gone; stopping")
                _stop_self()
                return


def _stop_self() -> None:
    try:
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)
    except Exception:  # pragma: no cover - Ray already tearing down
        os._exit(0)
