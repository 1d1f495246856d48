"""Collective: the per-process factory and cache of two-party groups."""

from __future__ import annotations

import enum
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING

from p2p_asyncwork.internal import NO_LIMIT, check_timeout
from p2p_collective._compression import WireCodec
from p2p_collective._config import CollectiveConfig
from p2p_collective._errors import GroupClosedError
from p2p_collective._groups._group import CollectiveGroup
from p2p_collective._groups._multi import MultiCollectiveGroup
from p2p_collective._groups._multi_create import create_multi_group, join_ranked_group
from p2p_collective._links._transport import LinkFactory
from p2p_collective._peers._address import address_name
from p2p_collective._peers._auth import FROM_ENV, FromEnv, JobAuth, token_key
from p2p_collective._peers._peer import LivenessOracle, Peers, new_instance
from p2p_collective._peers._rendezvous import Store, as_torch_store
from p2p_compress import probe_codec_library

if TYPE_CHECKING:  # torch.distributed re-exports Store only at run time
    from torch._C._distributed_c10d import Store as TorchStore


class _Default(enum.Enum):
    CONFIG = "config"

    def __repr__(self) -> str:
        return "config.init_timeout"


_USE_CONFIG = _Default.CONFIG


_CLOSE_WAIT = 3.0  # seconds close() and exit give running operations of all groups to end


def _close_groups(
    groups: dict[str, CollectiveGroup],
    lock: threading.Lock,
    links: LinkFactory,
    wire: WireCodec | None,
) -> None:
    with lock:
        items = list(groups.values())
        groups.clear()
    for group in items:
        group._begin_close()
    deadline = time.monotonic() + _CLOSE_WAIT
    for group in items:  # one shared wait: running operations end, threads exit
        group._finish_close(deadline)
    links.close()
    if wire is not None:
        wire.close()


class Collective:
    """One per process: creates and caches the :class:`CollectiveGroup` s of this process.

    Args:
        address: This process's address: a name string, or an object with ``get_name()``
            (a p2p-worker ``WorkerAddress``).
        store: The rendezvous store shared with the peers: a
            ``torch.distributed.TCPStore`` works as is; any object with ``set``, ``get``,
            ``add`` and ``wait(keys, timedelta)`` is wrapped.
        host: Address of this machine that the gloo transport binds to (default
            loopback). Use the node's IP on a multi-node cluster; never ``0.0.0.0``.
        config: Job-level configuration: compression on the wire and its buffer pool,
            link emulation, timeouts. Every process of a job must hold the same
            ``compression`` section (checked when a group's direction is set up).
        timeout: Seconds the first operation of each direction of a group waits for the
            peer to join it (None: no limit). Defaults to ``config.init_timeout`` (60 s).
        job_token: A secret shared by every process of the job. At each rendezvous the
            members prove to each other that they hold it (an HMAC over fresh nonces;
            the token never enters the store), so a process without it cannot join a
            group: both sides fail with :class:`AuthenticationError`. Defaults to
            ``$P2P_JOB_TOKEN`` (unset or empty: none). ``None``: no token and no check;
            such a process can only meet peers that hold none either.
        is_alive: Optional liveness oracle ``is_alive(name) -> bool`` for a peer's address
            name, from the layer above (p2p-worker passes one that asks Ray whether the
            peer's actor lives). While an operation waits for a peer to join, it is asked
            about once a second; ``False`` fails everything toward that peer with
            :class:`PeerError`, even when nothing ever connected to it. An oracle that
            raises counts as "cannot tell". Without one, a death is seen by the
            liveness connections of the groups that connected to the peer.

    Peers and fate: this Collective keeps one peer record per remote address. A peer
    that dies (seen by any of its groups' connections or by ``is_alive``) fails every
    pending and later operation toward it, in every group, with :class:`PeerError`
    (:class:`PeerGoneError` for operations started afterwards) within about
    ``GONE_GRACE`` (2 s). A restarted process under the same address is a new
    incarnation: once it has announced itself (at its first rendezvous),
    :meth:`create_collective_group` returns a new group that meets it.

    Raises:
        TypeError: ``address`` or ``store`` is not usable, or ``job_token`` is not
            str/bytes/None.
        ValueError: ``host`` is empty or ``0.0.0.0``, ``timeout`` is negative, or
            ``job_token`` is empty.
        p2p_compress.CompressionError: ``config`` enables compression and the codec's
            library is missing or broken (probed here, when the config is loaded).

    Example:
        >>> import datetime, torch.distributed as dist  # doctest: +SKIP
        >>> store = dist.TCPStore("127.0.0.1", 29500, is_master=True,  # doctest: +SKIP
        ...                       timeout=datetime.timedelta(seconds=60))
        >>> coll = Collective("trainer", store)  # doctest: +SKIP
        >>> group = coll.create_collective_group(["trainer", "rollout"])  # doctest: +SKIP
        >>> group.send({"step": 1})  # doctest: +SKIP
    """

    def __init__(
        self,
        address: object,
        store: TorchStore | Store,
        *,
        host: str = "127.0.0.1",
        config: CollectiveConfig | None = None,
        timeout: float | _Default | None = _USE_CONFIG,
        job_token: str | bytes | FromEnv | None = FROM_ENV,
        is_alive: LivenessOracle | None = None,
    ) -> None:
        self.name = address_name(address)
        if is_alive is not None and not callable(is_alive):
            raise TypeError(
                "is_alive: expected a callable(name) -> bool or None, got"
                f" {type(is_alive).__name__}"
            )
        self.instance = new_instance()  # this process's life, as its peers see it
        self.peers = Peers(is_alive)
        self._auth = JobAuth(token_key(job_token))
        self._store = as_torch_store(store)
        if not isinstance(host, str) or not host or host in ("0.0.0.0", "::"):
            raise ValueError(
                f"host: got {host!r}; allowed: an address of this machine such as 127.0.0.1"
                " or the node IP (never a wildcard address)"
            )
        self.host = host
        if config is not None and not isinstance(config, CollectiveConfig):
            raise TypeError(f"config: expected a CollectiveConfig, got {type(config).__name__}")
        self.config = config if config is not None else CollectiveConfig()
        if timeout is _USE_CONFIG:
            self.init_timeout = self.config.init_timeout
        else:
            self.init_timeout = check_timeout(timeout, none=NO_LIMIT)
        self._lock = threading.Lock()
        self._groups: dict[str, CollectiveGroup] = {}
        self._wire: WireCodec | None = None
        compression = self.config.compression
        if compression is not None:
            # A missing codec library fails here, when the job's config is loaded; native
            # contexts come with the first eligible tensor, the pool starts empty.
            probe_codec_library(compression.codec_name)
            self._wire = WireCodec(
                compression, self.config.buffer_pool, self.config.compression_pipeline
            )
        self._links = LinkFactory(
            host,
            self.name,
            self.config.recv_buffer_cache_bytes,
            shared_memory=self.config.shared_memory,
            mac=self._auth.mac,
        )
        self._closed = False
        self._finalizer = weakref.finalize(
            self, _close_groups, self._groups, self._lock, self._links, self._wire
        )

    def __repr__(self) -> str:
        return f"<Collective {self.name!r} host={self.host} groups={len(self._groups)}>"

    def create_collective_group(
        self, worker_addresses: Sequence[object], group_name: str | None = None
    ) -> CollectiveGroup | MultiCollectiveGroup:
        """Return the group of these addresses: a pair for two, an N-member group for more.

        Two addresses give what :meth:`create_pair_group` gives (ordered send/recv);
        three or more give what :meth:`create_multi_group` gives (collectives). Call those
        two directly for a return type that does not depend on the argument count, or
        for collectives over two members (:meth:`create_multi_group`).

        Args:
            worker_addresses: Two or more distinct addresses (str or ``get_name()``), one
                of them this process's own.
            group_name: Optional key shared by all members, instead of the member names.

        Returns:
            A :class:`CollectiveGroup` (two addresses) or a :class:`MultiCollectiveGroup`.

        Raises:
            TypeError: An address is neither a string nor has ``get_name()``.
            ValueError: Fewer than two distinct addresses, or none of them is this
                process's own address.
            GroupClosedError: This Collective was closed.

        Example:
            >>> group = coll.create_collective_group(["trainer", "rollout"])  # doctest: +SKIP
            >>> group.rank, group.peer_name  # doctest: +SKIP
            (1, 'rollout')
        """
        names = self._address_names(worker_addresses)
        if len(names) > 2:
            return create_multi_group(self, names, group_name)
        return self.create_pair_group(names, group_name)

    def create_multi_group(
        self, worker_addresses: Sequence[object], group_name: str | None = None
    ) -> MultiCollectiveGroup:
        """Return the N-member group (collectives) of these addresses, N >= 2, cached.

        Ranks are the indices of the sorted member names; every member must call the
        group's operations in the same order. Over two addresses this is a different
        group from the pair group of :meth:`create_pair_group`.

        Args:
            worker_addresses: Two or more distinct addresses, one of them this process's.
            group_name: Optional key shared by all members, instead of the member names.

        Returns:
            The :class:`MultiCollectiveGroup`.

        Raises:
            TypeError: An address is neither a string nor has ``get_name()``.
            ValueError: Fewer than two distinct addresses, or this process's is missing.
            GroupClosedError: This Collective was closed.

        Example:
            >>> g = coll.create_multi_group(["a", "b", "c"])  # doctest: +SKIP
            >>> g.allreduce(torch.ones(4))  # doctest: +SKIP
        """
        return create_multi_group(self, worker_addresses, group_name)

    def join_ranked_group(
        self, group_name: str, world_size: int, rank: int
    ) -> MultiCollectiveGroup:
        """Join the N-member group ``group_name`` of ``world_size`` members as ``rank``.

        The members need not know each other's addresses: they meet in the rendezvous
        store under ``group_name`` (what p2p-worker's ``compat`` module uses).

        Args:
            group_name: Name shared by all members.
            world_size: Number of members (>= 2).
            rank: This member's rank in ``0..world_size-1``.

        Returns:
            The :class:`MultiCollectiveGroup` (cached by name).

        Raises:
            ValueError: Bad name, size or rank.
            GroupClosedError: This Collective was closed.

        Example:
            >>> g = coll.join_ranked_group("default", 4, rank)  # doctest: +SKIP
        """
        return join_ranked_group(self, group_name, world_size, rank)

    def create_pair_group(
        self, worker_addresses: Sequence[object], group_name: str | None = None
    ) -> CollectiveGroup:
        """Return the two-party group (ordered send/recv) of these two addresses.

        Groups are cached by their key: ``group_name`` when given, else the sorted member
        names joined with ``"+"``. Nothing touches the network here (except to look for a
        restarted peer, below); each direction connects at its first operation. A cached
        group that was closed is replaced by a new one (the peer must re-create its side
        too), and so is one whose peer died once a new incarnation of the peer has
        announced itself in the store.

        Args:
            worker_addresses: Exactly two addresses (str or ``get_name()``), one of them
                this process's own.
            group_name: Optional key shared by both sides, instead of the member names.

        Returns:
            The group; its ``rank`` is the index of this process's name in sorted order.

        Raises:
            TypeError: An address is neither a string nor has ``get_name()``.
            ValueError: Not exactly two distinct addresses, or none of them is this
                process's own address.
            GroupClosedError: This Collective was closed.

        Example:
            >>> group = coll.create_pair_group(["trainer", "rollout"])  # doctest: +SKIP
            >>> group.send({"step": 1})  # doctest: +SKIP
        """
        names = self._address_names(worker_addresses)
        if len(names) != 2 or names[0] == names[1]:
            raise ValueError(
                f"worker_addresses: got {names!r}; allowed: exactly two distinct addresses"
            )
        if self.name not in names:
            raise ValueError(
                f"worker_addresses: got {names!r}; allowed: a pair that includes this"
                f" process's own address {self.name!r}"
            )
        if group_name is not None and (not isinstance(group_name, str) or not group_name):
            raise ValueError(f"group_name: got {group_name!r}; allowed: a non-empty string or None")
        ordered = sorted(names)
        key = group_name if group_name is not None else "+".join(ordered)
        rank = ordered.index(self.name)
        peer = self.peers.get(ordered[1 - rank])
        stale: CollectiveGroup | None = None
        with self._lock:
            if self._closed:
                raise GroupClosedError(f"Collective {self.name!r} is closed")
            group = self._groups.get(key)
            if (
                isinstance(group, CollectiveGroup)
                and group.peer_gone
                and peer.has_new_incarnation(self._store)
            ):
                stale, group = group, None  # its peer restarted: meet the new one
            if group is None or group.closed:
                group = CollectiveGroup(
                    name=key,
                    rank=rank,
                    self_name=self.name,
                    peer_name=ordered[1 - rank],
                    store=self._store,
                    links=self._links,
                    config=self.config,
                    init_timeout=self.init_timeout,
                    owner=self,
                    on_close=self._forget,
                    wire=self._wire,
                    auth=self._auth,
                    peer=peer,
                    instance=self.instance,
                )
                self._groups[key] = group
        if stale is not None:
            stale.close(timeout=0.0)
        return group

    @staticmethod
    def _address_names(worker_addresses: Sequence[object]) -> list[str]:
        if isinstance(worker_addresses, (str, bytes)) or not isinstance(worker_addresses, Sequence):
            raise TypeError(
                "worker_addresses: expected a sequence of two addresses (or more, for an"
                f" N-member group), got"
                f" {type(worker_addresses).__name__}"
            )
        return [address_name(a, f"worker_addresses[{i}]") for i, a in enumerate(worker_addresses)]

    def _forget(self, group: CollectiveGroup) -> None:
        with self._lock:
            if self._groups.get(group.name) is group:
                del self._groups[group.name]

    def compression_stats(self) -> dict[str, object] | None:
        """Counters of the compression resources this Collective's groups share.

        Returns:
            None when compression is off; else ``{"pool": {...}, "codec": {...}}``: the
            buffer pool's counters (``active_bytes``, ``cached_bytes``, ``hits``,
            ``misses``, ``evictions``, ``rejections``, ``discards``, ...) and the codec
            provider's (None until the first eligible tensor created it).

        Example:
            >>> coll.compression_stats()["pool"]["active_bytes"]  # doctest: +SKIP
            0
        """
        return None if self._wire is None else self._wire.stats()

    @property
    def groups(self) -> dict[str, CollectiveGroup]:
        """A copy of the cache: group key -> group."""
        with self._lock:
            return dict(self._groups)

    def close(self) -> None:
        """Close every group of this Collective; also runs at interpreter exit.

        Idempotent; later ``create_collective_group`` calls raise ``GroupClosedError``.

        Example:
            >>> coll.close()  # doctest: +SKIP
        """
        with self._lock:
            self._closed = True
        self._finalizer()

    def __enter__(self) -> Collective:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
