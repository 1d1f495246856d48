"""Channel: a process's handle on a named FIFO channel held by a channel worker.

A process talks to a channel worker over two collective groups (no Ray call per item):

- the *control group* carries its requests (a put asking for room, a get asking for
  items), one message each, in the order they were issued;
- the *link* carries put payloads to the channel worker and, the other way, each
  answer ``(token, answer, count)`` followed by the ``count`` items a get was granted.

Answers are processed in the order the operations were issued, puts among puts and gets
among gets, so one process's puts enter the channel in the order they were made and its
gets receive items in channel order. Ray is used to find the channel worker, to say
hello (open the groups), and for cancel, reset, sizes, stats and destroy.
"""

from __future__ import annotations

import contextlib
import enum
import threading
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from typing import TYPE_CHECKING, cast

from p2p_asyncwork import WorkCancelledError
from p2p_worker._channels._client.acks import AckBatch
from p2p_worker._channels._client.answers import ACK_TIMEOUT, LinkAnswers
from p2p_worker._channels._client.failure import Unconfirmed, fail_ops_soon
from p2p_worker._channels._client.linger import Linger
from p2p_worker._channels._client.order import IssueOrder
from p2p_worker._channels._client.prefetch import Prefetched
from p2p_worker._channels._client.work import (
    CONTROL_GRACE,
    ChannelWork,
    Granted,
    Op,
    Outcome,
    wait_within,
)
from p2p_worker._channels._protocol.actor import ChannelActor
from p2p_worker._channels._protocol.errors import (
    ChannelClosedError,
    ChannelEmpty,
    ChannelError,
    ChannelFull,
)
from p2p_worker._channels._protocol.payload import Void
from p2p_worker._channels._protocol.proto import (
    CANCELLED_ANSWER,
    GET,
    GIVE_BACK,
    NO_ROOM,
    RESET_ANSWER,
    Hello,
    decode,
    wire_timeout,
)
from p2p_worker._runtime._state import WorkerRuntime

if TYPE_CHECKING:
    from p2p_worker._channels._protocol.proto import Request, Served

CREDITS = 8  # put credits a put asks for (the channel worker may lend fewer)
CREDIT_LINGER = 0.05  # seconds without a put after which unused credits are handed back


class _NoCredit(enum.Enum):
    NO_CREDIT = "no credit"


NO_CREDIT = _NoCredit.NO_CREDIT  # credit_put's answer when the put must ask the channel worker


class ChannelLink(LinkAnswers):
    """The connection of one process to one channel: control calls and the payload link.

    Created by :func:`connect_link`; :class:`~p2p_worker.Channel` wraps it. This half
    issues requests and sends payloads; :class:`LinkAnswers` receives the answers.
    """

    def __init__(self, endpoint: WorkerRuntime, actor: ChannelActor, hello: Hello) -> None:
        self.endpoint = endpoint
        self.actor = actor
        self.hello = hello
        self.peer = endpoint.address.get_name()
        self._lock = threading.RLock()
        # Sends on the control group (requests, acknowledgements, give-backs), so they
        # leave in the order they were made; taken before ``_lock``, never by the link's
        # receiving thread (which must always be free to take answers in).
        self._send_lock = threading.RLock()
        self._gen = hello.gen
        self._group = None
        self._ctl = None  # the control group: requests, in token order
        self._pending = {}  # token -> its answer, once it comes
        self._broken = None  # why the link failed (reconnect first)
        self._token = 0  # numbers every put/get (the channel worker tracks them for cancel)
        # Puts are ordered among puts and gets among gets: one kind never waits for the
        # other (a pending put must not hold up the get that would make room for it).
        self._seq = {"put": 0, "get": 0, "query": 0}
        # Answers are processed in issue order, one at a time per kind; holding a kind's
        # turn (``with self._order[kind]``) also keeps its answers from being processed.
        self._order = {"put": IssueOrder(self._process), "get": IssueOrder(self._process)}
        self.orphans: deque[tuple[Hashable, object]] = deque()  # (key, item) of abandoned gets
        # Gets of link generation _gen whose items were handed over, until the channel
        # worker is known to have their acknowledgement: token -> (items received,
        # request token whose answer confirms the ack (None: no ack sent yet)). Reported
        # when the link fails, so a reset never sends items that arrived here elsewhere.
        self._got = {}
        self._acks = AckBatch()  # acknowledgements waiting for the next request
        # items a blocking get took ahead (see _channels._client.prefetch)
        self.prefetched = Prefetched(_Locks(self._send_lock, self._lock), self.give_back_prefetched)
        self._prefetching = {}  # token -> key of a prefetching get in flight
        self.closed = False
        # Put credits: slots the channel worker lent this process on link generation
        # _gen, each with a receive posted; a put with a credit is a plain send.
        self._credits = 0
        self._sent = 0  # payloads (items and voids) sent on _gen, for the channel's sync
        self._unconfirmed = Unconfirmed()  # puts whose payload left, until their receipt
        # Unused credits go back after CREDIT_LINGER s without a put (a Void per credit).
        self._credit_linger = Linger(
            lambda: CREDIT_LINGER,
            self._put_locks,
            lambda: bool(self._credits) and not self.closed,
            lambda: self._return_credits(wait=False),
        )

    # -- issuing and ordering -----------------------------------------------------------

    def submit(
        self,
        kind: str,
        request: Callable[[int], Served],
        item: object = None,
        batch: bool = False,
        reserve: int = 1,
    ) -> Op:
        """Send request ``request(token)``; its answer is processed in issue order.

        The caller either :meth:`follow` s the op (asynchronous use) or :meth:`run` s it
        (a blocking call: the answer is awaited and, when it is next in line, its
        transfer done in the caller's thread, sparing two thread hand-offs).
        """
        failed: BaseException | None = None
        refused: BaseException | None = None
        # Requests leave in token order: numbered and sent holding the send lock. The
        # send itself is made without ``_lock``: the link's receiving thread takes
        # ``_lock`` for every answer, and while a burst of requests fills the control
        # group's buffer the channel worker may be waiting to hand this process answers.
        with self._send_lock:
            with self._lock:
                if self.closed:
                    raise ChannelClosedError(f"channel {self.hello.name!r}: this handle was closed")
                if self._broken is not None:
                    self._reconnect()
                token = self._token
                self._token += reserve  # a prefetching get numbers its items (see prefetch)
                fut: Future[Granted] = Future()
                self._pending[token] = fut
                ctl, group = self._ctl, self._group
                msg: Request | None = None
                try:
                    req = request(token)
                    if reserve > 1 and req[0] == GET:  # a prefetching get: remember its key
                        self._prefetching[token] = req[7]
                    msg = self._with_acks(req)
                except (TypeError, ValueError) as exc:  # refused before anything was sent
                    refused = exc
                seq = self._seq[kind]
                self._seq[kind] += 1
            if msg is not None:
                try:  # a plain send in this thread: the collective runs it inline
                    assert ctl is not None  # a request is made on an open link
                    ctl.send(msg, timeout=wire_timeout(self.hello.transfer_timeout))
                except (TypeError, ValueError) as exc:  # refused before anything was sent
                    refused = exc
                except Exception as exc:
                    # The control group failed: the op stays pending and fails with the
                    # others of this link, as ChannelClosedError when the channel worker
                    # is gone (asked of Ray), else ChannelError.
                    failed = exc
        if refused is not None:
            with self._lock:
                self._pending.pop(token, None)
                self._prefetching.pop(token, None)
            err = ChannelError(
                f"channel {self.hello.name!r}: the request could not be sent ({refused})"
            )
            err.__cause__ = refused
            fut.set_exception(err)
        if failed is not None:
            self._break(group, failed)
        work = ChannelWork(fut, lambda wait, timeout: self._withdraw(token, wait, timeout))
        return Op(seq, kind, work, item, batch, bool(getattr(request, "inline", False)))

    def follow(self, op: Op) -> ChannelWork:
        """Process ``op``'s answer whenever it comes; return its handle."""
        fut = cast("Future[Granted]", op.work.ref)
        fut.add_done_callback(lambda done: self._on_future(op, done))
        return op.work

    def run(self, op: Op, limit: float | None) -> object:
        """Wait for ``op``'s answer and finish it (inline when possible); return its value.

        After ``limit`` seconds without an answer the op is abandoned with a
        :class:`ChannelClosedError`; its answer is still processed when it comes.
        """
        fut: Future[Granted] = cast("Future[Granted]", op.work.ref)
        try:
            answer, error = fut.result(timeout=limit), None
        except BaseException as exc:
            if not fut.done():  # no answer in time
                op.work._finish(
                    exception=ChannelClosedError(
                        f"channel {self.hello.name!r}: no answer from its channel worker"
                        f" within {limit} s"
                    )
                )
                self.follow(op)
                return op.work.wait(0)
            answer, error = None, exc
        self._order[op.kind].deliver(op, answer, error, inline=True)
        return wait_within(op.work, limit, self.hello.name)

    def _on_future(self, op: Op, fut: Future[Granted]) -> None:
        try:
            answer, error = fut.result(), None
        except BaseException as exc:
            answer, error = None, exc
        # Ray's callback thread never waits for the turn (a blocking caller may hold it
        # through a whole transfer): the answer is then left for the holder.
        self._order[op.kind].deliver(op, answer, error, inline=False)

    def _process(
        self, op: Op, answer: Granted | None, error: BaseException | None, inline: bool
    ) -> None:
        name = self.hello.name
        if error is not None:
            if not isinstance(error, ChannelError):
                err = ChannelError(f"channel {name!r}: {op.kind} failed: {error}")
                err.__cause__ = error
                error = err
            op.work._finish(exception=error)
            return
        code, outcomes = cast("Granted", answer)
        if code == NO_ROOM and op.kind == "put":
            op.work._finish(exception=ChannelFull(f"channel {name!r} is full"))
        elif code == NO_ROOM:
            op.work._finish(exception=ChannelEmpty(f"channel {name!r} is empty"))
        elif code == CANCELLED_ANSWER:
            op.work._finish(exception=WorkCancelledError("the channel operation was cancelled"))
        elif code == RESET_ANSWER:
            op.work._finish(
                exception=ChannelError(
                    f"channel {name!r}: {op.kind} interrupted, the link to the channel worker"
                    " was reset after a failed transfer; nothing was put or taken"
                )
            )
        elif op.kind == "put":
            self._start_put(op, *decode(code), inline)
        else:
            self._get_done(op, decode(code)[0], outcomes)

    def _stale(self, op: Op) -> None:
        name = self.hello.name
        if self.closed:
            err: ChannelError = ChannelClosedError(
                f"channel {name!r}: this handle was closed; nothing was put or taken"
            )
        else:
            err = ChannelError(
                f"channel {name!r}: {op.kind} granted on a link that was reset meanwhile;"
                " nothing was put or taken"
            )
        op.work._finish(exception=err)

    # -- put credits ----------------------------------------------------------------------

    def sync(self) -> tuple[int, int]:
        """``(gen, payloads sent)``: what the channel worker waits for before a call."""
        with self._lock:
            return (self._gen, self._sent)

    def puts_settled(self) -> bool:
        """Whether every put issued so far is processed (holding ``_lock``; no credits held).

        A put being processed holds the put order lock until its payload is counted in
        ``_sent``; so when neither a put is pending nor that lock is held, ``_sent``
        covers every earlier payload (what an inline put's sync must name).
        """
        return (
            self._seq["put"] == self._order["put"].next
            and not self._credits
            and not self._order["put"].locked()
        )

    def want_credits(self) -> int:
        """Credits a new put asks for: some when it is this process's only put in flight.

        (Credits lent while other puts of ours are in flight are still used, but the
        channel worker's split of its receives into credits and grants is then off
        until they are used or handed back.)
        """
        idle = self._seq["put"] == self._order["put"].next and not self._credits
        return CREDITS if idle else 0

    def credit_put(self, item: object, async_op: bool) -> object:
        """Put ``item`` with a credit: a plain send, no call. NO_CREDIT when there is none.

        Only when every earlier put of this process has been processed, so puts keep
        their order. Returns what ``Channel.put`` returns.
        """
        if not self._credits:  # unlocked peek: the common case without credits
            return NO_CREDIT
        turn = self._order["put"]
        if not turn.claim():  # a put is being processed (perhaps by this thread): ask
            return NO_CREDIT
        try:
            work = self._credit_send(item, async_op)
        finally:
            turn.release()
        if async_op or not isinstance(work, ChannelWork):  # the handle, or NO_CREDIT
            return work
        return wait_within(work, self.limit(0.0), self.hello.name)  # its receipt

    def _credit_send(self, item: object, async_op: bool) -> object:
        """:meth:`credit_put` holding the put turn: send ``item`` if a credit is left.

        Returns the put's handle (it completes with the receipt), or NO_CREDIT.
        """
        with self._lock:
            if self.closed:
                raise ChannelClosedError(f"channel {self.hello.name!r}: this handle was closed")
            if not self._credits or self._order["put"].next != self._seq["put"]:
                return NO_CREDIT
            self._credits -= 1
            self._sent += 1
            self._credit_linger.touch()
            group, gen = self._group, self._gen
            op = Op(-1, "put", ChannelWork(None), item, False)
            self._unconfirmed.expect(self._sent, op.work)
            timeout = wire_timeout(self.hello.transfer_timeout)
            assert group is not None  # credits are lent on an open link
            try:
                send = group.send(item, async_op=async_op, timeout=timeout)
            except (TypeError, ValueError) as exc:  # cannot be sent: hand the credit back
                group.send(Void(), async_op=True, timeout=timeout)
                if not async_op:
                    raise
                op.work._finish(exception=exc)
                return op.work
            except Exception as exc:
                self._put_done(op, gen, False, exc)
                return op.work.wait(0)
        if async_op:
            assert send is not None  # async_op=True: a handle
            ChannelWork._follow(send, lambda w: self._put_done(op, gen, False, w.exception(0)))
        return op.work

    @contextlib.contextmanager
    def _put_locks(self) -> Iterator[None]:
        """The put order lock, then ``_lock`` (what handing back credits holds)."""
        # Credits go back even while puts of ours wait for room: they may wait for the
        # very slots these credits hold. A Void is no item, so order is not at stake.
        with self._order["put"], self._lock:
            yield

    def _return_credits(self, wait: bool) -> None:
        """Send a Void for each unused credit (holding the put order lock and ``_lock``)."""
        count, self._credits = self._credits, 0
        group, gen = self._group, self._gen
        if not count or group is None:
            return
        self._sent += count
        timeout = wire_timeout(self.hello.transfer_timeout) if not wait else 5.0
        for _ in range(count):
            try:
                send = group.send(Void(), async_op=not wait, timeout=timeout)
            except Exception:
                self._ask_reset(gen)
                return
            if not wait:
                assert send is not None  # sent with async_op=True: a handle
                ChannelWork._follow(
                    send, lambda w: self._ask_reset(gen) if w.exception(0) else None
                )

    # -- prefetched items (see _channels._client.prefetch) -------------------------------------

    def take_orphans(self, key: Hashable, most: int) -> list[object]:
        """Remove and return up to ``most`` of ``key``'s items that abandoned gets left."""
        with self._lock:
            mine = [i for i, (k, _) in enumerate(self.orphans) if k == key]
            taken = [self.orphans[i][1] for i in mine[:most]]
            for i in reversed(mine[:most]):
                del self.orphans[i]
        return taken

    def held_items(self, key: Hashable) -> list[object]:
        """``key``'s items that this process's next gets hand out first (not removed).

        Those abandoned gets left, then those a get prefetched, oldest first.
        """
        with self._lock:
            held = [item for k, item in self.orphans if k == key]
            held += [entry[3] for entry in self.prefetched.entries if entry[0] == key]
        return held

    def gets_idle(self) -> bool:
        """Whether no get of this process is in flight (a new blocking get may prefetch)."""
        return self._seq["get"] == self._order["get"].next and not self._prefetching

    def take_prefetched(self, key: Hashable, most: int) -> list[object]:
        """Hand out up to ``most`` prefetched items of ``key``, oldest first; acknowledge them."""
        if not self.prefetched:  # unlocked peek: the common case
            return []
        with self._lock:
            taken = self.prefetched.take(key, most)
        for token, group, _ in taken:
            self._ack(group, token)
        return [item for _, _, item in taken]

    def give_back_prefetched(self) -> None:
        """Send the live link's unused prefetched items back to the head; acks ride along."""
        with self._send_lock, self._lock:
            group, ctl = self._group, self._ctl
            tokens = self.prefetched.drain(group) if self.prefetched and group is not None else []
            if not tokens or ctl is None:
                return
            for token in tokens:  # no longer ours: a report must not count them
                self._got.pop(token, None)
            try:
                ctl.send(self._with_acks((GIVE_BACK, *tokens)), timeout=ACK_TIMEOUT)
            except Exception as exc:  # the items stay unacknowledged: a reset sends them back
                threading.Thread(target=self._break, args=(group, exc), daemon=True).start()

    # -- payloads -------------------------------------------------------------------------

    def _start_put(self, op: Op, gen: int, lent: int, inline: bool) -> None:
        if op.inline:  # the item rode in the request and is in the channel now
            with self._lock:
                if lent and self._group_for(gen) is not None:
                    self._credits += lent
                    self._credit_linger.touch()
            op.work._finish(None)
            return
        with self._lock:
            group = self._group_for(gen)
            abandoned = op.work.done() or op.work.abandoned
            if group is not None:
                self._sent += 1  # the item or a Void, in the slot of this grant
                if not abandoned:  # it completes with the receipt of its item
                    self._unconfirmed.expect(self._sent, op.work)
            if group is not None and lent:
                self._credits += lent
                self._credit_linger.touch()
        if group is None:
            self._stale(op)
            return
        timeout = wire_timeout(self.hello.transfer_timeout)
        payload = Void() if abandoned else op.item  # abandoned: fill the slot, no item
        try:
            send = group.send(payload, async_op=not inline, timeout=timeout)
        except (TypeError, ValueError) as exc:  # the item cannot be sent: free its slot
            group.send(Void(), async_op=True, timeout=timeout)
            op.work._finish(exception=exc)
            return
        except Exception as exc:  # inline transfer failed
            self._put_done(op, gen, abandoned, exc)
            return
        if inline:
            self._put_done(op, gen, abandoned, None)
        else:
            assert send is not None  # sent with async_op=True: a handle
            ChannelWork._follow(send, lambda w: self._put_done(op, gen, abandoned, w.exception(0)))

    def _put_done(self, op: Op, gen: int, abandoned: bool, exc: BaseException | None) -> None:
        """The payload of put ``op`` left (or failed to): a sent item waits for its receipt."""
        if exc is None:
            if abandoned:
                op.work._finish(exception=WorkCancelledError("the put was cancelled"))
            return
        self._ask_reset(gen)
        err = ChannelError(f"channel {self.hello.name!r}: sending the item failed: {exc}")
        err.__cause__ = exc
        op.work._finish(exception=err)
        with self._lock:  # the link is unusable: its ops fail now, the next reconnects
            group = self._group if gen == self._gen else None
        if group is not None:
            self._break(group, exc)

    def _get_done(self, op: Op, gen: int, outcomes: list[Outcome]) -> None:
        got = [value for value, exc in outcomes if exc is None]
        failures = [exc for _, exc in outcomes if exc is not None]
        if failures:
            self._ask_reset(gen)
        if op.work.done() or op.work.abandoned:  # keep the items for the next get
            with self._lock:
                self.orphans.extend((op.key, item) for item in got)
            op.work._finish(exception=WorkCancelledError("the get was cancelled"))
            return
        if got:
            op.work._finish(got if op.batch else got[0])
            return
        if not failures:  # the channel worker could not encode the head item again
            op.work._finish(
                exception=ChannelError(
                    f"channel {self.hello.name!r}: the channel worker could not send the head"
                    " item (it stays in the channel)"
                )
            )
            return
        err = ChannelError(f"channel {self.hello.name!r}: receiving failed: {failures[0]}")
        err.__cause__ = failures[0]
        op.work._finish(exception=err)

    # -- waiting and closing ------------------------------------------------------------

    def limit(self, timeout: float | None) -> float | None:
        """Client-side bound of a blocking call: its timeout, one transfer, a grace period."""
        transfer = self.hello.transfer_timeout
        if timeout is None or transfer is None:
            return None
        return timeout + transfer + CONTROL_GRACE

    def close(self) -> None:
        """Stop using the link (unused credits go back); pending operations fail. Idempotent."""
        with self._order["put"], self._send_lock, self._lock:
            if not self.closed:
                self._return_credits(wait=True)
                self.give_back_prefetched()  # unused prefetched items go back to the head
                self._send_acks(self._acks.alone(), self._ctl)  # acknowledged before it leaves
            self.closed = True
            self._credit_linger.stop()
            self.prefetched.stop()
            group, self._group = self._group, None
            ctl, self._ctl = self._ctl, None
            pending, self._pending = self._pending, {}
            report: tuple[int, dict[int, int]] = (self._gen, {})  # all acknowledged above
            unconfirmed = self._unconfirmed.take()
        closed = ChannelClosedError(f"channel {self.hello.name!r}: this handle was closed")
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(closed)
        for g in (group, ctl):
            if g is not None:
                g.close(timeout=0.0)
        if unconfirmed:  # sent, their receipts cannot come now: ask what arrived
            fail_ops_soon(self.actor, self.peer, self.hello.name, closed, report, {}, unconfirmed)


class _Locks:
    """Two reentrant locks taken in order and released in reverse (a reusable ``with``)."""

    __slots__ = ("_first", "_second")

    def __init__(self, first: threading.RLock, second: threading.RLock) -> None:
        self._first = first
        self._second = second

    def __enter__(self) -> None:
        self._first.acquire()
        self._second.acquire()

    def __exit__(self, *exc: object) -> None:
        self._second.release()
        self._first.release()
