"""What a process's channel operations learn when its link to the channel worker fails.

A reset link and a dead channel worker look the same from the process, so Ray is asked
whether the channel worker lives: waiting operations then fail with
:class:`ChannelError` (nothing was put or taken) or :class:`ChannelClosedError`. Puts
whose payload had left but whose receipt had not come yet are settled by asking the
channel worker how many of that link's payloads arrived.
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future

import ray

from p2p_worker._channels._client.work import ChannelWork, Granted
from p2p_worker._channels._protocol.actor import ChannelActor
from p2p_worker._channels._protocol.errors import ChannelClosedError, ChannelError

PROBE_TIMEOUT = 10.0  # seconds to ask Ray whether a channel whose link failed still lives


class Unconfirmed:
    """Puts whose payload left on the current link, until a receipt says it arrived.

    Each is numbered by its place among the link's payloads (items and voids, counted
    from 1); the channel worker's receipt names how many arrived. A put completes only
    then, so once it returned its item is in the channel for every later call of any
    process. Not thread-safe: the link holds its lock around every call.
    """

    def __init__(self) -> None:
        self._puts: deque[tuple[int, ChannelWork]] = deque()

    def expect(self, number: int, work: ChannelWork) -> None:
        """The put of ``work`` sent the link's payload ``number``."""
        self._puts.append((number, work))

    def confirmed(self, arrived: int) -> list[ChannelWork]:
        """The puts among the first ``arrived`` payloads (no longer waiting)."""
        done = []
        while self._puts and self._puts[0][0] <= arrived:
            done.append(self._puts.popleft()[1])
        return done

    def take(self) -> list[tuple[int, ChannelWork]]:
        """Every waiting put with its number (the link failed); none wait afterwards."""
        puts, self._puts = list(self._puts), deque()
        return puts


def fail_ops_soon(
    actor: ChannelActor,
    peer: str,
    name: str,
    exc: BaseException,
    report: tuple[int, dict[int, int]],
    pending: dict[int, Future[Granted]],
    unconfirmed: list[tuple[int, ChannelWork]],
    on_gone: Callable[[], None] = lambda: None,
) -> None:
    """:func:`fail_ops` in a thread of its own (it asks Ray); the same arguments."""
    args = (actor, peer, name, exc, report, pending, unconfirmed, on_gone)
    threading.Thread(target=fail_ops, args=args, name="p2p-channel-failed", daemon=True).start()


def fail_ops(
    actor: ChannelActor,
    peer: str,
    name: str,
    exc: BaseException,
    report: tuple[int, dict[int, int]],
    pending: dict[int, Future[Granted]],
    unconfirmed: list[tuple[int, ChannelWork]],
    on_gone: Callable[[], None],
) -> None:
    """Settle the operations of ``peer``'s failed link ``report[0]`` to channel ``name``.

    Runs in a thread of its own (it asks Ray). ``report`` says which unacknowledged
    items of the link arrived here (see ``ChannelLink.got_report``); it goes to the
    channel worker first. ``pending`` are the requests without an answer, ``unconfirmed``
    the puts without a receipt. ``on_gone`` runs before anything fails when the channel
    worker is gone.
    """
    gen, got = report
    if got:
        with contextlib.suppress(Exception):
            actor.settle.remote(peer, gen, got)
    try:
        alive = bool(ray.get(actor.alive.remote(), timeout=PROBE_TIMEOUT))
    except Exception:  # RayActorError, or Ray refusing to submit to a dead actor
        alive = False
    err: ChannelError
    if alive:
        err = ChannelError(
            f"channel {name!r}: the link to its channel worker failed ({exc}); nothing"
            " was put or taken"
        )
    else:
        on_gone()
        err = ChannelClosedError(f"channel {name!r}: its channel worker is gone ({exc})")
    err.__cause__ = exc
    for fut in pending.values():
        if not fut.done():
            fut.set_exception(err)
    if not unconfirmed:
        return
    # Puts whose payload left: those the channel worker has (in the first ``arrived``
    # payloads of the link) succeeded; the others were not added.
    arrived: int | None = None
    if alive:
        with contextlib.suppress(Exception):
            arrived = ray.get(actor.arrived.remote(peer, gen), timeout=PROBE_TIMEOUT)
    if arrived is None:
        arrived = 0
        err = ChannelClosedError(
            f"channel {name!r}: the link failed ({exc}) before the channel worker"
            " confirmed the item, and it cannot say whether the item arrived"
        )
        err.__cause__ = exc
    for number, work in unconfirmed:
        if number <= arrived:
            work._finish(None)
        else:
            work._finish(exception=err)
