"""What a channel worker keeps per peer: its link, its call tokens, its unacknowledged items."""

from __future__ import annotations

import asyncio

from p2p_collective import CollectiveGroup
from p2p_worker._channels._server.queue import Item
from p2p_worker._channels._server.readers import PayloadReader, RequestReader


class Tokens:
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

    def skip(self, first: int, count: int) -> None:
        """Tokens ``first .. first + count - 1`` name no call (a prefetching get reserved them)."""
        for token in range(first, first + count):
            self.finish(token)

    def withdraw_early(self, token: int) -> bool:
        """Withdraw a call that has not arrived yet; False if it ran or runs."""
        if token < self.low or token in self.done or token in self.active:
            return False
        self.cancelled.add(token)
        return True


class Payloads:
    """The payload receives a channel worker posted for one peer, per link generation.

    A payload (a put's item, or a ``Void`` in a slot's place) counts as arrived once the
    channel worker has it, even when its link was reset meanwhile: the item is in the
    channel then. A peer whose link failed with puts not yet confirmed asks how many of
    that generation's payloads arrived (``ChannelWorker.arrived``): the answer is final
    once no receive of that generation is still posted.
    """

    __slots__ = ("counts", "known_from")

    KEEP = 4  # link generations remembered (the current one and a few ended ones)

    def __init__(self) -> None:
        self.counts: dict[int, list[int]] = {}  # gen -> [arrived, receives still posted]
        self.known_from = 0  # older generations are forgotten

    def post(self, gen: int) -> None:
        self.counts.setdefault(gen, [0, 0])[1] += 1

    def done(self, gen: int, arrived: bool) -> None:
        count = self.counts.get(gen)
        if count is not None:
            count[0] += arrived
            count[1] -= 1

    def arrived(self, gen: int) -> int:
        """Payloads of generation ``gen`` received so far."""
        count = self.counts.get(gen)
        return 0 if count is None else count[0]

    def final(self, gen: int) -> int | None:
        """Payloads of the ended generation ``gen``; None while a receive is still posted."""
        count = self.counts.get(gen, [0, 0])
        return count[0] if count[1] <= 0 else None

    def forget_before(self, gen: int) -> None:
        """Drop the counts of generations older than the last :data:`KEEP` up to ``gen``."""
        self.known_from = max(self.known_from, gen - self.KEEP + 1)
        for old in [g for g in self.counts if g < self.known_from]:
            del self.counts[old]


class Peer:
    """One peer of a channel worker: its groups, generation, tokens and items in flight."""

    __slots__ = (
        "ctl",
        "gate",
        "gen",
        "group",
        "held",
        "name",
        "payload_reader",
        "payloads",
        "reader",
        "receipts",
        "syncs",
        "tokens",
        "unacked",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.gen = 0
        self.group: CollectiveGroup | None = (
            None  # the link: payloads in, answers (and got items) out
        )
        self.ctl: CollectiveGroup | None = (
            None  # the control group: the peer's requests, in issue order
        )
        self.reader: RequestReader | None = None  # takes them off ``ctl`` for the loop
        self.payload_reader: PayloadReader | None = None  # put payloads off ``group``
        self.gate: asyncio.Future[None] | None = None  # set once the last request queued up
        self.unacked: dict[int, list[Item]] = {}  # token -> items sent, not acknowledged yet
        # gen -> the unacknowledged items of a link reset while the peer lived: they wait
        # for the peer's report of what arrived (see ChannelWorker._settle)
        self.held: dict[int, dict[int, list[Item]]] = {}
        self.tokens = Tokens()
        self.payloads = Payloads()
        # (link, [payloads received on it]): counted where they are read (the loop, or
        # the link's receiving thread), which sends the receipts (ChannelWorker._payload_in)
        self.receipts: tuple[CollectiveGroup | None, list[int]] = (None, [0])
        self.syncs: list[tuple[int, asyncio.Future[None]]] = []  # (count, woken at count)

    def count_receipt(self, group: CollectiveGroup) -> int:
        """One more payload arrived on ``group``, read on the loop: how many so far."""
        if self.receipts[0] is not group:
            self.receipts = (group, [0])
        count = self.receipts[1]
        count[0] += 1
        return count[0]

    @property
    def seen(self) -> int:
        """Payloads (items or voids) received from the peer on the current link."""
        return self.payloads.arrived(self.gen)

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
