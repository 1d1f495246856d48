"""Channel: the public handle on a named FIFO channel, and how workers and the driver get one.

``Worker.create_channel`` / ``Worker.connect_channel`` (through :class:`ChannelMixin`)
and the module functions :func:`create_channel` / :func:`connect_channel` (for the
driver, given its :class:`~p2p_worker.Cluster`) all end here. The driver takes part
through a small endpoint of its own: an address (``p2p_driver.<pid>:0``), a store
client and a ``Collective`` built like a worker's, so it moves payloads with the same
send/recv as the workers do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from p2p_worker._channel_client import ChannelWork
from p2p_worker._channel_endpoint import driver_endpoint
from p2p_worker._channel_handle import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TRANSFER_TIMEOUT,
    Channel,
    connect_on,
    create_on,
)
from p2p_worker._channel_spawn import resolve_names
from p2p_worker._errors import WorkerError
from p2p_worker._runtime import WorkerRuntime

if TYPE_CHECKING:
    from p2p_worker._cluster import Cluster

__all__ = ["Channel", "ChannelMixin", "ChannelWork", "connect_channel", "create_channel"]


def create_channel(
    cluster: Cluster,
    name: str | None = None,
    node_id: int | None = None,
    maxsize: int = 0,
    *,
    channel_name: str | None = None,
    node_rank: int | None = None,
    transfer_timeout: float | None = DEFAULT_TRANSFER_TIMEOUT,
    timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
) -> Channel:
    """Create channel ``name`` from the driver; the driver's twin of ``Worker.create_channel``.

    RLinf's ``Channel.create(name, ...)`` does the same without the cluster argument.

    Args:
        cluster: The job's :class:`~p2p_worker.Cluster`.
        name: Channel name, unique in the job (letters, digits, ``_ . -``).
        node_id: Node (``NodeInfo.node_rank``) whose channel worker holds the items
            (default 0).
        channel_name: RLinf's name for ``name``.
        node_rank: RLinf's name for ``node_id``.
        maxsize: Most items the channel holds at once, payloads in transit included
            (0: no bound).
        transfer_timeout: Seconds one payload transfer may take (None: no limit).
        timeout: Seconds to wait for the channel worker to start and connect.

    Returns:
        The driver's :class:`Channel` handle.

    Raises:
        TypeError: An argument has the wrong type.
        ValueError: ``name`` is invalid, ``node_id`` out of range, ``maxsize`` < 0.
        ChannelExistsError: A channel of that name exists in the job.
        ChannelError: The channel worker could not be reached.

    Example:
        >>> ch = create_channel(cluster, "results", maxsize=8)  # doctest: +SKIP
        >>> ch.put({"step": 1}); ch.get()  # doctest: +SKIP
        {'step': 1}
    """
    chosen, node = resolve_names(channel_name, name, node_rank, node_id)
    return create_on(driver_endpoint(cluster), chosen, node, maxsize, transfer_timeout, timeout)


def connect_channel(
    cluster: Cluster, name: str, *, timeout: float | None = DEFAULT_CONNECT_TIMEOUT
) -> Channel:
    """Connect the driver to channel ``name``; the twin of ``Worker.connect_channel``.

    Args:
        cluster: The job's :class:`~p2p_worker.Cluster`.
        name: The channel's name.
        timeout: Seconds to wait for the channel to exist and answer.

    Returns:
        The driver's :class:`Channel` handle (the same object on every call).

    Raises:
        ChannelNotFoundError: No channel of that name appeared within ``timeout``.
        ChannelError: The channel worker could not be reached.

    Example:
        >>> ch = connect_channel(cluster, "rollouts", timeout=10.0)  # doctest: +SKIP
    """
    return connect_on(driver_endpoint(cluster), name, timeout)


class ChannelMixin:
    """Channel methods of :class:`~p2p_worker.Worker` (seed 004's ``create_channel`` API)."""

    def _channel_endpoint(self) -> WorkerRuntime:
        runtime = self.__dict__.get("_p2p_runtime")
        if runtime is None:
            raise WorkerError(
                f"{type(self).__name__} was not launched in a WorkerGroup, so it cannot use "
                f"channels; from the driver use p2p_worker.create_channel(cluster, ...)"
            )
        return runtime  # type: ignore[no-any-return]

    def create_channel(
        self,
        channel_name: str | None = None,
        maxsize: int = 0,
        distributed: bool = False,
        node_rank: int | None = None,
        local: bool = False,
        *,
        name: str | None = None,
        node_id: int | None = None,
        transfer_timeout: float | None = DEFAULT_TRANSFER_TIMEOUT,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> Channel:
        """Create a channel named ``channel_name``, held by a channel worker on ``node_rank``.

        RLinf's signature; p2p-worker's ``name=`` / ``node_id=`` keywords still work.
        The channel outlives this worker: it lives until it is destroyed
        (:meth:`Channel.destroy`) or the job ends. Any worker (or the driver) connects
        to it by name. Unlike RLinf, a name already in use raises
        :class:`ChannelExistsError` instead of connecting.

        Args:
            channel_name: Channel name, unique in the job (letters, digits, ``_ . -``).
            maxsize: Most items the channel holds at once, over all keys, payloads in
                transit included (0: no bound).
            distributed: RLinf's one-worker-per-node channel; accepted on one node only.
            node_rank: Node (``NodeInfo.node_rank``) whose channel worker holds the
                items (default 0).
            local: RLinf's in-process channel; not supported (must be False).
            name: p2p-worker's name for ``channel_name``.
            node_id: p2p-worker's name for ``node_rank``.
            transfer_timeout: Seconds one payload transfer may take (None: no limit).
            timeout: Seconds to wait for the channel worker to start and connect.

        Returns:
            This worker's :class:`Channel` handle.

        Raises:
            TypeError: An argument has the wrong type.
            ValueError: ``name`` is invalid, ``node_id`` out of range, ``maxsize`` < 0.
            ChannelExistsError: A channel of that name exists in the job.
            ChannelError: The channel worker could not be reached.
            WorkerError: This worker was not launched in a group.

        Example:
            >>> self.channel = self.create_channel("rollouts", maxsize=4, node_rank=0)  # doctest: +SKIP
        """  # noqa: E501
        endpoint = self._channel_endpoint()
        chosen, node = resolve_names(
            channel_name, name, node_rank, node_id, distributed, local, len(endpoint.job.nodes)
        )
        return create_on(endpoint, chosen, node, maxsize, transfer_timeout, timeout)

    def connect_channel(
        self,
        channel_name: str | None = None,
        *,
        name: str | None = None,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> Channel:
        """Connect to the existing channel ``channel_name`` (created by any worker or the driver).

        Args:
            channel_name: The channel's name (RLinf's argument name).
            name: p2p-worker's name for ``channel_name``.
            timeout: Seconds to wait for the channel to exist and answer.

        Returns:
            This worker's :class:`Channel` handle (the same object on every call).

        Raises:
            ChannelNotFoundError: No channel of that name appeared within ``timeout``.
            ChannelError: The channel worker could not be reached.
            WorkerError: This worker was not launched in a group.

        Example:
            >>> channel = self.connect_channel("rollouts")  # doctest: +SKIP
            >>> channel.put({"obs": torch.zeros(4)})  # doctest: +SKIP
        """
        chosen, _ = resolve_names(channel_name, name, None, None)
        return connect_on(self._channel_endpoint(), chosen, timeout)
