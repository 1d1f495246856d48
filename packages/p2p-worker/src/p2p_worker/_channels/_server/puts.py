"""How a channel worker takes puts in: slots, credits, and the payloads that fill them.

:class:`ChannelPuts` is a part of :class:`~p2p_worker._channels._server.server.ChannelWorker`.
A put request waits (FIFO) for a free slot, takes it and posts a receive on the link for
the payload; its answer grants the slot, and the producer then sends its item. A small
item without tensors may ride inside its request instead (``PUT_INLINE``): granted, it is
queued at once. A grant may also lend *credits*: further free slots, each with a receive
posted ahead, so the producer's next puts are plain sends without a request.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from p2p_asyncwork import AsyncWork
from p2p_collective import CollectiveGroup
from p2p_worker._channels._protocol.payload import Void
from p2p_worker._channels._protocol.proto import (
    CANCELLED_ANSWER,
    NO_ROOM,
    RESET_ANSWER,
    ChannelSpec,
    granted,
    wire_timeout,
)
from p2p_worker._channels._server.peers import Peer
from p2p_worker._channels._server.queue import (
    WAITER_CANCELLED,
    WAITER_RESET,
    ChannelQueue,
    item_of,
)
from p2p_worker._channels._server.replies import Replies
from p2p_worker._process._untraced import untraced_internals

MAX_CREDITS = 8  # most put credits one grant lends


@untraced_internals
class ChannelPuts:
    """The channel worker's put side (a mixin of ``ChannelWorker``)."""

    _queue: ChannelQueue
    _spec: ChannelSpec
    _counts: dict[str, int]
    _replies: Replies

    if TYPE_CHECKING:  # ChannelWorker's own

        def _reset(
            self, peer: Peer, group: CollectiveGroup, why: BaseException | None, hold: bool = True
        ) -> None: ...

        def _event_loop(self) -> asyncio.AbstractEventLoop: ...

        def _peer(self, name: str) -> Peer: ...

        def _group(self, peer: Peer) -> CollectiveGroup: ...

    async def put_begin(
        self, peer_name: str, token: int, block: bool, timeout: float | None, credits: int = 0
    ) -> int:
        """Reserve a slot for the producer's next item and post the receive for it.

        With ``credits`` > 0 it also lends up to that many more free slots (see
        ``ChannelQueue.grant_credits``) and posts one more receive for each: the
        producer's next puts are then plain sends, without a call. The answer's count
        is the number of credits lent.
        """
        return await self._put(self._peer(peer_name), token, block, timeout, credits)

    async def _put(
        self,
        peer: Peer,
        token: int,
        block: bool,
        timeout: float | None,
        credits: int,
        expect: CollectiveGroup | None = None,
        queued: asyncio.Future[None] | None = None,
        *inline: object,
    ) -> int:
        """Reserve a slot (and lend credits) for ``peer``; post the receives; the answer.

        With ``expect`` (a request over the control group) the grant holds only while
        ``expect`` is still the peer's link; else the slot is given back (RESET_ANSWER).
        ``inline`` is ``(obj,)`` for an item that rode in its request: granted, it is
        queued at once and no payload receive is posted.
        """
        tokens = peer.tokens
        if not tokens.start(token):
            return CANCELLED_ANSWER
        try:
            reserving = self._queue.reserve(peer.name, block=block, timeout=timeout, token=token)
            if queued is not None:
                queued.set_result(None)  # reserve() takes its place before it first waits
            got = await reserving
        finally:
            tokens.finish(token)
        if got is WAITER_CANCELLED:
            return CANCELLED_ANSWER
        if got is WAITER_RESET:
            return RESET_ANSWER
        if not got:
            return NO_ROOM
        if expect is not None and peer.group is not expect:
            self._queue.arrival_failed()
            return RESET_ANSWER
        return self._granted_put(peer, credits, *inline)

    def _granted_put(self, peer: Peer, credits: int, *inline: object) -> int:
        """A put of ``peer`` holds its slot: post the receives (and lend credits); the answer.

        ``inline`` (``(obj,)``): the item came with the request; it is queued now.
        """
        group = self._group(peer)
        if inline:
            self._counts["puts"] += 1
            self._counts["inline"] += 1
            self._queue.arrived(item_of(inline[0]))
        else:
            self._expect_payload(peer, group, False)
        lent = self._queue.grant_credits(min(credits, self._credit_cap()))
        for _ in range(lent):
            # An idle producer hands its credits back within a fraction of a second, so
            # the transfer timeout bounds a credit's payload like any other.
            self._expect_payload(peer, group, True)
        return granted(peer.gen, lent)

    def _credit_cap(self) -> int:
        """Most credits one grant lends: a quarter of the channel, so producers share it."""
        maxsize = self._spec.maxsize
        return MAX_CREDITS if maxsize == 0 else min(MAX_CREDITS, maxsize // 4)

    def _expect_payload(self, peer: Peer, group: CollectiveGroup, credit: bool) -> None:
        """One more payload of ``peer`` is due on ``group`` (a granted put's or a credit's).

        The link's :class:`PayloadReader` takes it from the event loop; without one (a
        gloo link) a receive is posted for it.
        """
        peer.payloads.post(peer.gen)
        reader = peer.payload_reader
        if reader is not None:
            reader.expect(credit)
        else:
            self._post_payload_recv(peer, group, credit)

    def _post_payload_recv(self, peer: Peer, group: CollectiveGroup, credit: bool) -> None:
        """Post the receive of one expected payload on ``peer``'s link ``group``.

        The receiving thread hands the payload to the loop (:meth:`_payload_in`) and
        then, at once, sends the peer its receipt (``Replies.receipt``), sparing the put
        a turn of the loop: the item is queued before any request that follows the
        receipt, since the loop runs what threads hand it in the order they did.
        """
        gen, loop = peer.gen, self._event_loop()
        if peer.receipts[0] is not group:
            peer.receipts = (group, [0])  # payloads received on this link, counted there
        count = peer.receipts[1]

        def received(w: AsyncWork[object]) -> None:
            exc = w.exception(0)
            obj = None if exc is not None else w.wait(0)
            loop.call_soon_threadsafe(self._payload_in, peer, group, gen, credit, obj, exc)
            if exc is None:
                count[0] += 1  # only this thread (the link's receiving one) counts
                self._replies.receipt(peer, group, count[0])

        timeout = wire_timeout(self._spec.transfer_timeout)
        group.recv(async_op=True, timeout=timeout).add_done_callback(received)

    def _payload_in(
        self,
        peer: Peer,
        group: CollectiveGroup,
        gen: int,
        credit: bool,
        obj: object,
        exc: BaseException | None,
        receipt: bool = False,
    ) -> None:
        """A payload of ``peer``'s link ``gen`` came (``obj``) or failed: queue or free.

        ``credit``: it was due for a lent credit, else for a granted put. ``receipt``:
        send the peer its receipt from here (the payload was read on the loop).
        """
        peer.payloads.done(gen, exc is None)
        queue = self._queue
        if exc is None and not isinstance(obj, Void):
            self._counts["puts"] += 1
            (queue.credit_arrived if credit else queue.arrived)(item_of(obj))
        else:  # nothing came in the slot: the transfer failed, or a Void filled it
            if exc is not None:
                self._counts["failures"] += 1
            elif not credit:  # a credit handed back is no news; an abandoned put is
                self._counts["voids"] += 1
            (queue.credit_returned if credit else queue.arrival_failed)()
        if exc is not None:
            self._reset(peer, group, exc)
            return
        if receipt and peer.group is group:
            self._replies.receipt(peer, group, peer.count_receipt(group))
        self._seen(peer, group)

    def _seen(self, peer: Peer, group: CollectiveGroup) -> None:
        """One more payload of ``peer`` arrived on ``group``: wake the calls waiting for it."""
        if peer.group is group:
            peer.wake()
