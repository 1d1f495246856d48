"""Items a blocking ``get()`` took ahead of its caller: the consumer's prefetch buffer.

A blocking ``Channel.get()`` made while no other get of its process is in flight asks
for up to :data:`~p2p_worker._channels._protocol.proto.PREFETCH` items. When the channel worker can
answer at once, no other get of that key waits, and the head items have no tensors, it
sends several in one answer; the caller gets the first, the others wait here and the
process's next gets of that key return them without a round trip. The channel worker
prefetches for a process only when no other process got from the channel lately
(:class:`~p2p_worker._channels._server.sole.SoleConsumer`), so with several consumers items leave
one per get, in channel order, as before.

Each prefetched item is acknowledged on its own when a get hands it out (the request
reserved one token per item), so the channel's guarantees hold item by item: an item
keeps its slot until it is handed out (``maxsize`` bounds memory); a consumer that dies
holding prefetched items has them sent to the next consumer, in order; a reset link
reports them as arrived, and they are still handed out here. Unused items go back to the
head of the channel after :data:`PREFETCH_LINGER` seconds without a get, when the handle
closes, and before a by-weight ``get_batch`` (which then takes them in order).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from contextlib import AbstractContextManager

from p2p_collective import CollectiveGroup
from p2p_worker._channels._client.linger import Linger

PREFETCH_LINGER = 0.05  # seconds without a get after which unused prefetched items go back

Entry = tuple[Hashable, int, CollectiveGroup | None, object]
"""A prefetched item: ``(key, token, group it came over, item)``."""


class Prefetched:
    """A process's prefetched items, oldest first (guarded by the link's lock, ``lock``).

    ``give_back`` (called holding ``lock``) sends the unused ones back once no get took
    one for :data:`PREFETCH_LINGER` seconds.

    Example:
        >>> import threading
        >>> buffer = Prefetched(threading.RLock(), lambda: None)
        >>> buffer.add("k", "g", 7, ["a", "b"])
        >>> [(t, item) for t, _, item in buffer.take("k", 1)], len(buffer)
        ([(8, 'a')], 1)
        >>> buffer.drain("g"), len(buffer)
        ([9], 0)
        >>> buffer.stop()
    """

    __slots__ = ("_linger", "entries")

    def __init__(self, lock: AbstractContextManager[object], give_back: Callable[[], None]) -> None:
        self.entries: deque[Entry] = deque()
        # touched when a get adds or takes items
        self._linger = Linger(
            lambda: PREFETCH_LINGER, lambda: lock, lambda: bool(self.entries), give_back
        )

    def __len__(self) -> int:
        return len(self.entries)

    def add(
        self, key: Hashable, group: CollectiveGroup | None, token: int, items: list[object]
    ) -> None:
        """The items after the first of get ``token``'s answer: tokens ``token + 1`` on."""
        self.entries.extend((key, token + i, group, item) for i, item in enumerate(items, 1))
        self._linger.touch()

    def take(self, key: Hashable, most: int) -> list[tuple[int, CollectiveGroup | None, object]]:
        """Remove up to ``most`` of ``key``'s oldest items: ``(token, group, item)`` each."""
        taken: list[tuple[int, CollectiveGroup | None, object]] = []
        kept: deque[Entry] = deque()
        for entry in self.entries:
            if entry[0] == key and len(taken) < most:
                taken.append((entry[1], entry[2], entry[3]))
            else:
                kept.append(entry)
        self.entries = kept
        self._linger.touch(arm=False)
        return taken

    def drain(self, group: CollectiveGroup) -> list[int]:
        """Remove the items that came over ``group`` (the live link); their tokens.

        Items of an earlier, reset link stay: that link's report counted them as
        delivered, so they can only be handed out here.
        """
        tokens = [entry[1] for entry in self.entries if entry[2] is group]
        self.entries = deque(entry for entry in self.entries if entry[2] is not group)
        return tokens

    def stop(self) -> None:
        """Stop the timer (the handle closes)."""
        self._linger.stop()
