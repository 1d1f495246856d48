"""How a channel worker serves a peer's requests, read in order from its control group.

:class:`ChannelRequests` is a part of :class:`~p2p_worker._channels._server.server.ChannelWorker`.
Each request takes its place among the channel's waiters in the order the peer issued
it, so a consumer's gets are served in the order it made them. A request that completes
at once (room for a put, items for a get) while none of the peer's earlier requests
waits is answered at once, without a task; acknowledgements and give-backs free or
return the slots of items sent to the peer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Hashable
from typing import TYPE_CHECKING, cast

from p2p_asyncwork import AsyncWork
from p2p_collective import CollectiveGroup
from p2p_worker._channels._protocol.proto import (
    ACK,
    ACKED,
    CANCELLED_ANSWER,
    GET,
    GIVE_BACK,
    NO_ROOM,
    PREFETCH,
    PUT,
    PUT_INLINE,
    QSIZE,
    RESET_ANSWER,
    ChannelSpec,
    granted,
)
from p2p_worker._channels._server.peers import Peer
from p2p_worker._channels._server.queue import (
    WAITER_CANCELLED,
    WAITER_RESET,
    ChannelQueue,
    Item,
)
from p2p_worker._channels._server.readers import RequestReader
from p2p_worker._channels._server.replies import Replies
from p2p_worker._channels._server.sole import SoleConsumer
from p2p_worker._process._untraced import untraced_internals

if TYPE_CHECKING:
    from p2p_worker._channels._protocol.proto import Request, Served

logger = logging.getLogger(__name__)


@untraced_internals
class ChannelRequests:
    """The channel worker's request serving (a mixin of ``ChannelWorker``)."""

    _queue: ChannelQueue
    _spec: ChannelSpec
    _counts: dict[str, int]
    _replies: Replies
    _sole: SoleConsumer
    _serving: set[asyncio.Future[None]]

    if TYPE_CHECKING:  # ChannelWorker's own

        def _reset(
            self, peer: Peer, group: CollectiveGroup, why: BaseException | None, hold: bool = True
        ) -> None: ...

        def _event_loop(self) -> asyncio.AbstractEventLoop: ...

        async def _sync(self, peer_name: str | None, gen: int, sent: int) -> None: ...

        def _count(self, key: Hashable) -> int: ...  # ChannelViews'

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
        ) -> int: ...  # ChannelPuts'

        def _granted_put(
            self, peer: Peer, credits: int, *inline: object
        ) -> int: ...  # ChannelPuts'

    def _control_open(
        self, peer: Peer, group: CollectiveGroup, ctl: CollectiveGroup, work: AsyncWork[object]
    ) -> None:
        """The peer's control group is connected: keep one receive posted on it."""
        exc = work.exception(0)
        if exc is not None:
            self._reset(peer, group, exc)
        elif peer.ctl is ctl:
            peer.reader = RequestReader(
                self._event_loop(),
                ctl,
                lambda request: self._on_request(peer, group, ctl, cast("Request", request)),
                lambda exc: self._request_failed(peer, group, ctl, exc),
            )
            peer.reader.start()

    def _request_failed(
        self, peer: Peer, group: CollectiveGroup, ctl: CollectiveGroup, exc: BaseException
    ) -> None:
        """The peer closed its handle, died or went away: its waiting requests end."""
        if peer.ctl is ctl:
            logger.debug("channel %r: %s left (%s)", self._spec.name, peer.name, exc)
            # it acknowledged what it took before it closed
            self._reset(peer, group, None, hold=False)

    def _on_request(
        self, peer: Peer, group: CollectiveGroup, ctl: CollectiveGroup, request: Request
    ) -> None:
        """One request of ``peer`` arrived (in the order it sent them): serve it in turn."""
        if peer.ctl is not ctl:
            return  # a reset dropped this control group; its requests answer nothing
        if request[0] == ACK:  # the peer has the items of its gets ``tokens``: free their slots
            self._acked(peer, request[1:])
            return
        if request[0] == ACKED:  # acknowledgements riding on a request
            self._acked(peer, request[1])
            request = request[2]
        if request[0] == GIVE_BACK:  # prefetched items the peer did not use
            self._given_back(peer, request[1:])
            return
        if request[0] == GET:  # the tokens it reserved; a prefetch only for a sole consumer
            peer.tokens.skip(request[1] + 1, request[9] - 1)
            if request[9] and not self._sole.saw(peer.name):
                request = (*request[:9], 0)
        if (peer.gate is None or peer.gate.done()) and self._try_now(peer, group, request):
            return
        gate, peer.gate = peer.gate, asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(self._serve(peer, group, request, gate, peer.gate))
        self._serving.add(task)
        task.add_done_callback(self._serving.discard)

    def _acked(self, peer: Peer, tokens: tuple[int, ...]) -> None:
        """The peer has the items of its gets ``tokens``: free their slots."""
        for token in tokens:
            items = peer.unacked.pop(token, None)
            if items:
                self._counts["gets"] += len(items)
                self._queue.release(len(items))

    def _given_back(self, peer: Peer, tokens: tuple[int, ...]) -> None:
        """Prefetched items of ``tokens`` come back unused: to the head, in their order."""
        back = [item for token in sorted(tokens) for item in peer.unacked.pop(token, [])]
        if back:
            self._queue.push_front(back)

    def _try_now(self, peer: Peer, group: CollectiveGroup, request: Served) -> bool:
        try:
            return self._serve_now(peer, group, request)
        except Exception:  # a bad request (say, an unhashable key): the task answers it
            return False

    def _serve_now(self, peer: Peer, group: CollectiveGroup, request: Served) -> bool:
        """Serve a request that completes at once, without a task; False if it must wait.

        Only called when none of the peer's earlier requests still waits for its place,
        so answering now keeps the peer's issue order. A put with room, a get whose key
        holds items (no getter ahead) and a ``qsize`` whose sync holds are answered from
        here; anything else (and any error) goes the task's way (:meth:`_serve`).
        """
        token = request[1]
        queue = self._queue
        if queue.closed or token in peer.tokens.cancelled:
            return False
        if request[0] == PUT or request[0] == PUT_INLINE:
            credits = request[4]
            inline = request[6:]  # (obj,) of an item riding in its request
            if request[0] == PUT_INLINE and not self._synced(peer, *request[5]):
                return False  # the peer's earlier payloads first (FIFO per producer)
            if not queue.try_reserve():
                return False
            peer.tokens.start(token)
            peer.tokens.finish(token)
            answer = self._granted_put(peer, credits, *inline)
            self._replies.answer(peer, group, token, answer, [])
            return True
        if request[0] == QSIZE:
            _, _, sync, key = request
            if not self._synced(peer, *sync):
                return False
            peer.tokens.start(token)
            peer.tokens.finish(token)
            self._replies.answer(peer, group, token, self._count(key), [])
            return True
        _, _, max_items, max_bytes, _, _, sync, key, target_weight, prefetch = request
        if target_weight is not None or not self._synced(peer, *sync):
            return False
        got = queue.try_take(key, max_items, max_bytes)
        if got is None:
            return False
        if prefetch > 1 and len(got) == 1 and got[0].nbytes == 0:  # see proto.PREFETCH
            got += queue.take_small(key, min(prefetch, PREFETCH) - 1)
            self._counts["prefetched"] += len(got) - 1
        peer.tokens.start(token)
        peer.tokens.finish(token)
        self._replies.answer(peer, group, token, granted(peer.gen, len(got)), got, prefetch > 1)
        return True

    def _synced(self, peer: Peer, gen: int, sent: int) -> bool:
        """Whether ``_sync`` would not wait: the peer's ``sent`` payloads are in."""
        return peer.gen != gen or peer.seen >= sent

    async def _serve(
        self,
        peer: Peer,
        group: CollectiveGroup,
        request: Served,
        gate: asyncio.Future[None] | None,
        queued: asyncio.Future[None],
    ) -> None:
        """Serve one request; answer it on the peer's link (a get's items follow).

        Requests of one peer queue up (take their place among the waiters) in the order
        the peer issued them: each waits for ``gate``, its predecessor's ``queued``.
        """
        token = request[1]
        try:
            if gate is not None and not gate.done():
                await gate
            if request[0] == PUT or request[0] == PUT_INLINE:
                inline: tuple[object, ...] = ()
                if request[0] == PUT_INLINE:  # the peer's earlier payloads enter first (FIFO)
                    await self._sync(peer.name, *request[5])
                    inline = (request[6],)
                _, _, block, timeout, credits = request[:5]
                answer: int | BaseException = await self._put(
                    peer, token, block, timeout, credits, group, queued, *inline
                )
                self._replies.answer(peer, group, token, answer, [])
                return
            if request[0] == QSIZE:
                _, _, sync, key = request
                queued.set_result(None)
                peer.tokens.start(token)  # never withdrawn: numbered like every request
                try:
                    await self._sync(peer.name, *sync)
                finally:
                    peer.tokens.finish(token)
                self._replies.answer(peer, group, token, self._count(key), [])
                return
            _, _, max_items, max_bytes, block, timeout, sync, key, target_weight, _ = request
            await self._sync(peer.name, *sync)
            got = await self._take(
                peer, token, max_items, max_bytes, block, timeout, key, target_weight, queued
            )
            if isinstance(got, list):
                if peer.group is not group:  # reset meanwhile: the items stay
                    self._queue.push_front(got)
                    return
                self._replies.answer(peer, group, token, granted(peer.gen, len(got)), got)
            else:
                self._replies.answer(peer, group, token, got, [])
        except Exception as exc:  # ChannelClosedError (destroyed), a bad request
            self._replies.answer(peer, group, token, exc, [])
        finally:
            if not queued.done():
                queued.set_result(None)

    async def _take(
        self,
        peer: Peer,
        token: int,
        max_items: int,
        max_bytes: int | None,
        block: bool,
        timeout: float | None,
        key: Hashable,
        target_weight: int | None,
        queued: asyncio.Future[None] | None = None,
    ) -> list[Item] | int:
        """Take items for ``peer`` (see ``ChannelQueue.take``); the items or a no-grant answer."""
        tokens = peer.tokens
        if not tokens.start(token):
            return CANCELLED_ANSWER
        try:
            taking = self._queue.take(
                peer.name,
                max_items,
                max_bytes,
                block=block,
                timeout=timeout,
                token=token,
                key=key,
                target_weight=target_weight,
            )
            if queued is not None:
                queued.set_result(None)  # take() takes its place before it first waits
            items = await taking
        finally:
            tokens.finish(token)
        if items is WAITER_CANCELLED:
            return CANCELLED_ANSWER
        if items is WAITER_RESET:
            return RESET_ANSWER
        if items is None:
            return NO_ROOM
        return list(cast("list[Item]", items))  # the signals and None are answered above
