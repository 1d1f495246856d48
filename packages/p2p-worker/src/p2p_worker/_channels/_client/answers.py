"""The receiving half of a process's link to a channel worker (see ``link``).

The link carries, to this process, each answer ``(token, answer, count)`` followed by
the ``count`` items a get was granted (or the items inside the answer), and receipts for
the payloads that arrived. :class:`LinkAnswers` keeps one receive posted on it, hands
each answer to its operation, acknowledges the items that arrived (riding on the next
request, see ``acks``), and when the link fails settles the operations waiting on it and
says hello again before the next one. :class:`~p2p_worker._channels._client.link.ChannelLink`
adds the sending half.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Hashable
from concurrent.futures import Future
from typing import TYPE_CHECKING, cast

import ray

from p2p_asyncwork import AsyncWork
from p2p_collective import CollectiveGroup
from p2p_worker._channels._client.acks import FLUSHER, AckBatch
from p2p_worker._channels._client.failure import Unconfirmed, fail_ops_soon
from p2p_worker._channels._client.handshake import open_groups
from p2p_worker._channels._client.prefetch import Prefetched
from p2p_worker._channels._client.work import CONTROL_GRACE, ChannelWork, Granted, Outcome
from p2p_worker._channels._protocol.actor import ChannelActor
from p2p_worker._channels._protocol.errors import ChannelClosedError
from p2p_worker._channels._protocol.payload import Void
from p2p_worker._channels._protocol.proto import RECEIPT, AnswerMessage, Hello, wire_timeout
from p2p_worker._runtime._state import WorkerRuntime

if TYPE_CHECKING:
    from p2p_worker._channels._protocol.proto import AckMessage, Carried, Request

ACK_TIMEOUT = 5.0  # seconds an acknowledgement may take to leave (and close waits for it)


class LinkAnswers:
    """The receiving half of :class:`~p2p_worker._channels._client.link.ChannelLink`.

    Its state is the link's, set up by ``ChannelLink.__init__`` (all under ``_lock``
    unless said otherwise).
    """

    endpoint: WorkerRuntime
    actor: ChannelActor
    hello: Hello
    peer: str
    closed: bool
    prefetched: Prefetched
    _lock: threading.RLock
    _send_lock: threading.RLock  # sends on the control group, taken before _lock
    _gen: int
    _group: CollectiveGroup | None
    _ctl: CollectiveGroup | None
    _pending: dict[int, Future[Granted]]
    _broken: BaseException | None
    _token: int
    _got: dict[int, tuple[int, int | None]]
    _acks: AckBatch
    _prefetching: dict[int, Hashable]  # token -> key
    _credits: int
    _sent: int
    _unconfirmed: Unconfirmed

    # -- the payload link ---------------------------------------------------------------

    def open(self, timeout: float | None) -> None:
        """Connect the link and control group of the current generation; post a receive.

        Raises:
            ChannelError: They could not be connected (see ``handshake.open_groups``).
        """
        self._group, self._ctl = open_groups(
            self.endpoint, self.hello, self.peer, self._gen, timeout
        )
        self._read(self._group)

    def _group_for(self, gen: int) -> CollectiveGroup | None:
        """The link of generation ``gen`` (holding ``_lock``); None if not ours or closed.

        The channel worker answers only on a peer's current link, naming its generation,
        so a grant of an older generation is stale (the link was reset since). A newer
        one cannot come on a link of ours: no group is made for it here (it would have
        no answer receive posted, see :meth:`_read`); the channel worker is asked to drop
        it instead. A link that failed (:meth:`_break`) takes no more payloads: its puts
        waiting for a receipt were settled as it failed, a later one would wait forever.
        """
        if gen > self._gen:
            self._ask_reset(gen)
        if gen != self._gen or self.closed or self._broken is not None:
            return None
        return self._group

    def _withdraw(self, token: int, wait: bool, timeout: float | None) -> bool:
        try:
            ref = self.actor.cancel.remote(self.peer, token)
            return bool(ray.get(ref, timeout=timeout)) if wait else True
        except ray.exceptions.RayError:
            return False

    def _ask_reset(self, gen: int) -> None:
        with contextlib.suppress(Exception):
            self.actor.reset_link.remote(self.peer, gen)

    # -- answers on the link ------------------------------------------------------------

    def _read(self, group: CollectiveGroup) -> None:
        """Post the receive of the next answer on ``group`` (one is always posted)."""
        try:
            # idle for as long as it likes (not the job's op_timeout)
            work = group.recv(async_op=True, timeout=wire_timeout(None))
        except Exception as exc:
            self._break(group, exc)
            return
        ChannelWork._follow(work, lambda w: self._on_answer(group, w))

    def _on_answer(self, group: CollectiveGroup, work: AsyncWork[object]) -> None:
        """An answer arrived: receive the items that follow it, then hand it to its op.

        Runs in the link's receiving thread. Whatever goes wrong here breaks the link
        (its waiting ops fail, the next op reconnects): an exception let out would end
        that thread, and with it every later answer, silently.
        """
        try:
            self._take_answer(group, work)
        except BaseException as exc:
            self._break(group, exc)

    def _take_answer(self, group: CollectiveGroup, work: AsyncWork[object]) -> None:
        failed = work.exception(0)
        if failed is not None:
            self._break(group, failed)
            return
        token, answer, count, *inline = cast("AnswerMessage", work.wait(0))
        if token == RECEIPT:  # ``answer`` of this link's payloads arrived
            self._read(group)
            self._receipt(group, cast("int", answer))
            return
        self._confirmed(group, token)
        if inline:  # items without tensors, inside the answer
            self._read(group)
            self._hand_over(group, token, answer, [(obj, None) for obj in inline[0]])
            return
        timeout = wire_timeout(self.hello.transfer_timeout)
        recvs: list[AsyncWork[object]] = []
        try:
            for _ in range(count):
                recvs.append(group.recv(async_op=True, timeout=timeout))
        except Exception as exc:
            self._break(group, exc)
            return
        self._read(group)
        if not recvs:
            self._resolve(token, answer, [])
            return
        left = [count]
        lock = threading.Lock()

        def received(_: AsyncWork[object]) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            outcomes = [
                (w.wait(0) if w.exception(0) is None else None, w.exception(0)) for w in recvs
            ]
            self._hand_over(group, token, answer, outcomes)

        for w in recvs:
            ChannelWork._follow(w, received)

    def _confirmed(self, group: CollectiveGroup, token: int) -> None:
        """An answer to request ``token`` arrived: acks sent before it have been read.

        The channel worker reads this process's requests in order and handles an ack as
        it arrives, so the answer to a request sent after an ack proves the ack taken.
        """
        with self._lock:
            if group is not self._group or not self._got:
                return
            done = [
                t for t, (_, after) in self._got.items() if after is not None and after <= token
            ]
            for t in done:
                del self._got[t]

    def _receipt(self, group: CollectiveGroup, arrived: int) -> None:
        """``arrived`` payloads sent on ``group`` are in the channel: their puts complete."""
        with self._lock:
            done = self._unconfirmed.confirmed(arrived) if group is self._group else []
        for work in done:
            work._finish(None)

    def _hand_over(
        self,
        group: CollectiveGroup,
        token: int,
        answer: int | BaseException,
        outcomes: list[Outcome],
    ) -> None:
        """Give a get's items to its op and acknowledge them (all arrived) or report.

        Items are acknowledged only when an op takes them: items of an op that already
        failed (its link broke) are dropped here and go back to the channel.
        """
        arrived = 0
        for _, exc in outcomes:
            if exc is not None:
                break
            arrived += 1
        self._resolve(token, answer, outcomes, group, arrived, ack=arrived == len(outcomes) > 0)

    def _ack(self, group: CollectiveGroup | None, token: int) -> None:
        """Tell the channel worker the items of get ``token`` arrived (their slots free up)."""
        with self._lock:
            ctl = self._ctl
            if group is not self._group or ctl is None:
                return
            got = self._got.get(token)
            if got is not None:  # the answer to any later request confirms it
                self._got[token] = (got[0], self._token)
            self._acks.add(token)  # rides on the next request, or leaves alone soon
        FLUSHER.arm(self)

    def _with_acks(self, request: Carried) -> Request:
        """``request`` carrying the pending acknowledgements (holding ``_lock``)."""
        msg = self._acks.wrap(request)
        if msg is not request:  # taken along: the flusher has nothing to send for them
            FLUSHER.disarm(self)
        return msg

    def flush_acks(self) -> None:
        """Send the acknowledgements that no request took along (the ack flusher's call)."""
        with self._send_lock:
            with self._lock:
                group, msg, ctl = self._group, self._acks.alone(), self._ctl
            failed = self._send_acks(msg, ctl)
        if failed is not None:
            self._break(group, failed)

    def _send_acks(
        self, msg: AckMessage | None, ctl: CollectiveGroup | None
    ) -> BaseException | None:
        """Send acknowledgements ``msg`` (holding ``_send_lock``); what failed, if any."""
        if msg is None or ctl is None:
            return None
        try:  # a plain send in this thread: the control group's sends are ours alone
            ctl.send(msg, timeout=ACK_TIMEOUT)
        except Exception as exc:
            return exc
        return None

    def _resolve(
        self,
        token: int,
        answer: int | BaseException,
        outcomes: list[Outcome],
        group: CollectiveGroup | None = None,
        arrived: int = 0,
        ack: bool = False,
    ) -> bool:
        """Hand an answer to op ``token``; False when no op took it (its items are dropped).

        ``arrived`` items (a prefix of ``outcomes``) received on ``group`` are recorded
        as this process's, for :meth:`got_report`. With ``ack`` (all of them arrived) the
        op's items are acknowledged (queued for the next request) before the op learns
        of them: the waiting caller, once woken, then finds the receiving thread done
        with the interpreter instead of waiting for it.
        """
        with self._lock:
            fut = self._pending.pop(token, None)
            prefetching = token in self._prefetching
            key = self._prefetching.pop(token, None)
            if fut is None or fut.done():
                return False
            if prefetching and arrived == len(outcomes) > 1:
                if group is self._group:  # each item is acknowledged when handed out
                    self.prefetched.add(key, group, token, [obj for obj, _ in outcomes[1:]])
                    self._got.update((token + i, (1, None)) for i in range(arrived))
                outcomes, arrived = outcomes[:1], 1
            if arrived and group is self._group:
                self._got[token] = (arrived, None)
        if ack:
            self._ack(group, token)
        if isinstance(answer, BaseException):
            fut.set_exception(answer)
        else:
            fut.set_result((answer, [o for o in outcomes if not isinstance(o[0], Void)]))
        return True

    def got_report(self) -> tuple[int, dict[int, int]]:
        """``(gen, {get token: items received})`` of gets not known acknowledged (hold _lock)."""
        return (self._gen, {t: got[0] for t, got in self._got.items()})

    def _break(self, group: CollectiveGroup | None, exc: BaseException) -> None:
        """The link (or control group) failed: fail every waiting op; reconnect later.

        Settled in a thread of its own (see ``failure.fail_ops``): whether the channel
        itself is gone is asked of Ray, and puts waiting for their receipt learn whether
        their item arrived. The next operation says hello again on fresh groups.
        """
        with self._lock:
            if group is not self._group or self._broken is not None:
                return
            self._broken = exc
            self._credits = 0
            pending, self._pending = self._pending, {}
            report, unconfirmed = self.got_report(), self._unconfirmed.take()
        args = (self.actor, self.peer, self.hello.name, exc, report, pending, unconfirmed)
        fail_ops_soon(*args, on_gone=self._gone)

    def _gone(self) -> None:
        """The channel worker is gone: a later connect_channel looks the channel up again."""
        with self._lock:
            self.closed = True

    def _reconnect(self) -> None:
        """Say hello again and open fresh groups (holding ``_lock``) after a failed link."""
        name = self.hello.name
        report = self.got_report()
        try:
            hello = ray.get(self.actor.hello.remote(self.peer, report), timeout=CONTROL_GRACE)
        except ray.exceptions.RayError as exc:
            self.closed = True
            raise ChannelClosedError(
                f"channel {name!r}: its channel worker is gone ({exc})"
            ) from exc
        for group in (self._group, self._ctl):
            if group is not None:
                group.close(timeout=0.0)
        self.hello = hello
        self._gen = hello.gen
        self._got = {}  # reported with the hello
        self._acks.clear()
        self._prefetching = {}
        self._credits = self._sent = 0
        self._token = 0  # the channel worker numbers this peer's calls afresh
        self._broken = None
        self.open(hello.transfer_timeout)
