"""The CPU transport: one gloo process group per direction of a two-party group.

Process groups are built standalone (``ProcessGroupGloo(store, rank, 2, options)``), never
through ``init_process_group``, so they do not touch a default process group the user
may have. Each direction has its own group, so the two directions never share a socket
pair or a tag space, and messages of one direction arrive in the order they were sent.

An accelerator transport (issue 8) adds a sibling of :class:`GlooLink` selected by the
frame's device kind; the direction code talks to links only through ``send``/``recv``.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import torch
import torch.distributed as dist

from p2p_collective._errors import CollectiveError, CollectiveTimeoutError, PeerError

StoreLike = Any  # a torch.distributed.Store (not re-exported for type checkers)

_PREFIX_STORE: Any = dist.PrefixStore  # type: ignore[attr-defined]
_FOREVER = datetime.timedelta(days=30)  # "no limit": larger values overflow gloo's clock math
_TAG = 0


def remaining(deadline: float | None) -> float | None:
    """Seconds left until a ``time.monotonic()`` deadline (None: no limit), at least 0."""
    if deadline is None:
        return None
    return max(0.0, deadline - time.monotonic())


def to_timedelta(seconds: float | None) -> datetime.timedelta:
    """A timedelta for torch APIs; ``None`` becomes a very long one, 0 becomes 1 ms."""
    if seconds is None:
        return _FOREVER
    return datetime.timedelta(seconds=max(seconds, 0.001))


def deadline_after(seconds: float | None) -> float | None:
    """The ``time.monotonic()`` deadline ``seconds`` from now (None: no limit)."""
    return None if seconds is None else time.monotonic() + seconds


def _is_timeout(exc: BaseException) -> bool:
    return (
        isinstance(exc, TimeoutError)
        or "timed out" in str(exc).lower()
        or ("timeout" in str(exc).lower())
    )


def make_device(host: str) -> Any:
    """A gloo TCP device bound to ``host`` (an address of this machine, e.g. 127.0.0.1)."""
    return dist.ProcessGroupGloo.create_device(hostname=host)


def _new_gloo_group(store: StoreLike, rank: int, device: Any, timeout: datetime.timedelta) -> Any:
    gloo: Any = dist.ProcessGroupGloo
    make_options = getattr(gloo, "_Options", None)
    if make_options is None:  # pragma: no cover - older/newer torch without device options
        # The timedelta constructor picks its device from GLOO_SOCKET_IFNAME or the hostname.
        return gloo(store, rank, 2, timeout)
    # The options object is the only way to hand gloo a device bound to our host; the
    # timedelta constructor would pick one from the hostname or GLOO_SOCKET_IFNAME.
    opts = make_options()
    opts._devices = [device]
    opts._timeout = timeout
    opts._threads = 1  # point-to-point ops never use gloo's collective thread pool
    return gloo(store, rank, 2, opts)


class GlooLink:
    """One direction of a group: a two-rank gloo process group and the peer's name.

    ``send``/``recv`` move the bytes of one flat ``uint8`` tensor as one gloo message and
    block until done or until the deadline; failures become
    :class:`CollectiveTimeoutError` or :class:`PeerError`.
    """

    def __init__(self, pg: Any, rank: int, peer: str) -> None:
        self._pg: Any = pg
        self._peer_rank = 1 - rank
        self.peer = peer

    @classmethod
    def connect(
        cls,
        store: StoreLike,
        prefix: str,
        rank: int,
        device: Any,
        peer: str,
        timeout: float | None,
    ) -> GlooLink:
        """Build the process group under ``prefix``; the peer must be doing the same.

        Raises:
            CollectiveTimeoutError: The peer did not connect in time.
            CollectiveError: Gloo failed to connect.
        """
        try:
            pg = _new_gloo_group(_PREFIX_STORE(prefix, store), rank, device, to_timedelta(timeout))
        except Exception as exc:
            if _is_timeout(exc):
                raise CollectiveTimeoutError(
                    f"peer {peer!r} did not connect the process group {prefix!r} within {timeout} s"
                ) from exc
            raise CollectiveError(
                f"could not connect the process group {prefix!r} to peer {peer!r}: {exc}"
            ) from exc
        return cls(pg, rank, peer)

    def _run(self, what: str, tensor: torch.Tensor, deadline: float | None, send: bool) -> None:
        pg = self._pg
        if pg is None:
            raise CollectiveError(f"{what} with peer {self.peer!r}: the link is closed")
        left = remaining(deadline)
        try:
            if left == 0.0:
                raise TimeoutError("deadline already passed")
            if send:
                work = pg.send([tensor], self._peer_rank, _TAG)
            else:
                work = pg.recv([tensor], self._peer_rank, _TAG)
            work.wait(to_timedelta(left))
        except Exception as exc:
            if _is_timeout(exc):
                raise CollectiveTimeoutError(
                    f"{what} of {tensor.numel()} bytes with peer {self.peer!r} did not"
                    f" complete in time ({left if left is not None else 'no'} s left)"
                ) from exc
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise PeerError(f"{what} with peer {self.peer!r} failed: {first}") from exc

    def send(self, tensor: torch.Tensor, deadline: float | None) -> None:
        """Send the bytes of a flat uint8 tensor as one message."""
        self._run("send", tensor, deadline, send=True)

    def recv(self, tensor: torch.Tensor, deadline: float | None) -> None:
        """Receive one message into a flat uint8 tensor (the message may be shorter)."""
        self._run("recv", tensor, deadline, send=False)

    def close(self) -> None:
        """Drop the process group; its sockets close once no pending op holds it."""
        self._pg = None
