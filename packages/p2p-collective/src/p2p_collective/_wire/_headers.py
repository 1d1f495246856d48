"""Header receives: the receive side keeps the next headers' receives posted ahead.

Every operation's first message is a header of at most ``HEADER_MAX`` bytes. Over gloo,
header messages travel under their own tag (:data:`~p2p_collective._links._gloo_link.HEADER_TAG`)
and payload messages under another, and gloo matches each tag's receives in the order
they were posted. So header receives can be posted ahead of any number of frames
without ever catching a payload.

gloo moves a message only into a posted receive; a send that finds none first trades
"ready to send" / "ready to receive" notifications with the receiver (a round trip per
message), and a synchronous send to a receiver that is busy elsewhere waits for it.
Posting costs the caller 5-15 us (it writes the "ready" notification to the socket),
and posted the moment a frame is in, that cost would sit between the arrival of a
request and the reply to it.

:class:`HeaderReceiver` therefore keeps :data:`DEPTH` = 2 header receives posted and tops
them up at the *start* of each receive, before it waits: after a frame is in, the next
header's receive is still posted (a small send to a busy receiver completes at once,
and two peers that both send before they receive do not wait for each other), and
the top-up happens while the peer is still working on what this side sent last (off
the path of a request/reply exchange). In a stream of frames the sender never waits
for a header's notification.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import torch

from p2p_collective._frames._framing import HEADER_MAX, NO_MAGIC
from p2p_collective._frames._recvpool import PostedRecv

if TYPE_CHECKING:
    from p2p_collective._links._link import Link

DEPTH = 2
"""Header receives a direction keeps posted from its first receive on."""


class HeaderReceiver:
    """The header receives of one direction: :data:`DEPTH` buffers, all posted ahead.

    Used by the direction's operations only, which run one at a time.
    """

    def __init__(self) -> None:
        # Allocated at the first receive: a group's sending side never needs them.
        self._bufs: tuple[torch.Tensor, ...] = ()
        self._views: tuple[memoryview, ...] = ()
        self._posted: deque[tuple[int, PostedRecv]] = deque()  # (buffer, receive), oldest first
        self._free: deque[int] = deque()  # buffers neither posted nor held by an operation
        self._taken: int | None = None  # the buffer the last receive returned

    def receive(self, link: Link, deadline: float | None) -> tuple[torch.Tensor, memoryview]:
        """Top the posted header receives up, take the oldest; return its buffer and view.

        The buffer is not reused before the next :meth:`receive`, so it stays valid for
        the rest of the operation that took it.
        """
        if not self._bufs:
            self._bufs = tuple(torch.zeros(HEADER_MAX, dtype=torch.uint8) for _ in range(DEPTH))
            self._views = tuple(b.numpy().data for b in self._bufs)
            self._free.extend(range(DEPTH))
        if self._taken is not None:  # the operation that held it is over
            self._free.append(self._taken)
        queue, free = self._posted, self._free
        while free:
            i = free.popleft()
            self._views[i][:4] = NO_MAGIC
            queue.append((i, link.post_recv(self._bufs[i])))
        i, posted = queue.popleft()
        self._taken = i
        link.wait_recv(posted, deadline)
        return self._bufs[i], self._views[i]

    @property
    def posted(self) -> int:
        """How many header receives are posted now."""
        return len(self._posted)

    def discard(self) -> None:
        """Forget the posted receives (the link is closing; gloo drops them with it)."""
        self._posted.clear()
