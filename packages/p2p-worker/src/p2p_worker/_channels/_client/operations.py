"""What a channel handle does once connected: put, get, get_batch, sizes, close, destroy.

:class:`ChannelOperations` is the part of :class:`~p2p_worker.Channel` that talks to
the channel worker over this process's link (``link``); creating and connecting
handles (which may start a channel worker) is ``Channel``'s, above the client side.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Literal, TypeVar, cast, overload

import ray
from ray.actor import ActorHandle

from p2p_asyncwork.internal import check_timeout
from p2p_worker._channels._client.endpoint import forget_handle
from p2p_worker._channels._client.inline import PutRequest
from p2p_worker._channels._client.link import NO_CREDIT, ChannelLink
from p2p_worker._channels._client.work import ChannelWork, Granted, refuse_waiting_in_callback
from p2p_worker._channels._protocol.actor import ChannelActor
from p2p_worker._channels._protocol.errors import ChannelClosedError, ChannelError
from p2p_worker._channels._protocol.keys import DEFAULT_KEY, check_key, check_weight, wrap
from p2p_worker._channels._protocol.proto import (
    GET,
    MAX_BATCH,
    PREFETCH,
    QSIZE,
    ChannelStats,
    check_channel_name,
)
from p2p_worker._remote import RemoteMethod

if TYPE_CHECKING:
    from p2p_worker._channels._protocol.proto import Served

DEFAULT_QUERY_TIMEOUT = 60.0


R = TypeVar("R")


class ChannelOperations:
    """A channel handle's operations on its link (the base of :class:`~p2p_worker.Channel`).

    Items, ordering, flow control and failures are described on ``Channel``.
    """

    def __init__(self, name: str, store: tuple[str, int], link: ChannelLink | None = None) -> None:
        self.name = check_channel_name(name)
        self._store = store
        self._link_obj = link
        self._lock = threading.Lock()

    def _link(self) -> ChannelLink:
        link = self._link_obj
        if link is not None:
            return link
        with self._lock:
            if self._link_obj is None:
                self._link_obj = self._connect()
            return self._link_obj

    def _connect(self) -> ChannelLink:
        """This process's link to the channel, connected on first use (``Channel``'s)."""
        raise NotImplementedError

    def _usable(self) -> bool:
        link = self._link_obj
        return link is None or not link.closed

    def __repr__(self) -> str:
        link = self._link_obj
        if link is None:
            return f"<Channel {self.name!r} (not connected yet)>"
        state = "closed" if link.closed else f"maxsize={link.hello.maxsize}"
        return f"<Channel {self.name!r} {state}>"

    @property
    def maxsize(self) -> int:
        """Most items the channel holds at once (0: no bound)."""
        return self._link().hello.maxsize

    # -- putting --------------------------------------------------------------------------

    @overload
    def put(
        self,
        item: object,
        weight: int = 0,
        key: Hashable = DEFAULT_KEY,
        async_op: Literal[False] = False,
        *,
        timeout: float | None = None,
    ) -> None: ...

    @overload
    def put(
        self,
        item: object,
        weight: int,
        key: Hashable,
        async_op: Literal[True],
        *,
        timeout: float | None = None,
    ) -> ChannelWork: ...

    @overload
    def put(
        self,
        item: object,
        weight: int = 0,
        key: Hashable = DEFAULT_KEY,
        *,
        async_op: Literal[True],
        timeout: float | None = None,
    ) -> ChannelWork: ...

    @overload
    def put(
        self,
        item: object,
        weight: int = 0,
        key: Hashable = DEFAULT_KEY,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> ChannelWork | None: ...

    def put(
        self,
        item: object,
        weight: int = 0,
        key: Hashable = DEFAULT_KEY,
        async_op: bool = False,
        *,
        timeout: float | None = None,
    ) -> ChannelWork | None:
        """Append ``item`` to ``key``'s FIFO; wait while the channel is full.

        RLinf's signature. Returns once the item is in the channel: it then comes out
        before anything any process puts afterwards. With ``async_op=True`` the returned
        handle stays pending while the channel is full and completes once the item is in
        the channel; do not modify the item's tensors before then. A bool second
        argument is read as ``async_op`` (p2p-worker's earlier ``put(item, async_op)``).

        Args:
            item: A picklable object; tensors must be dense, contiguous CPU tensors.
            weight: The item's weight for ``get_batch(target_weight=...)`` (int >= 0).
            key: The FIFO to append to (hashable, picklable; default: RLinf's
                ``"default_queue"``). ``maxsize`` bounds the channel, not each key.
            async_op: Return a :class:`ChannelWork` at once instead of waiting.
            timeout: Seconds to wait for room (None: no limit); the payload transfer
                after it is bounded by the channel's ``transfer_timeout``.

        Returns:
            None, or a :class:`ChannelWork` whose ``wait()`` returns None.

        Raises:
            ChannelFull: No room within ``timeout`` (the item was not added).
            TypeError: ``weight`` is not an int, or ``key`` is unhashable.
            ValueError: ``timeout`` or ``weight`` is negative, or the item cannot be sent
                (a tensor not on CPU or not contiguous, an unpicklable object).
            ChannelError: The transfer failed (the item was not added; but a small
                item that rode in its request may be in when the link failed just
                after the channel worker queued it, see the channels guide).
            ChannelClosedError: The channel is destroyed or its worker died.

        Example:
            >>> channel.put({"step": 3, "obs": torch.zeros(8)})  # doctest: +SKIP
            >>> channel.put(torch.ones(4), weight=2, key="env0", async_op=True).wait()  # doctest: +SKIP
        """  # noqa: E501
        if isinstance(weight, bool):  # put(item, async_op): the earlier p2p-worker form
            async_op, weight = weight, 0
        item = wrap(item, check_key(key), check_weight(weight))
        timeout = check_timeout(timeout)
        if not async_op:
            refuse_waiting_in_callback("a blocking put")
        link = self._link()
        done = link.credit_put(item, async_op)
        if done is not NO_CREDIT:  # the put's handle, or (waited for) its None
            return done if isinstance(done, ChannelWork) else None
        op = link.submit("put", PutRequest(link, item, True, timeout), item)
        if async_op:
            return link.follow(op)
        link.run(op, link.limit(timeout))  # a put completes with None
        return None

    def put_nowait(self, item: object, weight: int = 0, key: Hashable = DEFAULT_KEY) -> None:
        """Append ``item`` (with ``weight``, to ``key``) if there is room now; never wait.

        Returns once the item is in the channel (its payload transfer is done).

        Raises:
            ChannelFull: The channel is full (the item was not added).
            ValueError: The item cannot be sent.
            ChannelError: The transfer failed.
            ChannelClosedError: The channel is destroyed or its worker died.

        Example:
            >>> try:  # doctest: +SKIP
            ...     channel.put_nowait(item)
            ... except ChannelFull:
            ...     pass
        """
        item = wrap(item, check_key(key), check_weight(weight))
        refuse_waiting_in_callback("put_nowait")
        link = self._link()
        if link.credit_put(item, False) is not NO_CREDIT:
            return
        op = link.submit("put", PutRequest(link, item, False, None), item)
        link.run(op, link.limit(0.0))

    # -- getting --------------------------------------------------------------------------

    def _get(
        self,
        max_items: int,
        max_bytes: int | None,
        block: bool,
        timeout: float | None,
        batch: bool,
        async_op: bool,
        key: Hashable = DEFAULT_KEY,
        target_weight: int | None = None,
    ) -> object:
        if not async_op:
            refuse_waiting_in_callback("a blocking get" if block else "get_nowait")
        link = self._link()
        if target_weight is None:  # items a get abandoned after they were granted, then
            # items a get prefetched (older than any queued)
            taken = link.take_orphans(key, max_items) or link.take_prefetched(key, max_items)
        else:  # a by-weight batch takes them in order from the head
            taken = []
            link.give_back_prefetched()
        if taken:
            value = taken if batch else taken[0]
            if not async_op:
                return value
            work = ChannelWork(None)
            work._finish(value)
            return work
        # a blocking get() alone in flight may take a few queued items ahead (prefetch)
        prefetch = PREFETCH if block and not (batch or async_op) and link.gets_idle() else 0
        op = link.submit(
            "get",
            lambda t: (
                GET,
                t,
                max_items,
                max_bytes,
                block,
                timeout,
                link.sync(),
                key,
                target_weight,
                prefetch,
            ),
            batch=batch,
            reserve=max(prefetch, 1),
        )
        op.key = key
        return link.follow(op) if async_op else link.run(op, link.limit(timeout))

    def get(
        self, key: Hashable = DEFAULT_KEY, async_op: bool = False, *, timeout: float | None = None
    ) -> Any:
        """Remove and return the oldest item of ``key``; wait while there is none.

        RLinf's signature; a bool first argument is read as ``async_op``
        (p2p-worker's earlier ``get(async_op)``). A blocking call that is this process's
        only get in flight may receive up to 8 queued items without tensors at once
        (when no other process got from the channel in the last 5 s); the next
        gets of ``key`` return them first, without a round trip. Each keeps its slot
        until handed out; unused ones go back to the head after 50 ms without a get or
        when the handle closes (see the channels guide).

        Args:
            key: The FIFO to take from (default: RLinf's ``"default_queue"``).
            async_op: Return a :class:`ChannelWork` at once instead of waiting.
            timeout: Seconds to wait for a put (None: no limit); items already arriving
                when it expires are still waited for, and the payload transfer to this
                process is bounded by the channel's ``transfer_timeout``.

        Returns:
            The item, or a :class:`ChannelWork` whose ``wait()`` returns it.

        Raises:
            ChannelEmpty: No item within ``timeout`` (nothing was taken).
            ValueError: ``timeout`` is negative.
            ChannelError: The transfer failed (the item went back to the head).
            ChannelClosedError: The channel is destroyed or its worker died.

        Example:
            >>> item = channel.get(timeout=30.0)  # doctest: +SKIP
            >>> work = channel.get(async_op=True)  # doctest: +SKIP
            >>> item = await work  # doctest: +SKIP
        """
        if isinstance(key, bool):  # get(async_op): the earlier p2p-worker form
            async_op = key
            key = DEFAULT_KEY
        check_key(key)
        timeout = check_timeout(timeout)
        return self._get(1, None, True, timeout, batch=False, async_op=async_op, key=key)

    def get_nowait(self, key: Hashable = DEFAULT_KEY) -> Any:
        """Remove and return the oldest item of ``key`` if there is one; never wait for a put.

        An item whose put was granted but whose payload is still arriving counts as
        held: the call waits for that payload (at most one transfer timeout).

        Returns:
            The item.

        Raises:
            ChannelEmpty: No item is in the channel.
            ChannelError: The transfer failed (the item went back to the head).
            ChannelClosedError: The channel is destroyed or its worker died.

        Example:
            >>> try:  # doctest: +SKIP
            ...     item = channel.get_nowait()
            ... except ChannelEmpty:
            ...     item = None
        """
        return self._get(1, None, False, 0.0, batch=False, async_op=False, key=check_key(key))

    def get_batch(
        self,
        target_weight: int = 0,
        key: Hashable = DEFAULT_KEY,
        async_op: bool = False,
        *,
        max_items: int | None = None,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Remove and return a batch of ``key``'s items, oldest first, in one exchange.

        RLinf's form, by weight: items are collected, waiting for more as needed, until
        their weights reach ``target_weight`` or the next item would exceed it. The
        first item is always taken, even one heavier than the target; an item of
        weight 0 counts as 1 (with RLinf's rule, unweighted items would never fill a
        target above 0). ``get_batch()`` returns one item.

        p2p-worker's form, by count (``max_items=``): waits (up to ``timeout``) only for
        the first item, then also takes the items already queued, up to ``max_items``
        and while their tensor bytes keep the total within ``max_bytes`` (tensor bytes
        count an item's tensors: a tensor, a list/tuple/dict of tensors, dataclass
        tensor fields).

        Args:
            target_weight: The weight to collect (int >= 0); by-weight form.
            key: The FIFO to take from (default: RLinf's ``"default_queue"``).
            async_op: Return a :class:`ChannelWork` at once instead of waiting.
            max_items: Most items to return (>= 1); selects the by-count form.
            max_bytes: By-count form: bound on the batch's tensor bytes after its first
                item (None: no bound).
            timeout: Seconds to wait (None: no limit). By weight, a batch that got some
                items by then returns them.

        Returns:
            A non-empty list of items, or a :class:`ChannelWork` whose ``wait()``
            returns it.

        Raises:
            TypeError: A count, weight or byte bound is not an int; ``key`` unhashable.
            ValueError: ``max_items`` < 1, ``max_bytes`` < 1, ``target_weight`` < 0,
                ``timeout`` negative, or ``target_weight`` given with ``max_items``.
            ChannelEmpty: No item within ``timeout``.
            ChannelError: Every transfer failed (the items went back to the head).
            ChannelClosedError: The channel is destroyed or its worker died.

        Example:
            >>> batch = channel.get_batch(target_weight=8, key="env0")  # doctest: +SKIP
            >>> batch = channel.get_batch(max_items=32, max_bytes=64 << 20)  # doctest: +SKIP
        """
        check_key(key)
        check_weight(target_weight, "target_weight")
        timeout = check_timeout(timeout)
        if max_items is None:
            if max_bytes is not None:
                raise ValueError("max_bytes belongs to the by-count form: give max_items too")
            return self._get(MAX_BATCH, None, True, timeout, True, async_op, key, target_weight)
        if target_weight:
            raise ValueError("give target_weight (by weight) or max_items (by count), not both")
        if isinstance(max_items, bool) or not isinstance(max_items, int):
            raise TypeError(f"max_items must be an int, got {max_items!r}")
        if not 1 <= max_items <= MAX_BATCH:
            raise ValueError(f"max_items must be in 1..{MAX_BATCH}, got {max_items}")
        if max_bytes is not None:
            if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
                raise TypeError(f"max_bytes must be an int or None, got {max_bytes!r}")
            if max_bytes < 1:
                raise ValueError(f"max_bytes must be >= 1 or None, got {max_bytes}")
        return self._get(
            max_items, max_bytes, True, timeout, batch=True, async_op=async_op, key=key
        )

    # -- state --------------------------------------------------------------------------

    def _query(
        self,
        method: Callable[[ChannelActor], RemoteMethod[..., R]],
        timeout: float | None,
        *args: object,
    ) -> R:
        """Call ``method`` of the channel worker (after this process's puts), over Ray."""
        timeout = check_timeout(timeout)
        link = self._link()
        try:
            ref = method(link.actor).remote(link.peer, link.sync(), *args)
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError as exc:
            raise ChannelClosedError(
                f"channel {self.name!r}: no answer from its channel worker within {timeout} s"
            ) from exc
        except ray.exceptions.RayError as exc:
            raise ChannelClosedError(
                f"channel {self.name!r}: its channel worker is gone ({exc})"
            ) from exc

    def qsize(
        self, key: Hashable = DEFAULT_KEY, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT
    ) -> int:
        """Number of items under ``key`` (a snapshot, like ``queue.Queue``'s).

        Counts the queued items of ``key``, this process's own puts included; for the
        default key also the items of any producer whose put was granted and whose
        payload is on its way in (their key is known once they arrive). A producer that
        had several asynchronous puts in flight at once may leave one such grant
        standing, with no payload coming, until it hands back its unused put credits
        (about 50 ms after its last put): right after other producers' puts the default
        key's count can be that much high; ``stats()["arriving"]`` shows those slots.
        Not the items already taken by a get, nor those a consumer's blocking ``get()``
        took ahead and holds (see :meth:`get`). ``stats()["queued"]`` counts every key.

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.

        Example:
            >>> channel.qsize()  # doctest: +SKIP
            3
        """
        check_key(key)
        timeout = check_timeout(timeout)
        link = self._link()
        return int(_query_link(link, lambda t: (QSIZE, t, link.sync(), key), timeout))

    def empty(
        self, key: Hashable = DEFAULT_KEY, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT
    ) -> bool:
        """Whether ``key`` holds no item (``qsize(key) == 0``; a snapshot).

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.
        """
        return self.qsize(key, timeout=timeout) == 0

    def full(
        self, key: Hashable = DEFAULT_KEY, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT
    ) -> bool:
        """Whether a put would wait now: ``maxsize`` items are held (a snapshot).

        ``key`` is accepted for RLinf's signature; the bound is the channel's, shared
        by all keys, so the answer is the same for every key.

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.
        """
        check_key(key)
        st = self.stats(timeout=timeout)
        return bool(st["maxsize"] > 0 and st["held"] >= st["maxsize"])

    def peek_all(
        self, key: Hashable = DEFAULT_KEY, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT
    ) -> list[object]:
        """The items queued under ``key``, oldest first, without taking them (RLinf's).

        A snapshot for debugging: copies of the items (each crosses Ray once), this
        process's own puts included, and first the items this process's gets took ahead
        (they come out first); not those other consumers hold. ``str(channel)`` shows
        the default key's.

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.

        Example:
            >>> channel.put("a"); channel.put("b")  # doctest: +SKIP
            >>> channel.peek_all()  # doctest: +SKIP
            ['a', 'b']
        """
        check_key(key)
        link = self._link()
        held = link.held_items(key)  # what the next gets of this process hand out first
        queued: list[object] = self._query(lambda actor: actor.peek_all, timeout, key)
        return held + list(queued)

    def __str__(self) -> str:
        """The default key's queued items (RLinf's ``str(channel)``); the repr if unreachable."""
        try:
            return str(self.peek_all())
        except ChannelError as exc:
            return f"{self!r} (items unavailable: {exc})"

    def stats(self, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT) -> ChannelStats:
        """Counters of the channel worker.

        Returns:
            A dict with ``maxsize``, ``held`` (slots in use: items arriving, queued
            or being sent to a consumer), ``queued`` (ready to get), ``arriving``
            (payloads on their way in), ``waiting_putters``,
            ``waiting_getters``, ``credits`` (slots lent to producers ahead of their
            puts, see the channels guide), ``puts`` and ``gets`` (completed transfers),
            ``inline`` (puts whose small item rode in the request), ``prefetched``
            (items sent ahead to a blocking ``get()``, see the channels guide), ``voids``
            (abandoned puts), ``failures`` (failed transfers), ``resets`` (links
            reset), ``peers`` (peer name -> link generation) and ``closed``.

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.
        """
        return self._query(lambda actor: actor.state, timeout).copy()

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Disconnect this process's handle; the channel itself lives on. Idempotent.

        Operations of this handle still pending fail; a later ``connect_channel``
        connects afresh.
        """
        link = self._link_obj
        if link is None:
            return
        link.close()
        forget_handle(link.endpoint, self)

    def destroy(self, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT) -> None:
        """Destroy the channel for everyone: waiting calls fail, its worker stops.

        Items still in the channel are dropped. The name is free again afterwards.

        Raises:
            ChannelClosedError: The channel worker did not answer within ``timeout``
                (it is killed anyway).

        Example:
            >>> channel.destroy()  # doctest: +SKIP
        """
        timeout = check_timeout(timeout)
        link = self._link()
        try:
            ray.get(link.actor.destroy.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            pass  # already gone
        except ray.exceptions.RayError as exc:
            raise ChannelClosedError(f"channel {self.name!r}: destroy failed: {exc}") from exc
        finally:
            ray.kill(cast("ActorHandle[object]", link.actor), no_restart=True)
            self.close()


def _query_link(link: ChannelLink, request: Callable[[int], Served], timeout: float | None) -> int:
    """Send ``request(token)`` on ``link`` and wait for its answer (no put or get: no order).

    Raises:
        ChannelClosedError: No answer within ``timeout``, or the channel is gone.
        ChannelError: The link failed.
    """
    op = link.submit("query", request)
    fut = cast("Future[Granted]", op.work.ref)
    try:
        answer, _ = fut.result(timeout=timeout)
    except BaseException as exc:
        if fut.done():
            raise
        raise ChannelClosedError(
            f"channel {link.hello.name!r}: no answer from its channel worker within {timeout} s"
        ) from exc
    return answer  # a failure is the future's exception, raised above
