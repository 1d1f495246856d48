"""Handles of channel operations, and what the client and the handle share."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from p2p_asyncwork import AsyncChannelWork, AsyncWork, WorkCancelledError, WorkTimeoutError
from p2p_asyncwork.internal import check_timeout
from p2p_worker._channels._protocol.errors import ChannelClosedError, ChannelError
from p2p_worker._channels._protocol.keys import DEFAULT_KEY

Outcome = tuple[object, BaseException | None]
"""One item a get was granted: ``(item, None)``, or ``(None, why its transfer failed)``."""
Granted = tuple[int, list[Outcome]]
"""What an op's future holds: the channel worker's answer code and the items that came."""

CONTROL_GRACE = 30.0  # seconds a blocking call waits past its own bounds for an answer


_local = threading.local()  # .depth: channel answers this thread is processing now


@contextlib.contextmanager
def answer_processing() -> Iterator[None]:
    """Mark this thread as processing a channel answer (running its handle's callbacks)."""
    _local.depth = getattr(_local, "depth", 0) + 1
    try:
        yield
    finally:
        _local.depth -= 1


def refuse_waiting_in_callback(what: str) -> None:
    """Refuse a blocking channel call from a channel handle's done-callback.

    Such a callback runs in the thread that processes channel answers (the link's
    receiving thread, or one holding the issue turn): a call that waits for another
    answer there would wait for itself, forever.

    Raises:
        ChannelError: Called while this thread processes a channel answer.
    """
    if getattr(_local, "depth", 0):
        raise ChannelError(
            f"{what} would block inside a channel handle's callback, which runs in the"
            " thread that processes channel answers, so it would wait for itself; use"
            " async_op=True (and then()/add_done_callback) there, or call it from another"
            " thread"
        )


class ChannelWork(AsyncChannelWork):
    """Handle of an asynchronous channel operation (``put``/``get`` with ``async_op=True``).

    An :class:`~p2p_asyncwork.AsyncChannelWork` whose :attr:`ref` is the future of the
    channel worker's answer (a ``concurrent.futures.Future``; None when no request was
    needed). It completes only when the payload transfer behind it is done: a
    put's handle stays pending while the channel is full and until its item is in the
    channel; a get's handle completes with the item (a list for ``get_batch``).

    :meth:`cancel` withdraws an operation that still waits for room or an item. When a
    coroutine awaiting the handle is cancelled, the operation is withdrawn the same way;
    if it was granted already, a put sends nothing and a got item is kept for this
    process's next get, so no item is lost or duplicated.

    Example:
        >>> work = channel.get(async_op=True)  # doctest: +SKIP
        >>> if not work.cancel():  # too late: the item is on its way  # doctest: +SKIP
        ...     item = work.wait()
    """

    def __init__(
        self, ref: Any, cancel: Callable[[bool, float | None], bool] | None = None
    ) -> None:
        AsyncWork.__init__(self)  # completed by the channel, not by the ref alone
        self.ref = ref
        self._transform = None
        self._cancel = cancel
        self.abandoned = False

    def cancel(self, *, timeout: float | None = CONTROL_GRACE) -> bool:
        """Withdraw the operation if it still waits for room (put) or an item (get).

        Args:
            timeout: Seconds to wait for the channel worker's answer.

        Returns:
            True when the operation was withdrawn: nothing was put or taken and the
            handle fails with :class:`~p2p_asyncwork.WorkCancelledError`. False when it
            is done or already granted (it then completes as usual).
        """
        if self.done() or self._cancel is None:
            return False
        withdrawn = self._cancel(True, check_timeout(timeout))
        if withdrawn:
            self._finish(exception=WorkCancelledError("the channel operation was cancelled"))
        return withdrawn

    async def async_wait(self) -> Any:
        """Like :meth:`AsyncWork.async_wait`; cancelling the awaiting task withdraws the op."""
        try:
            return await super().async_wait()
        except asyncio.CancelledError:
            if not self.done() and self._cancel is not None:
                self.abandoned = True
                self._cancel(False, None)
            raise

    def wait(self, timeout: float | None = None) -> Any:
        """Like :meth:`AsyncWork.wait`; refused (ChannelError) from a channel callback."""
        if not self.done() and (timeout is None or timeout > 0):
            refuse_waiting_in_callback("waiting for a pending channel operation")
        return super().wait(timeout)

    def _finish(self, result: object = None, exception: BaseException | None = None) -> bool:
        return self._complete(result=result, exception=exception)

    @staticmethod
    def _follow(work: AsyncWork[object], fn: Callable[[AsyncWork[object]], None]) -> None:
        work.add_done_callback(fn)  # same handle family: success and failure


class Op:
    """One issued put or get: its place in issue order, handle, item and get key."""

    __slots__ = ("batch", "inline", "item", "key", "kind", "seq", "work")

    def __init__(
        self,
        seq: int,
        kind: str,
        work: ChannelWork,
        item: object,
        batch: bool,
        inline: bool = False,
    ) -> None:
        self.seq = seq
        self.kind = kind
        self.work = work
        self.item = item
        self.batch = batch
        self.inline = inline  # a put whose item rode in its request (no payload follows)
        self.key: Hashable = DEFAULT_KEY  # a get's key: where its orphans belong


def wait_within(work: ChannelWork, limit: float | None, name: str) -> object:
    """Wait for ``work`` of channel ``name``; after ``limit`` seconds abandon it.

    Raises:
        ChannelClosedError: No answer within ``limit`` (the handle fails with it).
    """
    try:
        return work.wait(limit)
    except WorkTimeoutError:
        pass
    err = ChannelClosedError(
        f"channel {name!r}: no answer from its channel worker within {limit} s"
    )
    work._finish(exception=err)
    return work.wait(0)
