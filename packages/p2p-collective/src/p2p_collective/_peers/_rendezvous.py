"""Rendezvous through a key-value store: the ``Store`` protocol and the per-direction meeting.

A ``torch.distributed.TCPStore`` (or any ``torch.distributed.Store``) is used as is. Any
other object with ``set``/``get``/``add``/``wait`` is wrapped in a ``torch.distributed.Store``
subclass so gloo can use it too.

Each direction of a group meets under its own key prefix, which includes the group's
incarnation: both members count how often they have put a group with that key to use
(``store.add``), so the k-th incarnation on one side meets the k-th on the other, and a
group re-created on both sides (for instance after a restart) never reads the stale
addresses of an earlier incarnation.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch.distributed as dist

from p2p_collective._deadline import to_timedelta
from p2p_collective._errors import CollectiveError, CollectiveTimeoutError
from p2p_collective._links._transport import StoreLike
from p2p_collective._peers._auth import JobAuth

if TYPE_CHECKING:  # torch.distributed re-exports Store only at run time
    from torch._C._distributed_c10d import Store as TorchStore

_TorchStore: Any = dist.Store  # type: ignore[attr-defined]
_TCPStore: Any = dist.TCPStore  # type: ignore[attr-defined]


@runtime_checkable
class Store(Protocol):
    """What p2p-collective needs from a rendezvous store.

    ``torch.distributed.TCPStore`` satisfies it. ``wait`` must raise (any exception whose
    message mentions a timeout, or a ``TimeoutError``) when the keys do not appear in time.
    """

    def set(self, key: str, value: bytes) -> None:
        """Store ``value`` under ``key``."""

    def get(self, key: str) -> bytes:
        """Return the value of ``key``, waiting for it with the store's own timeout."""

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the integer under ``key``; return the new value."""

    def wait(self, keys: Sequence[str], timeout: datetime.timedelta) -> None:
        """Block until every key exists, or raise after ``timeout``."""


class _StoreAdapter(_TorchStore):  # type: ignore[misc]
    """A ``torch.distributed.Store`` that forwards to a duck-typed :class:`Store`."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self._inner = inner

    def set(self, key: str, value: Any) -> None:
        self._inner.set(key, bytes(value) if not isinstance(value, str) else value.encode())

    def get(self, key: str) -> bytes:
        return bytes(self._inner.get(key))

    def add(self, key: str, value: int) -> int:
        return int(self._inner.add(key, value))

    def wait(self, keys: list[str], timeout: datetime.timedelta | None = None) -> None:
        self._inner.wait(keys, timeout if timeout is not None else to_timedelta(None))

    def check(self, keys: list[str]) -> bool:
        checker = getattr(self._inner, "check", None)
        if checker is not None:
            return bool(checker(keys))
        try:
            self._inner.wait(keys, datetime.timedelta(milliseconds=1))
        except Exception:
            return False
        return True

    def clone(self) -> StoreLike:
        raise NotImplementedError("a wrapped store is shared, not cloned")


def as_torch_store(store: TorchStore | Store) -> StoreLike:
    """Return ``store`` as a ``torch.distributed.Store`` (wrapping it when needed).

    Raises:
        TypeError: ``store`` lacks one of ``set``/``get``/``add``/``wait``.
    """
    if isinstance(store, _TorchStore):
        return store
    missing = [m for m in ("set", "get", "add", "wait") if not callable(getattr(store, m, None))]
    if missing:
        raise TypeError(
            f"store: {type(store).__name__} is not a rendezvous store; it lacks"
            f" {', '.join(missing)} (a torch.distributed.TCPStore works)"
        )
    return _StoreAdapter(store)


def private_client(store: StoreLike, timeout: float | None) -> StoreLike:
    """A store client of its own for one direction, made within ``timeout`` seconds.

    A ``TCPStore`` client serializes its requests: one thread blocked in ``wait`` holds up
    every other thread's ``set`` on the same client, which would let the rendezvous of one
    group stall another's (gloo's own connect waits on the store). So each direction
    gets its own connection to the same server: for a ``TCPStore`` a new client whose
    connect timeout is ``timeout``; for another store that can ``clone()``, a clone made
    on a helper thread that is waited for at most ``timeout``; otherwise the store itself.

    Raises:
        CollectiveTimeoutError: The store did not answer in time (it is gone or busy).
        CollectiveError: The store refused the connection.
    """
    if isinstance(store, _TCPStore):
        try:
            return _TCPStore(
                store.host,
                store.port,
                is_master=False,
                timeout=to_timedelta(timeout),
                wait_for_workers=False,
            )
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CollectiveTimeoutError(
                f"could not connect a client to the rendezvous store at"
                f" {store.host}:{store.port} within {timeout} s: {first}"
            ) from exc
    clone = getattr(store, "clone", None)
    if clone is None:
        return store
    box: list[Any] = []

    def make() -> None:
        try:
            box.append(clone())
        except BaseException as exc:  # NotImplementedError: share the store instead
            box.append(exc)

    helper = threading.Thread(target=make, name="p2p-store-clone", daemon=True)
    helper.start()
    helper.join(timeout)
    if not box:
        raise CollectiveTimeoutError(f"the rendezvous store did not clone within {timeout} s")
    cloned = box[0]
    return cloned if isinstance(cloned, _TorchStore) else store


def wait_key(
    store: StoreLike, key: str, timeout: float | None, cancelled: Callable[[], bool]
) -> bool:
    """Poll ``store.check`` for ``key`` until it exists (True) or time runs out (False).

    Raises:
        CollectiveError: ``cancelled()`` returned True while waiting.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = 0.0005
    while True:
        if store.check([key]):
            return True
        if cancelled():
            raise CollectiveError(f"rendezvous at {key!r} cancelled: the group was closed")
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0)))
        pause = min(pause * 2, 0.05)


def claim_incarnation(store: StoreLike, group_key: str, rank: int) -> int:
    """Count one more incarnation of a group on this side; the k-th meets the peer's k-th.

    Raises:
        CollectiveError: The store failed.
    """
    key = f"p2p/{group_key}/incarnations/{rank}"
    try:
        return int(store.add(key, 1))
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {key!r}: {exc}") from exc


def meet(
    store: StoreLike,
    prefix: str,
    role: str,
    peer_role: str,
    peer: str,
    timeout: float | None,
    cancelled: Callable[[], bool] = lambda: False,
    auth: JobAuth | None = None,
    announcement: bytes = b"1",
) -> bytes:
    """Announce this side of one direction and wait for the peer's matching announcement.

    With ``auth``, both sides then prove that they hold the same job token (see
    :mod:`p2p_collective._peers._auth`); the token never enters the store.

    Args:
        store: The rendezvous store (a client private to this direction).
        prefix: Key prefix of the direction (group key, incarnation, direction).
        role: ``"send"`` or ``"recv"``: this side's role in the direction.
        peer_role: The other role.
        peer: Peer name, for error messages.
        timeout: Seconds to wait for the peer (None: no limit).
        cancelled: Polled while waiting; True stops the wait with a CollectiveError (it
            may also raise, e.g. a PeerError when the peer is known dead).
        auth: This process's job token check, or None for none at all.
        announcement: The value of this side's announcement (its instance id).

    Returns:
        The peer's announcement.

    Raises:
        CollectiveTimeoutError: The peer did not announce itself in time (retrying later
            with the same prefix is fine).
        AuthenticationError: The peer does not hold this process's job token, or one of
            the two holds none.
        CollectiveError: The store failed, or the wait was cancelled.
    """
    try:
        if auth is not None:
            auth.publish(store, prefix, role)  # before the announcement the peer waits for
        store.set(f"{prefix}/{role}", announcement)
        found = wait_key(store, f"{prefix}/{peer_role}", timeout, cancelled)
        theirs = bytes(store.get(f"{prefix}/{peer_role}")) if found else b""
    except CollectiveError:
        raise
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {prefix!r}: {exc}") from exc
    if not found:
        raise CollectiveTimeoutError(
            f"peer {peer!r} did not join {prefix!r} (as {peer_role}) within {timeout} s;"
            " is it running and using the same group? Each direction connects at its first"
            f" operation, so the peer joins as {peer_role} only once it calls"
            f" {'recv' if peer_role == 'recv' else 'send'} on this group (two peers that"
            " both send first on a new group wait for each other: let one receive first)"
        )
    if auth is not None:
        auth.verify(
            store,
            prefix,
            role,
            {peer_role: peer},
            f"rendezvous at {prefix!r}",
            timeout,  # the peer is there: its proof follows at once
            lambda key, t: wait_key(store, key, t, cancelled),
        )
    return theirs
