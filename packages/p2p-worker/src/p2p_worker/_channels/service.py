"""The channel service of a worker: what ``Worker.create_channel`` / ``connect_channel`` do.

:class:`~p2p_worker.Worker` holds no channel logic of its own: its two channel methods
hand their arguments to a :class:`ChannelService` bound to the worker's runtime (its
address, store client and ``Collective``). The driver's twins are
:func:`~p2p_worker.create_channel` / :func:`~p2p_worker.connect_channel`.
"""

from __future__ import annotations

from p2p_worker._channels.handle import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_TRANSFER_TIMEOUT,
    Channel,
    connect_channel_on,
    create_channel_on,
)
from p2p_worker._errors import WorkerError
from p2p_worker._runtime._state import WorkerRuntime


class ChannelService:
    """Creates and connects channels on behalf of one worker.

    Args:
        runtime: The worker's runtime; None when the worker was not launched in a group.
        owner: The worker's class name, for the error when ``runtime`` is None.

    Example:
        >>> service = ChannelService(None, "Lonely")
        >>> service.connect("rollouts")
        Traceback (most recent call last):
        ...
        p2p_worker._errors.WorkerError: Lonely was not launched in a WorkerGroup, so it cannot use channels; from the driver use p2p_worker.create_channel(cluster, ...)
    """  # noqa: E501

    __slots__ = ("_owner", "_runtime")

    def __init__(self, runtime: WorkerRuntime | None, owner: str) -> None:
        self._runtime = runtime
        self._owner = owner

    def _endpoint(self) -> WorkerRuntime:
        if self._runtime is None:
            raise WorkerError(
                f"{self._owner} was not launched in a WorkerGroup, so it cannot use "
                f"channels; from the driver use p2p_worker.create_channel(cluster, ...)"
            )
        return self._runtime

    def create(
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
        """Create a channel; the arguments and errors are ``Worker.create_channel``'s."""
        return create_channel_on(
            self._endpoint,
            channel_name,
            name,
            maxsize=maxsize,
            distributed=distributed,
            node_rank=node_rank,
            node_id=node_id,
            local=local,
            transfer_timeout=transfer_timeout,
            timeout=timeout,
        )

    def connect(
        self,
        channel_name: str | None = None,
        *,
        name: str | None = None,
        timeout: float | None = DEFAULT_CONNECT_TIMEOUT,
    ) -> Channel:
        """Connect to a channel; the arguments and errors are ``Worker.connect_channel``'s."""
        return connect_channel_on(self._endpoint, channel_name, name, timeout=timeout)
