"""Channels: named FIFO queues between workers and the driver, held by channel workers.

A folder above :class:`~p2p_worker.Worker`: nothing here is imported by the worker
base, and ``Worker`` reaches channels only through :class:`ChannelService`.

Cut by side, imports only downwards:

- :mod:`~p2p_worker._channels._protocol`: what both sides agree on (wire requests and
  answers, keys, payloads, errors); imports neither side;
- :mod:`~p2p_worker._channels._client`: a process's side (the handle's operations, its
  link to a channel worker, :class:`LocalChannel`); imports only ``_protocol``;
- :mod:`~p2p_worker._channels._server`: the channel worker (a Ray actor) and what it
  keeps; imports only ``_protocol``;
- here, above both: :mod:`~p2p_worker._channels.spawn` (starting a channel worker),
  :mod:`~p2p_worker._channels.handle` (:class:`Channel`: creating and connecting
  handles), :mod:`~p2p_worker._channels.service` and :mod:`~p2p_worker._channels.driver`
  (the entry points of workers and of the driver).
"""

from p2p_worker._channels._client.local import LocalChannel
from p2p_worker._channels._client.work import ChannelWork
from p2p_worker._channels._protocol.errors import (
    ChannelClosedError,
    ChannelEmpty,
    ChannelError,
    ChannelExistsError,
    ChannelFull,
    ChannelNotFoundError,
)
from p2p_worker._channels._server.server import ChannelWorker
from p2p_worker._channels.driver import connect_channel, create_channel
from p2p_worker._channels.handle import Channel
from p2p_worker._channels.service import ChannelService

__all__ = [
    "Channel",
    "ChannelClosedError",
    "ChannelEmpty",
    "ChannelError",
    "ChannelExistsError",
    "ChannelFull",
    "ChannelNotFoundError",
    "ChannelService",
    "ChannelWork",
    "ChannelWorker",
    "LocalChannel",
    "connect_channel",
    "create_channel",
]
