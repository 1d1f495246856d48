"""The driver's channel entry points: :func:`create_channel` and :func:`connect_channel`.

They are the driver's twins of ``Worker.create_channel`` / ``Worker.connect_channel``
(see :mod:`p2p_worker._channels.service`), given the driver's
:class:`~p2p_worker.Cluster`. The driver takes part
through a small endpoint of its own: an address (``p2p_driver.<pid>:0``), a store
client and a ``Collective`` built like a worker's, so it moves payloads with the same
send/recv as the workers do.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from p2p_worker._channels._client.endpoint import driver_endpoint
from p2p_worker._channels._client.work import ChannelWork
from p2p_worker._channels.handle import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TRANSFER_TIMEOUT,
    Channel,
    connect_channel_on,
    create_channel_on,
)

if TYPE_CHECKING:
    from p2p_worker._job._cluster import Cluster

__all__ = ["Channel", "ChannelWork", "connect_channel", "create_channel"]


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
    return create_channel_on(
        partial(driver_endpoint, cluster),
        channel_name,
        name,
        maxsize=maxsize,
        node_rank=node_rank,
        node_id=node_id,
        transfer_timeout=transfer_timeout,
        timeout=timeout,
    )


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
    return connect_channel_on(partial(driver_endpoint, cluster), name, timeout=timeout)
