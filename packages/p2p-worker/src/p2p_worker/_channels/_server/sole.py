"""Whether a process is the channel's only consumer lately: who may be sent items ahead.

The channel worker's half of prefetching (the consumer's half is
:mod:`p2p_worker._channels._client.prefetch`): a blocking ``get()`` may take up to
:data:`~p2p_worker._channels._protocol.proto.PREFETCH` items at once only when no other
process got from the channel in the last :data:`SOLE_FOR` seconds, so with several
consumers items leave one per get, in channel order.
"""

from __future__ import annotations

import time

SOLE_FOR = 5.0  # seconds since another process's last get before a process may prefetch


class SoleConsumer:
    """Whether a process is the channel's only consumer lately (the channel worker's view).

    Keeps the process that got last, and when any other process last got.

    Example:
        >>> sole = SoleConsumer()
        >>> sole.saw("a"), sole.saw("a"), sole.saw("b"), sole.saw("a")
        (True, True, False, False)
    """

    __slots__ = ("last", "last_at", "other_at")

    def __init__(self) -> None:
        self.last: str | None = None  # the process that got last
        self.last_at = 0.0
        self.other_at = float("-inf")  # the last get of any other process

    def saw(self, name: str) -> bool:
        """A get of ``name`` arrived: whether no other process got for :data:`SOLE_FOR` s."""
        now = time.monotonic()
        if name != self.last:
            if self.last is not None:
                self.other_at = self.last_at
            self.last = name
        self.last_at = now
        return now - self.other_at >= SOLE_FOR
