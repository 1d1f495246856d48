"""Who receives a link's answers: the blocking call waiting for one, or a posted read.

Each request a process sends is answered on its link, in the order the channel worker
completes them. A receive posted on the link runs in the link's receiving thread, which
hands each answer to the thread that waits for it. For a blocking ``put``/``get`` of a
small item that hand-off is the dearest step on a busy machine: the woken caller and
the receiving thread take turns on the GIL (measured with 4 producer/consumer pairs on
2 cores: about one context switch per item in each producer and consumer, see
``benchmarks/cpu_per_item.py``). So a blocking call without a timeout that finds nobody
receiving receives the answers itself, in its own thread, until its own answer is in;
answers of this process's other operations that come first are handed to them. Then, if
answers are still due, a read is posted for them.

An idle link keeps a read posted only where a reset must be seen at once: while it holds
prefetched items (the report of a reset link keeps them its own), and once the ack
flusher has sent acknowledgements on their own (the channel worker then learns which
items arrived). Otherwise the next operation sees a reset (its send or receive fails; a
put with a credit whose send fails asks again on a fresh link).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any, cast

from p2p_asyncwork import AsyncWork
from p2p_worker._channels.proto import wire_timeout
from p2p_worker._channels.work import ChannelWork, Op

POSTED = "posted"
"""``AnswerReader.receiver`` while a read is posted on the link."""


class AnswerReader:
    """The answers due on one link and who receives them; guarded by the link's lock.

    ``link`` is the :class:`~p2p_worker._channels.client.ChannelLink` it serves: its
    ``_lock``, ``_group``, ``_broken``, ``prefetched``, ``_take_answer`` and ``_break``.
    """

    __slots__ = ("due", "link", "receiver")

    def __init__(self, link: Any) -> None:
        self.link = link
        self.due = 0  # answers of the current link not received yet
        self.receiver: Any = None  # None, POSTED, or the Op whose caller receives

    def clear(self) -> None:
        """A fresh link: nothing due, nobody receiving (holding the link's lock)."""
        self.due, self.receiver = 0, None

    def received(self, group: Any, posted: bool) -> None:
        """An answer arrived on ``group``; after a posted read, post the next one if due."""
        link = self.link
        with link._lock:
            if group is not link._group:
                return
            self.due -= 1
            if not posted:
                return
            if self.due <= 0:
                self.due, self.receiver = 0, None
                return
        self._post(group)

    def ensure(self, watch: bool = False) -> None:
        """Post a read if nobody receives and answers are due or prefetched items held.

        With ``watch``, post one on an idle link too (so that a reset is seen at once).
        """
        link = self.link
        with link._lock:
            group = link._group
            if self.receiver is not None or group is None or link._broken is not None:
                return
            if not (watch or self.due or link.prefetched):
                return
            self.receiver = POSTED
        self._post(group)

    def receive_own(self, op: Op) -> None:
        """Receive answers in this thread until ``op``'s own answer is in, if nobody else does."""
        link = self.link
        with link._lock:
            group = link._group
            mine = self.receiver is None and group is not None and link._broken is None
            if mine:
                self.receiver = op
        if not mine:
            self.ensure()
            return
        fut = cast("Future[Any]", op.work.ref)
        try:
            while not fut.done():
                try:
                    # idle for as long as it likes (not the job's op_timeout)
                    msg = group.recv(timeout=wire_timeout(None))
                    token = link._take_answer(group, msg, False)
                except BaseException as exc:
                    link._break(group, exc)
                    return
                if token == op.token:
                    return
        finally:
            with link._lock:
                if self.receiver is op:
                    self.receiver = None
            self.ensure()

    def _post(self, group: Any) -> None:
        """Post the receive of the next answer on ``group``."""
        try:
            work = group.recv(async_op=True, timeout=wire_timeout(None))
        except Exception as exc:
            self.link._break(group, exc)
            return
        ChannelWork._follow(work, lambda w: self._on_answer(group, w))

    def _on_answer(self, group: Any, work: AsyncWork[Any]) -> None:
        """A posted read completed: hand the answer on (in the link's receiving thread).

        Whatever goes wrong here breaks the link (its waiting ops fail, the next op
        reconnects): an exception let out would end that thread, and with it every later
        answer, silently.
        """
        try:
            failed = work.exception(0)
            if failed is not None:
                self.link._break(group, failed)
                return
            self.link._take_answer(group, work.wait(0), True)
        except BaseException as exc:
            self.link._break(group, exc)
