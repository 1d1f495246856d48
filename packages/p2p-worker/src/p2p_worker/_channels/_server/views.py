"""What a channel worker answers about its contents: sizes, counters and the queued items.

:class:`ChannelViews` is a part of :class:`~p2p_worker._channels._server.server.ChannelWorker`:
its Ray methods (``qsize``, ``state``, ``peek_all``) first wait for the caller's own puts
(``sync``), so a process always sees what it put itself.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from p2p_worker._channels._protocol.keys import DEFAULT_KEY
from p2p_worker._channels._protocol.proto import ChannelStats
from p2p_worker._process._untraced import untraced_internals

if TYPE_CHECKING:
    from p2p_worker._channels._protocol.proto import ChannelSpec
    from p2p_worker._channels._server.peers import Peer
    from p2p_worker._channels._server.queue import ChannelQueue


@untraced_internals
class ChannelViews:
    """The channel worker's read-only Ray methods (a mixin of ``ChannelWorker``)."""

    _queue: ChannelQueue
    _spec: ChannelSpec
    _peers: dict[str, Peer]
    _counts: dict[str, int]

    async def _sync(self, peer_name: str | None, gen: int, sent: int) -> None:
        raise NotImplementedError  # ChannelWorker's

    async def qsize(
        self,
        peer_name: str | None = None,
        sync: tuple[int, int] = (0, 0),
        key: Hashable = DEFAULT_KEY,
    ) -> int:
        """Items under ``key``, after the caller's puts.

        The default key also counts arriving items (granted, payload on its way, key not
        known yet).
        """
        await self._sync(peer_name, *sync)
        return self._count(key)

    def _count(self, key: Hashable) -> int:
        """Items under ``key``; the default key also counts arriving items (key unknown yet)."""
        arriving = self._queue.arriving if key == DEFAULT_KEY else 0
        return self._queue.queued_for(key) + arriving

    async def peek_all(
        self,
        peer_name: str | None = None,
        sync: tuple[int, int] = (0, 0),
        key: Hashable = DEFAULT_KEY,
    ) -> list[object]:
        """The items queued under ``key``, oldest first, left in place (after the caller's puts).

        Items a consumer holds (sent, not acknowledged yet, or taken ahead) are not
        listed: they left the queue.
        """
        await self._sync(peer_name, *sync)
        queue = self._queue.queues.get(key)
        return [item.obj for item in queue] if queue else []

    async def state(
        self, peer_name: str | None = None, sync: tuple[int, int] = (0, 0)
    ) -> ChannelStats:
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
            "puts": self._counts["puts"],
            "gets": self._counts["gets"],
            "failures": self._counts["failures"],
            "resets": self._counts["resets"],
            "voids": self._counts["voids"],
            "inline": self._counts["inline"],
            "prefetched": self._counts["prefetched"],
        }
