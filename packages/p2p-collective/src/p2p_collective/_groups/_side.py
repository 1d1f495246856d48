"""One side of a two-member group: its direction queue, its lazily joined link, its buffers."""

from __future__ import annotations

from typing import Protocol

import torch

from p2p_collective._compression import WireStats
from p2p_collective._compression._decode_rates import DecodeReporter
from p2p_collective._deadline import min_timeout, remaining
from p2p_collective._errors import (
    CleanFailure,
    CollectiveError,
    FramingError,
    GroupClosedError,
    PeerError,
)
from p2p_collective._frames._framing import HEADER_MAX
from p2p_collective._groups._direction import Direction
from p2p_collective._links._emulation import ArrivalGate
from p2p_collective._links._link import Link
from p2p_collective._links._transport import LinkFactory, StoreLike
from p2p_collective._peers._auth import JobAuth
from p2p_collective._peers._peer import Life, Peer
from p2p_collective._peers._rendezvous import private_client, wait_key
from p2p_collective._wire._headers import HeaderReceiver

_OUT_MSG_VIEWS = 256  # message sizes whose send-buffer views a direction keeps


class SideOwner(Protocol):
    """What a side needs of its group (:class:`~p2p_collective.CollectiveGroup`)."""

    name: str
    rank: int
    self_name: str
    peer_name: str
    store: StoreLike
    links: LinkFactory
    init_timeout: float | None
    peer: Peer
    instance: str
    auth: JobAuth | None
    wire_fingerprint: str
    decoder_threads: int  # 0: compression off (nothing to decode)

    @property
    def closed(self) -> bool: ...

    @property
    def life(self) -> Life | None: ...

    def check_peer(self, store: StoreLike, what: str) -> None: ...

    def stopped(self, store: StoreLike, what: str) -> bool: ...

    def incarnation(self, store: StoreLike) -> int: ...

    def bind(self, life: Life, what: str) -> None: ...


class Side:
    """The transport state of one direction: lazily connected link and sequence counter."""

    def __init__(self, group: SideOwner, role: str) -> None:
        self.role = role
        src, dst = (group.rank, 1 - group.rank) if role == "send" else (1 - group.rank, group.rank)
        self.direction_key = f"{src}to{dst}"
        # A receive that finds the stream out of step (FramingError) also hangs up the
        # link, so the peer's pending send fails at once instead of at its deadline.
        self.direction = Direction(
            f"p2p[{group.name}].{role}", self._hang_up if role == "recv" else None
        )
        self.link: Link | None = None
        self.store: StoreLike | None = None
        self.seq = 0
        # Sending: small objects and send_tensor headers are written here when their turn
        # comes. Receiving: header messages, the next ones' receives posted ahead.
        self.out = torch.zeros(HEADER_MAX if role == "send" else 0, dtype=torch.uint8)
        self.out_view = self.out.numpy().data
        self._out_msgs: dict[int, torch.Tensor] = {}  # n -> self.out[:n], reused
        self.headers = HeaderReceiver()
        self.nowait: tuple[torch.Tensor, memoryview] | None = None  # recv_nowait's buffer
        self.wire_stats = WireStats()  # tensors compressed / raw, codec and pacing time
        # Receiving: holds frames from an emulated link until their emulated arrival.
        self.gate = ArrivalGate(f"p2p[{group.name}].recv from {group.peer_name!r}")
        self._group = group

    def out_msg(self, n: int) -> torch.Tensor:
        """The first ``n`` bytes of the send buffer as a tensor, one view per size.

        Views are reused: slicing a tensor costs about a microsecond, a fair share of a
        small message's budget.
        """
        msg = self._out_msgs.get(n)
        if msg is None:
            if len(self._out_msgs) >= _OUT_MSG_VIEWS:
                self._out_msgs.clear()
            msg = self._out_msgs[n] = self.out[:n]
        return msg

    def ensure_link(self, deadline: float | None) -> Link:
        """Return the link, joining the peer first if this is the direction's first use.

        The rendezvous is the peer's (:meth:`Peer.meet_direction`): job token, wire
        fingerprint, clock and the peer's instance, to which the group is then bound.
        """
        if self.link is not None:
            return self.link
        g = self._group
        if g.closed:
            raise CleanFailure(GroupClosedError(f"p2p[{g.name}]: the group was closed"))
        wait = min_timeout(g.init_timeout, remaining(deadline))
        what = f"p2p[{g.name}].{self.role}"
        try:
            g.check_peer(g.store, what)  # a peer known dead fails here, not at the timeout
            if self.store is None:
                self.store = private_client(g.store, wait)
            store = self.store
            prefix = f"p2p/{g.name}/{g.incarnation(store)}/{self.direction_key}"
            life, shared = g.peer.meet_direction(
                store,
                prefix,
                self.role,
                instance=g.instance,
                fingerprint=g.wire_fingerprint,
                self_name=g.self_name,
                auth=g.auth,
                timeout=wait,
                cancelled=lambda: g.stopped(store, what),
            )
            g.bind(life, what)
            if self.role == "recv":
                self.gate.shared_clock = shared
        except CollectiveError as exc:  # nothing is on the wire yet: retry later is fine
            raise CleanFailure(exc) from exc
        self.link = g.links.connect(
            store,
            prefix,
            g.rank,
            self.role == "recv",
            g.peer_name,
            g.init_timeout,
            wait_key=lambda key, t: wait_key(store, key, t, lambda: g.stopped(store, what)),
        )
        self.link.set_on_gone(self._link_gone)
        if self.role == "send":  # an adaptive sender hears how fast the peer decodes
            self.link.set_on_record(self._record)
        elif g.decoder_threads:
            self.wire_stats.reporter = DecodeReporter(self.link.send_record, g.decoder_threads)
        return self.link

    def _record(self, record: bytes) -> None:
        """A record the receiver sent back (the watcher thread): for the link's advisor."""
        advisor = self.wire_stats.advisor
        if advisor is not None:
            advisor.observe_feedback(record, repr(self._group.peer_name))

    def _link_gone(self, exc: PeerError, died: bool) -> None:
        """The link's liveness connection ended: the peer died, or closed this group."""
        life = self._group.life
        if died and life is not None:
            life.end(exc)  # every group bound to that life hears it, this one included
        else:
            self.direction.abort(exc)

    def _hang_up(self, exc: BaseException) -> None:
        if isinstance(exc, FramingError):
            self.close()

    def close(self) -> None:
        self.headers.discard()
        if self.link is not None:
            self.link.close()
            self.link = None
        self.store = None
