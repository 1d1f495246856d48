"""Channel: the public handle on a named FIFO channel (put, get, get_batch, sizes)."""

from __future__ import annotations

import threading
from typing import Any

import ray

from p2p_worker._channel_client import (
    NO_CREDIT,
    ChannelLink,
    ChannelWork,
    check_timeout,
    connect_link,
)
from p2p_worker._channel_endpoint import (
    cached_handle,
    endpoint_for_store,
    forget_handle,
    remember_handle,
)
from p2p_worker._channel_errors import ChannelClosedError
from p2p_worker._channel_proto import MAX_BATCH, check_channel_name

DEFAULT_TRANSFER_TIMEOUT = 60.0
DEFAULT_CONNECT_TIMEOUT = 30.0
DEFAULT_QUERY_TIMEOUT = 60.0


class Channel:
    """A named FIFO queue between workers (and the driver) with real flow control.

    Get one with ``Worker.create_channel`` / ``Worker.connect_channel`` in a worker, or
    :func:`~p2p_worker.create_channel` / :func:`~p2p_worker.connect_channel` in the
    driver; never construct it yourself. A handle may be passed to a worker method: it
    pickles as the channel's name and reconnects in the receiving process on first use.

    Items are any picklable objects; tensors (and lists, dicts and dataclasses of
    tensors) travel on the optimized tensor path of ``Worker.send``, compressed as the
    job configures, and arrive as fresh CPU tensors. The channel worker rebuilds every
    item to pass it on, so the classes of pickled objects must be importable there (as
    in the consumers).

    Ordering: an item is in the channel once its put has been granted room; it is
    queued when its payload has arrived at the channel worker, and items leave in the
    order they were queued. One process's puts are queued in the order it made them,
    and its gets (and each ``get_batch``) receive items in channel order, so every
    producer's items keep their order for every consumer. When a put has returned, its
    item is visible: ``qsize`` counts it and a ``get_nowait`` waits for its payload if
    it is still arriving.

    Flow control: with ``maxsize`` > 0 the channel never holds more than ``maxsize``
    items, counting payloads on their way in and on their way out: a put reserves a
    slot before its payload travels and the slot is freed when a consumer has received
    the item. Waiting puts and gets are served first come, first served.

    Failures: a put that raises did not add its item; a get that raises took nothing
    (an item whose transfer fails goes back to the head). Every payload transfer is
    bounded by the channel's ``transfer_timeout``, so a dead producer or consumer holds
    up at most one item for at most that long.

    Example:
        >>> ch = self.create_channel("rollouts", maxsize=4)  # doctest: +SKIP
        >>> ch.put({"obs": torch.zeros(4), "step": 1})  # doctest: +SKIP
        >>> ch.get()["step"]  # doctest: +SKIP
        1
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
                endpoint = endpoint_for_store(self._store)
                self._link_obj = connect_on(endpoint, self.name, DEFAULT_CONNECT_TIMEOUT)._link()
            return self._link_obj

    def _usable(self) -> bool:
        link = self._link_obj
        return link is None or not link.closed

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self.name, self._store))

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

    def put(self, item: Any, async_op: bool = False, *, timeout: float | None = None) -> Any:
        """Append ``item``; wait while the channel is full.

        With ``async_op=True`` the returned handle stays pending while the channel is
        full and completes once the item is in the channel; do not modify the item's
        tensors before then.

        Args:
            item: Any picklable object; tensors must be dense, contiguous CPU tensors.
            async_op: Return a :class:`ChannelWork` at once instead of waiting.
            timeout: Seconds to wait for room (None: no limit); the payload transfer
                after it is bounded by the channel's ``transfer_timeout``.

        Returns:
            None, or a :class:`ChannelWork` whose ``wait()`` returns None.

        Raises:
            ChannelFull: No room within ``timeout`` (the item was not added).
            ValueError: ``timeout`` is negative, or the item cannot be sent (a tensor
                not on CPU or not contiguous, an unpicklable object).
            ChannelError: The transfer failed (the item was not added).
            ChannelClosedError: The channel is destroyed or its worker died.

        Example:
            >>> channel.put({"step": 3, "obs": torch.zeros(8)})  # doctest: +SKIP
            >>> channel.put(torch.ones(4), async_op=True).wait()  # doctest: +SKIP
        """
        timeout = check_timeout(timeout)
        link = self._link()
        done = link.credit_put(item, async_op)
        if done is not NO_CREDIT:
            return done
        op = link.submit(
            "put",
            lambda t: link.actor.put_begin.remote(link.peer, t, True, timeout, link.want_credits()),
            item,
        )
        return link.follow(op) if async_op else link.run(op, link.limit(timeout))

    def put_nowait(self, item: Any) -> None:
        """Append ``item`` if there is room now; never wait for room.

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
        link = self._link()
        if link.credit_put(item, False) is not NO_CREDIT:
            return
        op = link.submit(
            "put", lambda t: link.actor.put_begin.remote(link.peer, t, False, None), item
        )
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
    ) -> Any:
        link = self._link()
        with link._lock:
            if link.orphans:  # items a get abandoned after they were granted
                taken = [link.orphans.popleft() for _ in range(min(max_items, len(link.orphans)))]
                value = taken if batch else taken[0]
                if not async_op:
                    return value
                work = ChannelWork(None)
                work._finish(value)
                return work
        op = link.submit(
            "get",
            lambda t: link.actor.get_begin.remote(
                link.peer, t, max_items, max_bytes, block, timeout, link.sync()
            ),
            batch=batch,
        )
        return link.follow(op) if async_op else link.run(op, link.limit(timeout))

    def get(self, async_op: bool = False, *, timeout: float | None = None) -> Any:
        """Remove and return the oldest item; wait while the channel is empty.

        Args:
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
        timeout = check_timeout(timeout)
        return self._get(1, None, True, timeout, batch=False, async_op=async_op)

    def get_nowait(self) -> Any:
        """Remove and return the oldest item if the channel holds one; never wait for a put.

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
        return self._get(1, None, False, 0.0, batch=False, async_op=False)

    def get_batch(
        self,
        max_items: int,
        async_op: bool = False,
        *,
        max_bytes: int | None = None,
        timeout: float | None = None,
    ) -> Any:
        """Remove and return up to ``max_items`` items, oldest first, in one exchange.

        Batching is by count and bytes, not by waiting: the call waits (up to
        ``timeout``) only for the first item, then also takes the items that are
        already in the channel, up to ``max_items`` of them and while their tensor
        bytes (see below) keep the batch's total within ``max_bytes``. The first item
        is always taken, however large. Tensor bytes count the tensors of an item (a
        tensor, a list/tuple/dict of tensors, dataclass tensor fields); other parts of
        an item count as 0.

        Args:
            max_items: Most items to return (>= 1).
            async_op: Return a :class:`ChannelWork` at once instead of waiting.
            max_bytes: Bound on the batch's tensor bytes after its first item (None:
                no bound).
            timeout: Seconds to wait for the first item (None: no limit).

        Returns:
            A non-empty list of items, or a :class:`ChannelWork` whose ``wait()``
            returns it.

        Raises:
            TypeError: ``max_items`` or ``max_bytes`` is not an int.
            ValueError: ``max_items`` < 1, ``max_bytes`` < 1, or ``timeout`` negative.
            ChannelEmpty: No item within ``timeout``.
            ChannelError: Every transfer failed (the items went back to the head).
            ChannelClosedError: The channel is destroyed or its worker died.

        Example:
            >>> batch = channel.get_batch(32, max_bytes=64 << 20, timeout=5.0)  # doctest: +SKIP
        """
        if isinstance(max_items, bool) or not isinstance(max_items, int):
            raise TypeError(f"max_items must be an int, got {max_items!r}")
        if not 1 <= max_items <= MAX_BATCH:
            raise ValueError(f"max_items must be in 1..{MAX_BATCH}, got {max_items}")
        if max_bytes is not None:
            if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
                raise TypeError(f"max_bytes must be an int or None, got {max_bytes!r}")
            if max_bytes < 1:
                raise ValueError(f"max_bytes must be >= 1 or None, got {max_bytes}")
        timeout = check_timeout(timeout)
        return self._get(max_items, max_bytes, True, timeout, batch=True, async_op=async_op)

    # -- state --------------------------------------------------------------------------

    def _query(self, method: str, timeout: float | None) -> Any:
        timeout = check_timeout(timeout)
        link = self._link()
        try:
            ref = getattr(link.actor, method).remote(link.peer, link.sync())
            return ray.get(ref, timeout=timeout)
        except ray.exceptions.GetTimeoutError as exc:
            raise ChannelClosedError(
                f"channel {self.name!r}: no answer from its channel worker within {timeout} s"
            ) from exc
        except ray.exceptions.RayError as exc:
            raise ChannelClosedError(
                f"channel {self.name!r}: its channel worker is gone ({exc})"
            ) from exc

    def qsize(self, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT) -> int:
        """Number of items in the channel (a snapshot, like ``queue.Queue``'s).

        Counts the queued items and those whose put was granted and whose payload is on
        its way in; not the items already taken by a get.

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.

        Example:
            >>> channel.qsize()  # doctest: +SKIP
            3
        """
        return int(self._query("qsize", timeout))

    def empty(self, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT) -> bool:
        """Whether the channel holds no item (``qsize() == 0``; a snapshot).

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.
        """
        return self.qsize(timeout=timeout) == 0

    def full(self, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT) -> bool:
        """Whether a put would wait now: ``maxsize`` items are held (a snapshot).

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.
        """
        st = self.stats(timeout=timeout)
        return bool(st["maxsize"] > 0 and st["held"] >= st["maxsize"])

    def stats(self, *, timeout: float | None = DEFAULT_QUERY_TIMEOUT) -> dict[str, Any]:
        """Counters of the channel worker.

        Returns:
            A dict with ``maxsize``, ``held`` (slots in use: items arriving, queued
            or being sent to a consumer), ``queued`` (ready to get), ``arriving``
            (payloads on their way in), ``waiting_putters``,
            ``waiting_getters``, ``credits`` (slots lent to producers ahead of their
            puts, see the channels guide), ``puts`` and ``gets`` (completed transfers), ``voids``
            (abandoned puts), ``failures`` (failed transfers), ``resets`` (links
            reset), ``peers`` (peer name -> link generation) and ``closed``.

        Raises:
            ChannelClosedError: The channel worker is gone or did not answer in time.
        """
        return dict(self._query("state", timeout))

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
            ray.kill(link.actor, no_restart=True)
            self.close()


def connect_on(endpoint: Any, name: str, timeout: float | None) -> Channel:
    """Return ``endpoint``'s handle on channel ``name`` (connecting once per process)."""
    check_channel_name(name)
    timeout = check_timeout(timeout)
    cached: Channel | None = cached_handle(endpoint, name)
    if cached is not None:
        return cached
    link = connect_link(endpoint, name, timeout)
    job = endpoint.job
    handle = Channel(name, (job.store_host, job.store_port), link)
    remember_handle(endpoint, handle)
    return handle


def _restore(name: str, store: tuple[str, int]) -> Channel:
    """Unpickle a handle: this process's handle if it has one, else one that connects lazily."""
    try:
        endpoint = endpoint_for_store(store)
    except Exception:
        return Channel(name, store)
    cached: Channel | None = cached_handle(endpoint, name)
    return cached if cached is not None else Channel(name, store)
