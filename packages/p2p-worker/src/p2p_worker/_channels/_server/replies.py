"""What a channel worker sends on a peer's link: answers, the items of a get, receipts.

Answers run on the channel worker's event loop, receipts in the link's receiving
thread; one lock keeps a receipt from landing between an answer and its items. A send
that fails, at once or later, resets the peer's link (the ``reset`` callback the worker
gives); items that were to leave go back to the head of the channel.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from p2p_asyncwork import AsyncWork
from p2p_collective import CollectiveGroup
from p2p_worker._channels._protocol.payload import Void
from p2p_worker._channels._protocol.proto import RECEIPT, wire_timeout
from p2p_worker._channels._server.peers import Peer
from p2p_worker._channels._server.queue import ChannelQueue, Item

Reset = Callable[[Peer, CollectiveGroup | None, BaseException], None]
"""``reset(peer, group, why)``: drop the peer's link ``group`` after a failed send."""


class Replies:
    """The channel worker's sends to its peers (one per channel worker).

    ``reset`` is called on the event loop (a send refused at once), ``reset_soon`` from
    any thread (a send that failed later; it hands the reset to the loop).
    """

    def __init__(
        self,
        queue: ChannelQueue,
        transfer_timeout: float | None,
        reset: Reset,
        reset_soon: Reset,
    ) -> None:
        self._queue = queue
        self._timeout = wire_timeout(transfer_timeout)
        self._reset = reset
        self._reset_soon = reset_soon
        self._lock = threading.Lock()  # an answer and its items leave together

    def answer(
        self,
        peer: Peer,
        group: CollectiveGroup,
        token: int,
        answer: int | BaseException,
        items: list[Item],
        prefetched: bool = False,
    ) -> None:
        """Send ``(token, answer, count[, objects])`` on the peer's link; the items follow.

        Items without tensors ride in the answer itself (one message); others follow it
        as ``count`` messages on the tensor path. Sent items keep their slots until the
        peer acknowledges them (an ``ACK`` request); if the link fails first they go back
        to the head of the channel (see ``ChannelWorker._reset``), so a consumer that
        dies mid-get loses no item. ``prefetched``: item ``i`` (all without tensors) is
        acknowledged as ``token + i`` (the request reserved those tokens).
        """
        if peer.group is not group:
            if items:
                self._queue.push_front(items)
            return
        timeout = self._timeout
        try:
            with self._lock:
                # eager: a small answer leaves at once from this thread when the link is
                # idle and buffers it (same node), sparing a hand-off to its sending thread.
                if not items:
                    head = group.send(
                        (token, answer, 0), async_op=True, timeout=timeout, eager=True
                    )
                elif all(item.nbytes == 0 for item in items):
                    objs = [item.obj for item in items]
                    if prefetched:
                        peer.unacked.update((token + i, [item]) for i, item in enumerate(items))
                    else:
                        peer.unacked[token] = items
                    head = group.send(
                        (token, answer, 0, objs), async_op=True, timeout=timeout, eager=True
                    )
                else:
                    head = group.send(
                        (token, answer, len(items)), async_op=True, timeout=timeout, eager=True
                    )
                    peer.unacked[token] = items
                    self._send_items(peer, group, token, items)
        except Exception as exc:  # the link is closed or broken
            if items and token not in peer.unacked:
                self._queue.push_front(items)
            self._reset(peer, group, exc)
            return
        self._watch(head, peer, group)

    def _send_items(
        self, peer: Peer, group: CollectiveGroup, token: int, items: list[Item]
    ) -> None:
        """Send the items announced by an answer, in order.

        An item that cannot be encoded again goes back to the head, a :class:`Void`
        taking its place on the wire (the peer expects as many objects as announced).
        """
        timeout = self._timeout
        for i, item in enumerate(items):
            try:
                work = group.send(item.obj, async_op=True, timeout=timeout)
            except Exception:
                rest = items[i:]
                peer.unacked[token] = items[:i]
                self._queue.push_front(rest)
                for _ in rest:
                    group.send(Void(), async_op=True, timeout=timeout)
                return
            self._watch(work, peer, group)

    def receipt(self, peer: Peer, group: CollectiveGroup, arrived: int) -> None:
        """Tell ``peer`` that ``arrived`` of its payloads on ``group`` are in: ``(RECEIPT, n, 0)``.

        Called by the link's receiving thread once it handed payload ``arrived`` to the
        loop. A put whose payload travels on its own completes only with this receipt,
        so a put that returned has its item in the channel for every later call of any
        process.
        """
        if peer.group is not group:
            return  # reset meanwhile: the peer asks what arrived (ChannelWorker.arrived)
        try:
            with self._lock:
                sent = group.send(
                    (RECEIPT, arrived, 0), async_op=True, timeout=self._timeout, eager=True
                )
        except Exception as exc:  # the link is closed or broken
            self._reset_soon(peer, group, exc)
            return
        self._watch(sent, peer, group)

    def _watch(self, work: AsyncWork[object], peer: Peer, group: CollectiveGroup) -> None:
        """Reset ``peer``'s link ``group`` if the send ``work`` fails (no wake-up on success)."""
        work.add_done_callback(lambda w: self._failed(w, peer, group))

    def _failed(self, work: AsyncWork[object], peer: Peer, group: CollectiveGroup) -> None:
        exc = work.exception(0)
        if exc is not None:
            self._reset_soon(peer, group, exc)
