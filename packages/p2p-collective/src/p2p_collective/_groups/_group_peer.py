"""The peer's fate and the incarnation of a :class:`CollectiveGroup` (a mixin).

:class:`GroupPeer` binds a two-party group to one life of its peer (see
:mod:`p2p_collective._peers._peer`): the first life met is kept, a later one is refused
(the peer restarted), and the end of that life fails both directions at once. It also
claims the group's incarnation number at the first use of either direction. The calls
and the group's life are in ``_group.py``.
"""

from __future__ import annotations

import threading

from p2p_collective._errors import PeerError
from p2p_collective._groups._side import Side
from p2p_collective._links._transport import StoreLike
from p2p_collective._peers._peer import Life, Peer
from p2p_collective._peers._rendezvous import claim_incarnation


class GroupPeer:
    """The peer's fate of a :class:`CollectiveGroup`.

    A mixin without state of its own: :class:`CollectiveGroup`'s ``__init__`` sets every
    attribute declared here.
    """

    name: str
    rank: int
    peer_name: str
    peer: Peer
    _closed: bool
    _close_lock: threading.Lock
    _incarnation: int | None
    _life: Life | None
    _life_token: int
    _send: Side
    _recv: Side

    @property
    def life(self) -> Life | None:
        """The life of the peer this group is bound to (None before the first meeting)."""
        return self._life

    @property
    def peer_gone(self) -> bool:
        """Whether the peer this group is bound to is gone (every operation fails)."""
        life = self._life
        return life is not None and life.gone is not None

    def bind(self, life: Life, what: str) -> None:
        """Bind the group to ``life`` (the first one met); a later, other one is refused.

        Raises:
            PeerError: ``life`` has ended, or the group belongs to an earlier life of the
                peer (it restarted: create the group again).
        """
        with self._close_lock:
            if self._life is None:
                self._life = life
                self._life_token = life.subscribe(self._peer_died)
            elif self._life is not life:
                raise PeerError(
                    f"{what}: peer {self.peer_name!r} restarted (a new incarnation) since this"
                    " group met it; create the group again"
                )
        life.check(what)

    def check_peer(self, store: StoreLike, what: str) -> None:
        """Raise :class:`PeerError` when the peer is known dead (see :class:`Peer`)."""
        life = self._life
        if life is not None:
            life.check(what)
            self.peer.ask_oracle(what)
        else:
            self.peer.check_unbound(store, what)

    def stopped(self, store: StoreLike, what: str) -> bool:
        """The ``cancelled`` check of rendezvous waits: closed (True) or peer dead (raises)."""
        self.check_peer(store, what)
        return self._closed

    def _peer_died(self, exc: PeerError) -> None:
        for side in (self._send, self._recv):
            side.direction.abort(exc)

    def incarnation(self, store: StoreLike) -> int:
        """This group's incarnation number, claimed at the first use of either direction.

        Raises:
            CollectiveError: The store failed.
        """
        with self._close_lock:
            if self._incarnation is None:
                self._incarnation = claim_incarnation(store, self.name, self.rank)
            return self._incarnation
