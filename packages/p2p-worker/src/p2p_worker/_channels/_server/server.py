"""The channel worker: an asyncio Ray actor (a :class:`Worker`) that holds one channel.

Ray creates it, finds it and carries ``hello``, ``cancel``, ``reset_link``, ``state``,
``alive`` and ``destroy`` (``put_begin`` and ``qsize`` remain as Ray methods too); puts,
gets and ``Channel.qsize`` never make a Ray call. Each peer has two collective groups to
this worker, named with the peer's link generation:

- the *control group* carries the peer's requests, read in order by a
  :class:`~p2p_worker._channels._server.readers.RequestReader` (from the event loop itself
  for a same-node peer, else from the group's receiving thread); each request is served
  in turn (it takes its place among the channel's waiters in the order the peer issued
  it, :meth:`ChannelWorker._serve`), so a consumer's gets are served in the order it
  made them. A request that completes at once (room for a put, items for a get) while
  none of the peer's earlier requests waits is answered at once, without a task. A
  waiting request is an asyncio future on this actor's loop; completions of collective
  operations arrive on other threads and are handed to the loop with
  ``call_soon_threadsafe``.
- the *link* carries put payloads in, and answers out: ``(token, answer, count)``
  followed by the ``count`` items a get was granted (items without tensors ride inside
  the answer). Sent items keep their slots until the peer acknowledges them (``ACK`` on
  the control group, usually riding on its next request, see ``_channels._client.acks``; items
  a blocking get prefetched, one by one, see ``_channels._client.prefetch``); when the link fails
  first, they go back to the head, in order, so a consumer that dies loses no item.

A put request waits (FIFO) for a free slot, takes it and posts a receive on the link
for the payload; its answer grants the slot, and the producer then sends its item. No
payload ever travels without a slot, so ``maxsize`` bounds memory. A small item without
tensors may ride inside its put request instead (``PUT_INLINE``, see
``_channels._client.inline``): granted, it is queued at once: no payload receive, no payload
hand-off to the loop; while it waits, the request (item included) is all it holds, one per
producer at a time. A grant may also lend *credits*: further free slots, each with a
receive posted ahead, so the producer's next puts are plain sends without a request.
Credits count against ``maxsize`` like items; an idle producer hands unused ones back (a
``Void`` for each), and a get carries the caller's ``(gen, payloads sent)`` so its own
puts are waited for first (``sync``).

A failed transfer resets that peer's link: both groups are closed (their queued
operations fail at once), the generation is bumped, the peer's waiting requests end, and
its unacknowledged items go back to the head. The peer sees its link fail, asks Ray
whether the channel lives, and says hello again on its next operation.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from functools import partial

import ray
import torch

from p2p_asyncwork import AsyncWork
from p2p_collective import CollectiveGroup, GroupClosedError
from p2p_worker._channels._protocol.proto import (
    ChannelSpec,
    Hello,
    channel_address,
    control_group_name,
    link_group_name,
    pair,
    wire_timeout,
)
from p2p_worker._channels._server.launched import launched_spec
from p2p_worker._channels._server.lifetime import watch_store
from p2p_worker._channels._server.peers import Peer, Tokens
from p2p_worker._channels._server.puts import ChannelPuts
from p2p_worker._channels._server.queue import ChannelQueue, Item
from p2p_worker._channels._server.readers import PayloadReader
from p2p_worker._channels._server.replies import Replies
from p2p_worker._channels._server.requests import ChannelRequests
from p2p_worker._channels._server.sole import SoleConsumer
from p2p_worker._channels._server.views import ChannelViews
from p2p_worker._groups._group import WorkerGroup
from p2p_worker._info import WorkerInfo
from p2p_worker._process._untraced import untraced_internals
from p2p_worker._process._worker_base import WorkerBase
from p2p_worker._runtime._heap import settle_heap
from p2p_worker._runtime._state import WorkerRuntime

logger = logging.getLogger(__name__)

HOLD_WAIT = 30.0  # seconds a reset (live) peer's unacknowledged items wait for its report
HOLD_CHECK = 0.5  # seconds between checks that such a peer still lives
ARRIVED_WAIT = 30.0  # most seconds ``arrived`` waits for a reset link's receives to end
ARRIVED_POLL = 0.01  # seconds between its looks


@untraced_internals
class ChannelWorker(ChannelRequests, ChannelPuts, ChannelViews, WorkerBase):
    """The worker that holds one channel's items; one Ray actor per channel.

    ``create_channel`` starts one as a detached Ray actor on the requested node, so it
    outlives the worker that created it; it exits by itself when the job's rendezvous
    store goes away (the driver's ``Cluster`` shut down or died) or when the channel is
    destroyed. RLinf's way works too: ``ChannelWorker.create_group(maxsize=...)
    .launch(cluster, placement, name=...)`` launches it as a worker group of one, and
    the channel is then that group's name (``Channel.connect(name)``). A group of
    several (RLinf's distributed channel, one channel worker per node) is refused.

    Args:
        maxsize: Most items the channel holds at once, over all keys (int >= 0; 0: no
            bound). ``create_channel`` passes the whole spec (name, identity, bound and
            job context) instead.

    Raises:
        TypeError, ValueError: ``maxsize`` is not an int >= 0, or the group has more
            than one worker.
        WorkerError: Constructed with a ``maxsize`` outside a launched group.

    Example:
        >>> group = ChannelWorker.create_group(maxsize=8).launch(  # doctest: +SKIP
        ...     cluster, NodePlacementStrategy([0]), name="rollouts"
        ... )
        >>> channel = Channel.connect("rollouts")  # doctest: +SKIP
    """

    def __init__(self, maxsize: ChannelSpec | int = 0) -> None:
        super().__init__()
        if isinstance(maxsize, ChannelSpec):
            spec = maxsize
            node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
            address = channel_address(spec.name)
            self._p2p_runtime = WorkerRuntime(spec.job, address, node_ip)
            self._p2p_info = WorkerInfo(
                address=address,
                rank=0,
                node_id=spec.node_rank,
                gpu_id=None,
                node_ip=node_ip,
                ray_node_id=ray.get_runtime_context().get_node_id(),
                pid=os.getpid(),
            )
        else:
            spec = launched_spec(self, maxsize)
        self._spec = spec
        self._queue = ChannelQueue(spec.maxsize)
        self._replies = Replies(
            self._queue,
            spec.transfer_timeout,
            self._reset,
            self._reset_soon,
        )
        self._peers: dict[str, Peer] = {}
        self._serving: set[asyncio.Future[None]] = set()  # requests being served
        self._loop: asyncio.AbstractEventLoop | None = None
        self._counts = {"puts": 0, "gets": 0, "failures": 0, "resets": 0, "voids": 0, "inline": 0}
        self._counts["prefetched"] = 0
        self._sole = SoleConsumer()  # a get may prefetch only for it (_channels._client.prefetch)
        self._stop = threading.Event()
        threading.Thread(
            target=watch_store, args=(spec.job, self._stop), name="p2p-channel-watch", daemon=True
        ).start()
        # what exists now stays for the actor's life: out of later full collections
        settle_heap()

    @classmethod
    def create_group(cls, maxsize: int = 0) -> WorkerGroup[ChannelWorker]:
        """Describe a group of one channel worker (RLinf's); ``launch`` it to start it.

        Args:
            maxsize: Most items the channel holds at once (0: no bound).

        Returns:
            An unlaunched ``WorkerGroup``; the channel takes the name it is launched with.
        """
        return WorkerGroup(cls, (), {"maxsize": maxsize})

    # -- links --------------------------------------------------------------------------

    def _peer(self, name: str) -> Peer:
        peer = self._peers.get(name)
        if peer is None:
            peer = self._peers[name] = Peer(name)
        return peer

    def _group(self, peer: Peer) -> CollectiveGroup:
        if peer.group is None:
            me = self.worker_address.get_name()
            group = peer.group = pair(
                self.collective.create_collective_group(
                    [me, peer.name],
                    group_name=link_group_name(self._spec.uid, peer.name, peer.gen),
                )
            )
            gen = peer.gen
            peer.payload_reader = PayloadReader(
                self._event_loop(),
                group,
                wire_timeout(self._spec.transfer_timeout),
                lambda credit, obj, exc: self._payload_in(peer, group, gen, credit, obj, exc, True),
            )
        return peer.group

    def _reset(
        self,
        peer: Peer,
        group: CollectiveGroup | None,
        why: BaseException | None,
        hold: bool = True,
    ) -> None:
        """Drop ``peer``'s link (if ``group`` is still it): close, bump, wake its waiters.

        Items sent to the peer and not acknowledged yet may have arrived there (a live
        peer whose ack was still on its way): with ``hold`` they wait for the peer's
        report (:meth:`settle`, or its next ``hello``) for up to :data:`HOLD_WAIT`
        seconds, and only those that did not arrive go back to the head. Without
        ``hold`` (the peer left: it died, or closed after acknowledging what it took)
        they go back at once.
        """
        if peer.group is not group or group is None:
            return
        if why is not None:
            logger.warning(
                "channel %r: transfer with %s failed (%s: %s); resetting its link",
                self._spec.name,
                peer.name,
                type(why).__name__,
                why,
            )
        peer.group = None
        payloads, peer.payload_reader = peer.payload_reader, None
        ctl, peer.ctl, peer.gate = peer.ctl, None, None
        if peer.reader is not None:
            peer.reader.stop()
            peer.reader = None
        if ctl is not None:
            ctl.close(timeout=0.0)
        gen = peer.gen
        peer.gen += 1
        unacked, peer.unacked = peer.unacked, {}
        if unacked and hold:
            peer.held[gen] = unacked
            self._check_held(peer, gen, group, time.monotonic() + HOLD_WAIT)
        elif unacked:  # not known to have arrived: back to the head, in channel order
            self._settle_items(unacked, {})
        peer.payloads.forget_before(peer.gen)
        peer.wake(everyone=True)
        self._counts["resets"] += 1
        group.close(timeout=0.0)
        self._queue.reset_peer(peer.name)
        if payloads is not None:  # the payloads still expected on the link never come
            payloads.fail(GroupClosedError(f"{group.name}: the link was reset"))

    def _check_held(self, peer: Peer, gen: int, group: CollectiveGroup, until: float) -> None:
        """Put back the items held for ``peer``'s link ``gen`` once it is known dead or late.

        ``group`` (closed) still knows whether the peer's process is gone.
        """
        if gen not in peer.held:
            return  # settled by the peer's report
        if group.peer_gone or time.monotonic() >= until:
            self._settle(peer, gen, None)
            return
        loop = self._event_loop()
        loop.call_later(HOLD_CHECK, self._check_held, peer, gen, group, until)

    def _settle(self, peer: Peer, gen: int, got: dict[int, int] | None) -> None:
        """Settle the items held for ``peer``'s link ``gen``: ``got`` arrived there.

        ``got`` maps a get's token to how many of its items arrived (a prefix); None
        (no report in time) sends every held item back.
        """
        held = peer.held.pop(gen, None)
        if held:
            self._settle_items(held, got or {})

    def _settle_items(self, items: dict[int, list[Item]], got: dict[int, int]) -> None:
        """Free the slots of the items that arrived; the others go back to the head."""
        delivered, back = self._queue.settle(items, got)
        self._counts["gets"] += delivered
        self._counts["failures"] += back > 0

    async def settle(self, peer_name: str, gen: int, got: dict[int, int]) -> None:
        """A peer whose link ``gen`` failed reports the items that arrived there."""
        peer = self._peers.get(peer_name)
        if peer is not None:
            self._settle(peer, gen, got)

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        """This actor's event loop (remembered the first time, called on the loop)."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _reset_soon(self, peer: Peer, group: CollectiveGroup | None, why: BaseException) -> None:
        """:meth:`_reset` on the event loop, from any thread (a send that failed).

        Every send follows a request or a payload handled on the loop, which remembered
        the loop already.
        """
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._reset, peer, group, why)

    def _when_done(self, work: AsyncWork[object], fn: Callable[..., None], *args: object) -> None:
        """Run ``fn(*args, work)`` on the event loop once ``work`` has completed."""
        loop = self._event_loop()

        bound = partial(fn, *args)

        def done(w: AsyncWork[object]) -> None:
            # No task per transfer: the completing thread schedules a plain callback.
            loop.call_soon_threadsafe(bound, w)

        work.add_done_callback(done)

    # -- control calls (Ray) ------------------------------------------------------------

    async def hello(self, peer_name: str, got: tuple[int, dict[int, int]] | None = None) -> Hello:
        """Open a fresh link to ``peer_name`` and connect both its directions.

        ``got`` is a reconnecting peer's report on its previous link: ``(gen, {get
        token: items that arrived})`` (see :meth:`settle`).
        """
        peer = self._peer(peer_name)
        self._reset(peer, peer.group, None)
        if got is not None:
            self._settle(peer, *got)
        peer.tokens = Tokens()  # a new handle numbers its calls from 0
        group = self._group(peer)
        timeout = wire_timeout(self._spec.transfer_timeout)
        empty = torch.empty(0, dtype=torch.uint8)
        sent = group.send_tensor(empty, async_op=True, timeout=timeout)
        self._when_done(sent, self._finish_hello, peer, group)
        shaken = group.recv_tensor(empty, async_op=True, timeout=timeout)
        self._when_done(shaken, self._link_open, peer, group)
        me = self.worker_address.get_name()
        ctl = pair(
            self.collective.create_collective_group(
                [me, peer.name], group_name=control_group_name(self._spec.uid, peer.name, peer.gen)
            )
        )
        peer.ctl = ctl
        shake = ctl.recv_tensor(torch.empty(0, dtype=torch.uint8), async_op=True, timeout=timeout)
        self._when_done(shake, self._control_open, peer, group, ctl)
        return Hello(
            self._spec.name,
            self._spec.uid,
            self._spec.maxsize,
            self.worker_address.get_name(),
            peer.gen,
            timeout,
        )

    def _finish_hello(self, peer: Peer, group: CollectiveGroup, work: AsyncWork[object]) -> None:
        exc = work.exception(0)
        if exc is not None:
            self._reset(peer, group, exc)

    def _link_open(self, peer: Peer, group: CollectiveGroup, work: AsyncWork[object]) -> None:
        """The link's receiving side is connected: read payloads from the loop if it can.

        Without a descriptor (gloo) one receive is posted per expected payload instead,
        starting with those announced meanwhile.
        """
        self._finish_hello(peer, group, work)
        reader = peer.payload_reader
        if peer.group is not group or reader is None or reader.start():
            return
        peer.payload_reader = None
        for credit in reader.pending():
            self._post_payload_recv(peer, group, credit)

    async def _sync(self, peer_name: str | None, gen: int, sent: int) -> None:
        """Wait until the ``sent`` payloads of ``peer_name`` on ``gen`` have arrived.

        A caller's own puts are then visible to its later calls (``qsize``, ``get``).
        """
        peer = self._peers.get(peer_name) if peer_name is not None else None
        if peer is None or peer.gen != gen or peer.seen >= sent:
            return
        fut = asyncio.get_running_loop().create_future()
        peer.syncs.append((sent, fut))
        await asyncio.wait({fut}, timeout=self._spec.transfer_timeout)

    async def cancel(self, peer_name: str, token: int) -> bool:
        """Withdraw the peer's call ``token`` if it still waits (or has not arrived yet).

        Returns:
            True when the call will answer ``CANCELLED_ANSWER`` and nothing is put or
            taken; False when it was already granted or answered.
        """
        peer = self._peers.get(peer_name)
        if peer is None:
            return False
        if self._queue.cancel(peer_name, token):
            return True
        return peer.tokens.withdraw_early(token)

    async def alive(self) -> bool:
        """Whether the channel still serves (False once destroyed)."""
        return not self._queue.closed

    async def arrived(self, peer_name: str, gen: int) -> int | None:
        """How many payloads of ``peer_name``'s link ``gen`` arrived (None: unknown).

        Asked by a peer whose link failed while puts of its own waited for their receipt:
        those within the count are in the channel, the others are not. The link is reset
        first if it is still current, so the count is final: it is answered once no
        receive of that generation is still posted (their failures come at once after
        the reset), or after the transfer timeout (at most 30 s) with what arrived.
        """
        peer = self._peers.get(peer_name)
        if peer is None or not peer.payloads.known_from <= gen <= peer.gen:
            return None
        if peer.gen == gen and peer.group is not None:
            self._reset(peer, peer.group, RuntimeError("the peer's link failed"))
        limit = min(self._spec.transfer_timeout or ARRIVED_WAIT, ARRIVED_WAIT)
        deadline = time.monotonic() + limit
        while (count := peer.payloads.final(gen)) is None and time.monotonic() < deadline:
            await asyncio.sleep(ARRIVED_POLL)
        return peer.payloads.arrived(gen) if count is None else count

    async def reset_link(self, peer_name: str, gen: int) -> None:
        """A peer saw a transfer fail on generation ``gen``: reset its link if still current."""
        peer = self._peers.get(peer_name)
        if peer is not None and peer.gen == gen and peer.group is not None:
            self._reset(peer, peer.group, RuntimeError("the peer reported a failed transfer"))

    async def destroy(self) -> None:
        """Fail every waiting call, close every link and stop the watchdog."""
        self._queue.close()
        for peer in self._peers.values():
            if peer.reader is not None:
                peer.reader.stop()
                peer.reader = None
            if peer.payload_reader is not None:
                peer.payload_reader.stop()
                peer.payload_reader = None
            for group in (peer.group, peer.ctl):
                if group is not None:
                    group.close(timeout=0.0)
            peer.group = peer.ctl = None
        self._stop.set()
