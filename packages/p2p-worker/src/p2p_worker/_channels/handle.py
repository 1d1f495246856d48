"""Channel: the public handle on a named FIFO channel; creating and connecting handles.

Above both sides: creating a channel starts its channel worker (``spawn``), and a
handle's operations are the client side's (``_client.operations``).

Every way to create a channel (``Worker.create_channel``, the driver's
:func:`~p2p_worker.create_channel`, RLinf's :meth:`Channel.create`) ends in
:func:`create_channel_on`, and every way to connect in :func:`connect_channel_on`; RLinf's
argument names (``channel_name``, ``node_rank``, ``distributed``, ``local``) are merged
with ours there, and only there. The callers differ only in how they find this process's
endpoint and in what an existing name does (RLinf's ``Channel.create`` connects to it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal, overload

import ray

from p2p_asyncwork.internal import check_timeout
from p2p_worker._channels._client.connect import connect_link
from p2p_worker._channels._client.endpoint import (
    cached_handle,
    current_endpoint,
    endpoint_for_store,
    remember_handle,
)
from p2p_worker._channels._client.link import ChannelLink
from p2p_worker._channels._client.local import LocalChannel
from p2p_worker._channels._client.operations import ChannelOperations
from p2p_worker._channels._protocol.errors import ChannelExistsError
from p2p_worker._channels._protocol.proto import (
    DEFAULT_TRANSFER_TIMEOUT as DEFAULT_TRANSFER_TIMEOUT,  # re-exported
)
from p2p_worker._channels._protocol.proto import check_channel_name
from p2p_worker._channels.spawn import resolve_names, spawn_channel_worker
from p2p_worker._job._cluster import Cluster
from p2p_worker._runtime._state import WorkerRuntime

DEFAULT_CONNECT_TIMEOUT = 30.0


class Channel(ChannelOperations):
    """A named FIFO queue between workers (and the driver) with real flow control.

    Get one with ``Worker.create_channel`` / ``Worker.connect_channel`` in a worker, or
    :func:`~p2p_worker.create_channel` / :func:`~p2p_worker.connect_channel` in the
    driver; never construct it yourself. A handle may be passed to a worker method: it
    pickles as the channel's name and reconnects in the receiving process on first use.

    Items are any picklable objects; tensors (and lists, dicts and dataclasses of
    tensors) travel on the optimized tensor path of ``Worker.send``, compressed as the
    job configures, and arrive as fresh CPU tensors. The channel worker rebuilds every
    item to pass it on, so the classes of pickled objects must be importable there (as
    in the consumers).

    Ordering: an item is in the channel once its put has been granted room; it is
    queued when its payload has arrived at the channel worker, and items leave in the
    order they were queued. One process's puts are queued in the order it made them,
    and its gets (and each ``get_batch``) receive items in channel order, so every
    producer's items keep their order for every consumer. When a put has returned, its
    item is visible: ``qsize`` counts it and a ``get_nowait`` waits for its payload if
    it is still arriving.

    Flow control: with ``maxsize`` > 0 the channel never holds more than ``maxsize``
    items, counting payloads on their way in and on their way out: a put reserves a
    slot before its payload travels and the slot is freed when a consumer has received
    the item. Waiting puts and gets are served first come, first served.

    Failures: a put that raises did not add its item; a get that raises took nothing
    (an item whose transfer fails goes back to the head). Every payload transfer is
    bounded by the channel's ``transfer_timeout``, so a dead producer or consumer holds
    up at most one item for at most that long.

    Example:
        >>> ch = self.create_channel("rollouts", maxsize=4)  # doctest: +SKIP
        >>> ch.put({"obs": torch.zeros(4), "step": 1})  # doctest: +SKIP
        >>> ch.get()["step"]  # doctest: +SKIP
        1
    """

    def _connect(self) -> ChannelLink:
        """This process's link to the channel, connected on first use."""
        endpoint = endpoint_for_store(self._store)
        return _connect_handle(endpoint, self.name, DEFAULT_CONNECT_TIMEOUT)._link()

    def __reduce__(
        self,
    ) -> tuple[Callable[[str, tuple[str, int]], Channel], tuple[str, tuple[str, int]]]:
        return (_restore, (self.name, self._store))

    @overload
    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 0,
        distributed: bool = False,
        node_rank: int = 0,
        local: Literal[False] = False,
        disable_distributed_log: bool = True,
        *,
        cluster: Cluster | None = None,
        transfer_timeout: float | None = DEFAULT_TRANSFER_TIMEOUT,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> Channel: ...

    @overload
    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 0,
        distributed: bool = False,
        node_rank: int = 0,
        *,
        local: Literal[True],
        disable_distributed_log: bool = True,
        cluster: Cluster | None = None,
        transfer_timeout: float | None = DEFAULT_TRANSFER_TIMEOUT,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> LocalChannel: ...

    @classmethod
    def create(
        cls,
        name: str,
        maxsize: int = 0,
        distributed: bool = False,
        node_rank: int = 0,
        local: bool = False,
        disable_distributed_log: bool = True,
        *,
        cluster: Cluster | None = None,
        transfer_timeout: float | None = DEFAULT_TRANSFER_TIMEOUT,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> Channel | LocalChannel:
        """Create channel ``name`` (RLinf's ``Channel.create``), or connect if it exists.

        In a worker the channel belongs to the worker's job; in the driver to its one
        open :class:`~p2p_worker.Cluster` (or ``cluster``). As in RLinf, a name already
        in use connects to that channel instead of failing. With ``local=True`` it is a
        :class:`~p2p_worker.LocalChannel` instead: held in this process, no worker.

        Args:
            name: Channel name (letters, digits, ``_ . -``).
            maxsize: Most items held at once, over all keys (0: no bound).
            distributed: RLinf's one-worker-per-node channel; accepted on one node only.
            node_rank: Node whose channel worker holds the items.
            local: RLinf's in-process channel: return a :class:`LocalChannel`.
            disable_distributed_log: RLinf's flag; accepted, no effect.
            cluster: The driver's Cluster, when it has several open.
            transfer_timeout: Seconds one payload transfer may take (None: no limit).
            timeout: Seconds to wait for the channel worker to start and connect.

        Returns:
            This process's :class:`Channel` handle (a :class:`LocalChannel` if ``local``).

        Raises:
            ValueError: As ``Worker.create_channel``.
            ChannelError: No job to create it in, or its worker could not be reached.

        Example:
            >>> channel = Channel.create(name="rollouts", maxsize=64)  # doctest: +SKIP
        """
        del disable_distributed_log
        if local is True:  # RLinf's in-process channel: no job, no channel worker
            check_channel_name(name)
            return LocalChannel(maxsize)
        return create_channel_on(
            partial(current_endpoint, cluster),
            name,
            maxsize=maxsize,
            distributed=distributed,
            node_rank=node_rank,
            local=local,
            transfer_timeout=transfer_timeout,
            timeout=timeout,
            exists="connect",
        )

    @classmethod
    def connect(
        cls,
        name: str,
        current_worker: object = None,
        *,
        cluster: Cluster | None = None,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> Channel:
        """Connect to channel ``name`` (RLinf's ``Channel.connect``).

        Args:
            name: The channel's name.
            current_worker: RLinf's argument; the worker's own connection is used when
                called in a worker, so it may be None.
            cluster: The driver's Cluster, when it has several open.
            timeout: Seconds to wait for the channel to exist and answer.

        Returns:
            This process's :class:`Channel` handle.

        Raises:
            ChannelNotFoundError: No channel of that name appeared within ``timeout``.

        Example:
            >>> channel = Channel.connect("rollouts")  # doctest: +SKIP
        """
        del current_worker
        return connect_channel_on(partial(current_endpoint, cluster), name, timeout=timeout)


def create_channel_on(
    endpoint: Callable[[], WorkerRuntime],
    channel_name: str | None = None,
    name: str | None = None,
    *,
    maxsize: int = 0,
    distributed: bool = False,
    node_rank: int | None = None,
    node_id: int | None = None,
    local: bool = False,
    transfer_timeout: float | None = DEFAULT_TRANSFER_TIMEOUT,
    timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    exists: Literal["raise", "connect"] = "raise",
) -> Channel:
    """Create a channel: what every create entry point (worker, driver, RLinf's) does.

    RLinf's argument names and ours are merged here (``channel_name`` / ``name``,
    ``node_rank`` / ``node_id``; ``distributed`` and ``local`` checked), then the channel
    worker is started and ``endpoint`` connected to it.

    Args:
        endpoint: Returns this process's endpoint (called first: its errors come first).
        channel_name: RLinf's name for ``name``.
        name: Channel name, unique in the job.
        maxsize: Most items held at once (0: no bound).
        distributed: RLinf's one-worker-per-node channel; accepted on one node only.
        node_rank: RLinf's name for ``node_id``.
        node_id: Node whose channel worker holds the items (default 0).
        local: RLinf's in-process channel; must be False here.
        transfer_timeout: Seconds one payload transfer may take (None: no limit).
        timeout: Seconds to wait for the channel worker to start and connect.
        exists: When the job has a channel of that name: ``"raise"``
            :class:`ChannelExistsError` (``Worker.create_channel``, the driver's
            ``create_channel``), or ``"connect"`` to it (RLinf's ``Channel.create``).

    Raises:
        TypeError, ValueError: As ``spawn.resolve_names`` and ``spawn_channel_worker``.
        ChannelExistsError: The name is taken and ``exists`` is ``"raise"``.
        ChannelError: The channel worker could not be reached.
    """
    where = endpoint()
    chosen, node = resolve_names(
        channel_name, name, node_rank, node_id, distributed, local, len(where.job.nodes)
    )
    timeout = check_timeout(timeout)
    try:
        actor = spawn_channel_worker(where, chosen, node, maxsize, transfer_timeout)
    except ChannelExistsError:
        if exists == "raise":
            raise
        return _connect_handle(where, chosen, timeout)
    try:
        link = connect_link(where, chosen, timeout)
    except BaseException:
        ray.kill(actor, no_restart=True)
        raise
    return _new_handle(where, chosen, link)


def connect_channel_on(
    endpoint: Callable[[], WorkerRuntime],
    channel_name: str | None = None,
    name: str | None = None,
    *,
    timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
) -> Channel:
    """Connect to a channel: what every connect entry point (worker, driver, RLinf's) does.

    Args:
        endpoint: Returns this process's endpoint (called once the name is known).
        channel_name: The channel's name (RLinf's argument name).
        name: p2p-worker's name for ``channel_name``.
        timeout: Seconds to wait for the channel to exist and answer.

    Returns:
        ``endpoint``'s handle on the channel (one per process: the cached one while usable).

    Raises:
        TypeError: No name given, or both spellings.
        ChannelNotFoundError: No channel of that name appeared within ``timeout``.
        ChannelError: The channel worker could not be reached.
    """
    chosen, _ = resolve_names(channel_name, name, None, None)
    return _connect_handle(endpoint(), chosen, timeout)


def _connect_handle(endpoint: WorkerRuntime, name: str, timeout: float | None) -> Channel:
    """Return ``endpoint``'s handle on channel ``name`` (connecting once per process)."""
    check_channel_name(name)
    timeout = check_timeout(timeout)
    cached = _usable_cached(endpoint, name)
    if cached is not None:
        return cached
    return _new_handle(endpoint, name, connect_link(endpoint, name, timeout))


def _new_handle(endpoint: WorkerRuntime, name: str, link: ChannelLink) -> Channel:
    """The handle on ``link``, remembered as ``endpoint``'s handle on channel ``name``."""
    job = endpoint.job
    handle = Channel(name, (job.store_host, job.store_port), link)
    remember_handle(endpoint, handle)
    return handle


def _usable_cached(endpoint: WorkerRuntime, name: str) -> Channel | None:
    """The handle on channel ``name`` that ``endpoint`` connected before, if still usable."""
    handle = cached_handle(endpoint, name)  # only Channel handles are remembered
    return handle if isinstance(handle, Channel) and handle._usable() else None


def _restore(name: str, store: tuple[str, int]) -> Channel:
    """Unpickle a handle: this process's handle if it has one, else one that connects lazily."""
    try:
        endpoint = endpoint_for_store(store)
    except Exception:
        return Channel(name, store)
    cached = _usable_cached(endpoint, name)
    return cached if cached is not None else Channel(name, store)
