"""Channels: named FIFO queues between workers and the driver, held by channel workers.

A folder above :class:`~p2p_worker.Worker`: nothing here is imported by the worker
base, and ``Worker`` reaches channels only through :class:`ChannelService`.

- :mod:`~p2p_worker._channels.handle`: :class:`Channel`, the public handle;
  :mod:`~p2p_worker._channels.local`: :class:`LocalChannel`, RLinf's in-process one;
- :mod:`~p2p_worker._channels.client`: one process's link to a channel worker,
  :mod:`~p2p_worker._channels.connect`: finding and connecting it,
  :mod:`~p2p_worker._channels.acks`: acknowledgements riding on requests, and
  :mod:`~p2p_worker._channels.work`: the handles of its operations;
- :mod:`~p2p_worker._channels.server`: the channel worker (a Ray actor), and
  :mod:`~p2p_worker._channels.peers`: what it keeps per peer;
- :mod:`~p2p_worker._channels.queue`: slots, items and waiters inside it;
- :mod:`~p2p_worker._channels.proto`, :mod:`~p2p_worker._channels.keys`: what both
  sides agree on;
- :mod:`~p2p_worker._channels.spawn`, :mod:`~p2p_worker._channels.endpoint`: starting
  a channel worker, and where a process stands in a job (worker or driver);
- :mod:`~p2p_worker._channels.service`, :mod:`~p2p_worker._channels.driver`: the entry
  points of workers and of the driver.
"""

from p2p_worker._channels.driver import connect_channel, create_channel
from p2p_worker._channels.errors import (
    ChannelClosedError,
    ChannelEmpty,
    ChannelError,
    ChannelExistsError,
    ChannelFull,
    ChannelNotFoundError,
)
from p2p_worker._channels.handle import Channel
from p2p_worker._channels.local import LocalChannel
from p2p_worker._channels.server import ChannelWorker
from p2p_worker._channels.service import ChannelService
from p2p_worker._channels.work import ChannelWork

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
