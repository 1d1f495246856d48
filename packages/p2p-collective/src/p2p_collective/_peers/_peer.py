"""Peer: what this process knows about one remote process, and the fate of all toward it.

A :class:`~p2p_collective.Collective` keeps one :class:`Peer` per remote address. Every
group that includes that address (two-party or N-member) goes through it:

* **Identity at rendezvous.** Each direction's meeting (:meth:`Peer.meet_direction`)
  checks, in this order, the job token, the wire fingerprint (protocol version and
  compression config) and whose clock emulated arrival times are in, and learns the
  peer's *instance*: a random id its ``Collective`` drew when it was built. One instance
  is one :class:`Life` of the peer.
* **Liveness.** Every liveness connection toward the peer (one per connected direction
  or N-member group, see :mod:`p2p_collective._links._liveness`) reports to the peer. A
  connection that ends with the peer's goodbye byte was closed on purpose (that group
  was closed) and fails only that link's operation; one that ends without it, or
  fails, means the process is gone, and so does a ``False`` from the *oracle* the layer
  above may pass (p2p-worker asks Ray whether the peer's actor lives).
* **Fate.** When a life ends, every group bound to it is told at once (its pending and
  queued operations fail with :class:`PeerError`), and operations started later on
  those groups fail at once with :class:`PeerError`. A group is bound to the life it met
  at its first rendezvous. A group that has not met the peer yet is not bound: its
  rendezvous fails with :class:`PeerError` as soon as the peer's latest life has ended
  and no newer one has announced itself (looked at while it waits).

A new incarnation of the peer (a restarted process under the same address) draws a new
instance. Once it has announced itself in the store (at its first rendezvous) a group
created afterwards -- ``create_collective_group`` replaces a cached group whose peer
died -- meets it normally; groups bound to the old life stay failed.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from p2p_collective._compression import check_peer_wire_config, publish_wire_config
from p2p_collective._errors import CollectiveError, PeerError, PeerGoneError
from p2p_collective._links._emulation import publish_clock, shares_clock
from p2p_collective._peers._auth import JobAuth
from p2p_collective._peers._rendezvous import meet

_log = logging.getLogger("p2p_collective")

LivenessOracle = Callable[[str], bool]
"""``is_alive(address_name) -> bool`` given by the layer above (False: the peer is dead)."""

ORACLE_PERIOD = 1.0
"""Seconds between two questions to the oracle about the same peer."""
_STORE_PERIOD = 0.5  # seconds between two looks at the store for a new incarnation


def new_instance() -> str:
    """A fresh instance id for this process's Collective (one life, as its peers see it)."""
    return secrets.token_hex(8)


def instance_key(name: str) -> str:
    """Store key under which the latest instance of the process ``name`` is announced."""
    return f"p2p/instances/{name}"


class Life:
    """One incarnation of a remote process: its instance id and, once it ended, why.

    Listeners (groups bound to this life) are called once, from the thread that saw the
    end, with the :class:`PeerError` that ended it.
    """

    def __init__(self, peer: str, instance: str) -> None:
        self.peer = peer
        self.instance = instance
        self._lock = threading.Lock()
        self._gone: PeerError | None = None
        self._listeners: dict[int, Callable[[PeerError], None]] = {}
        self._next = 0

    @property
    def gone(self) -> PeerError | None:
        """The error that ended this life, or None while it lives."""
        return self._gone

    def subscribe(self, fn: Callable[[PeerError], None]) -> int:
        """Call ``fn(error)`` when this life ends (at once if it already has); a token."""
        with self._lock:
            token = self._next
            self._next += 1
            gone = self._gone
            if gone is None:
                self._listeners[token] = fn
        if gone is not None:
            fn(gone)
        return token

    def unsubscribe(self, token: int) -> None:
        """Forget a listener (a group that closed)."""
        with self._lock:
            self._listeners.pop(token, None)

    def end(self, error: PeerError) -> None:
        """Declare this life over; every listener is called once with ``error``."""
        with self._lock:
            if self._gone is not None:
                return
            self._gone = error
            listeners = list(self._listeners.values())
            self._listeners.clear()
        _log.warning("p2p: %s", error)
        for fn in listeners:
            try:
                fn(error)
            except Exception:  # one failing group must not keep the others from hearing it
                _log.exception("p2p: a peer-gone listener failed")

    def check(self, what: str) -> None:
        """Raise :class:`PeerError` (caused by the first one) if this life has ended."""
        gone = self._gone
        if gone is not None:
            raise dead_error(self.peer, what, gone)


def dead_error(peer: str, what: str, gone: PeerError) -> PeerGoneError:
    """A fresh error for ``what`` toward a peer whose life ended with ``gone``."""
    err = PeerGoneError(
        f"{what}: peer {peer!r} is gone ({gone}); a new incarnation of it can meet this"
        " process in a new group (create_collective_group returns one once it announced"
        " itself)"
    )
    err.__cause__ = gone
    return err


class Peer:
    """This process's view of one remote address (see the module docstring).

    Args:
        name: The remote address's name.
        oracle: Optional ``is_alive(name) -> bool`` from the layer above.
    """

    def __init__(self, name: str, oracle: LivenessOracle | None = None) -> None:
        self.name = name
        self._oracle = oracle
        self._lock = threading.Lock()
        self._life: Life | None = None
        self._asked = 0.0  # monotonic time of the last oracle question
        self._looked = 0.0  # monotonic time of the last look for a new incarnation
        self._announced: str | None = None  # the latest instance seen in the store

    def __repr__(self) -> str:
        life = self._life
        state = "unknown" if life is None else ("gone" if life.gone else "alive")
        return f"<Peer {self.name!r} {state}>"

    def current(self) -> Life | None:
        """The latest life this process met, or None before the first rendezvous."""
        return self._life

    def bind(self, instance: str) -> Life:
        """The life of ``instance`` (met at a rendezvous); a new one ends the previous one."""
        with self._lock:
            old = self._life
            if old is not None and old.instance == instance:
                return old
            self._life = life = Life(self.name, instance)
        if old is not None:  # the address now belongs to a new process: the old one is gone
            old.end(PeerError(f"peer {self.name!r} was replaced by a new incarnation"))
        return life

    def declare_dead(self, reason: str) -> None:
        """End the current life (if any) with ``reason``."""
        life = self._life
        if life is not None:
            life.end(PeerError(f"peer {self.name!r} {reason}"))

    # -- checks made while waiting for the peer --------------------------------------------

    def ask_oracle(self, what: str) -> None:
        """Ask the oracle (at most every :data:`ORACLE_PERIOD` s); raise if it says dead.

        An oracle that raises is logged and taken as "alive" (it cannot tell).

        Raises:
            PeerError: The oracle answered False; the current life (if any) ends too.
        """
        oracle = self._oracle
        if oracle is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._asked < ORACLE_PERIOD:
                return
            self._asked = now
        try:
            alive = bool(oracle(self.name))
        except Exception:
            _log.exception("p2p: the liveness oracle failed for %r", self.name)
            return
        if not alive:
            reason = "is dead according to the liveness oracle of the layer above"
            self.declare_dead(reason)
            raise PeerError(f"{what}: peer {self.name!r} {reason}")

    def check_unbound(self, store: Any, what: str) -> None:
        """For a group not bound to a life yet: refuse to wait for a peer known dead.

        When the latest life of the peer has ended and no newer instance has announced
        itself in the store, waiting could only end at the timeout: raise instead. The
        store is looked at every :data:`_STORE_PERIOD` seconds at most.

        Raises:
            PeerError: The peer is known dead and has not come back.
        """
        self.ask_oracle(what)
        life = self._life
        if life is None or life.gone is None:
            return
        now = time.monotonic()
        if now - self._looked >= _STORE_PERIOD:
            self._looked = now
            self._announced = announced_instance(store, self.name)
        if self._announced in (None, life.instance):
            raise dead_error(self.name, what, life.gone)

    def has_new_incarnation(self, store: Any) -> bool:
        """Whether the store announces an instance other than the (ended) latest life's."""
        life = self._life
        if life is None:
            return True
        announced = announced_instance(store, self.name)
        return announced is not None and announced != life.instance

    # -- one direction's rendezvous ------------------------------------------------------

    def meet_direction(
        self,
        store: Any,
        prefix: str,
        role: str,
        *,
        instance: str,
        fingerprint: str,
        self_name: str,
        auth: JobAuth | None,
        timeout: float | None,
        cancelled: Callable[[], bool],
    ) -> tuple[Life, bool]:
        """The identity checks of one direction's rendezvous; return the life met.

        Publishes this side's wire fingerprint (and, sending, its clock), meets the peer
        (job token proof included), compares the peer's fingerprint with ours and learns
        its instance.

        Returns:
            The peer's life and, for the receiving side, whether the peer reads the same
            clock (False for the sending side).

        Raises:
            CollectiveTimeoutError: The peer did not come in time.
            AuthenticationError: The job token check failed.
            CollectiveError: The configs differ, the store failed, or ``cancelled``.
            PeerError: ``cancelled`` found the peer dead.
        """
        peer_role = "recv" if role == "send" else "send"
        publish_wire_config(store, prefix, role, fingerprint)
        if role == "send":  # whose clock the emulated arrival times are in
            publish_clock(store, prefix)
        announce(store, self_name, instance)
        theirs = meet(
            store,
            prefix,
            role,
            peer_role,
            self.name,
            timeout,
            cancelled=cancelled,
            auth=auth,
            announcement=instance.encode(),
        )
        check_peer_wire_config(store, prefix, peer_role, fingerprint, self_name, self.name)
        shared = shares_clock(store, prefix) if role == "recv" else False
        return self.bind(theirs.decode(errors="replace")), shared


def announce(store: Any, name: str, instance: str) -> None:
    """Announce this process's instance under its name (a restarted peer is seen by it).

    Raises:
        CollectiveError: The store failed.
    """
    try:
        store.set(instance_key(name), instance.encode())
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {instance_key(name)!r}: {exc}") from exc


def announced_instance(store: Any, name: str) -> str | None:
    """The latest instance announced under ``name``, or None (none, or the store failed)."""
    key = instance_key(name)
    try:
        if not store.check([key]):
            return None
        return bytes(store.get(key)).decode(errors="replace")
    except Exception:
        return None


class Peers:
    """The :class:`Peer` s of one Collective, by remote name, created on first use."""

    def __init__(self, oracle: LivenessOracle | None = None) -> None:
        self.oracle = oracle
        self._lock = threading.Lock()
        self._peers: dict[str, Peer] = {}

    def get(self, name: str) -> Peer:
        """The Peer of ``name`` (created at the first request)."""
        with self._lock:
            peer = self._peers.get(name)
            if peer is None:
                peer = self._peers[name] = Peer(name, self.oracle)
            return peer
