"""The job's rendezvous store: a TCPStore server owned by the driver, bound to one IP."""

from __future__ import annotations

import datetime
import socket

from torch.distributed import TCPStore  # type: ignore[attr-defined]

from p2p_worker._errors import ClusterError


class RendezvousStore:
    """A ``torch.distributed.TCPStore`` server in the driver process, for one job.

    Every worker of the job connects a client to it and hands it to its
    ``p2p_collective.Collective``, which uses it to meet its peers. The server listens on
    a free port of ``host`` only: the socket is bound here and passed to the store as
    ``master_listen_fd``, because a TCPStore given a host name still listens on all
    interfaces (measured on torch 2.13). It lives as long as this object; :meth:`close`
    stops it.

    Args:
        host: IP address to listen on (the driver's node IP; ``127.0.0.1`` locally).
        timeout: Seconds a store operation on the server side may block.

    Raises:
        ClusterError: The socket cannot be bound or the store cannot start.

    Example:
        >>> store = RendezvousStore("127.0.0.1")
        >>> client = RendezvousStore.connect(store.host, store.port, timeout=5.0)
        >>> client.set("k", b"v"); store.store.get("k")
        b'v'
        >>> store.close()
    """

    def __init__(self, host: str, *, timeout: float = 300.0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, 0))
            sock.listen(512)
            port = int(sock.getsockname()[1])
        except OSError as exc:
            sock.close()
            raise ClusterError(f"cannot bind the rendezvous store to {host}: {exc}") from exc
        fd = sock.detach()  # the store owns the listening socket from here on
        try:
            self.store: TCPStore | None = TCPStore(
                host,
                port,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=timeout),
                master_listen_fd=fd,
            )
        except Exception as exc:
            socket.close(fd)
            raise ClusterError(f"cannot start the rendezvous store on {host}: {exc}") from exc
        self.host = host
        self.port = port

    @staticmethod
    def connect(host: str, port: int, *, timeout: float | None = 300.0) -> TCPStore:
        """Open a client connection to a rendezvous store.

        Args:
            host: The store's IP address.
            port: The store's port.
            timeout: Seconds to wait for the connection and for each blocking store
                operation; ``None`` means one day.

        Returns:
            A connected ``TCPStore`` client.

        Raises:
            ClusterError: The store cannot be reached within ``timeout``.
        """
        seconds = 86400.0 if timeout is None else timeout
        try:
            return TCPStore(
                host, port, is_master=False, timeout=datetime.timedelta(seconds=seconds)
            )
        except Exception as exc:
            raise ClusterError(
                f"cannot reach the rendezvous store at {host}:{port}: {exc}"
            ) from exc

    def close(self) -> None:
        """Stop the server; connected clients see errors from then on. Idempotent."""
        self.store = None

    def __repr__(self) -> str:
        state = "open" if self.store is not None else "closed"
        return f"<RendezvousStore {self.host}:{self.port} {state}>"
