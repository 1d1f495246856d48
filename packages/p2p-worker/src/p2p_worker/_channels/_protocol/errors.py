"""Errors of channels: full, empty, missing, taken, closed, and failed transfers."""

from __future__ import annotations

import asyncio
import queue

from p2p_worker._errors import WorkerError


class ChannelError(WorkerError):
    """A channel operation failed: the channel is gone, or a payload transfer failed.

    A failed transfer never loses or duplicates an item: a ``put`` that raises this did
    not add its item, and a ``get`` that raises it took nothing (the item went back to
    the head of the channel). The cause (``__cause__``) is the underlying error, for
    instance a ``p2p_collective.PeerError``.

    Example:
        >>> err = ChannelError("transfer failed")
        >>> isinstance(err, WorkerError)
        True
    """


class ChannelFull(ChannelError, queue.Full, asyncio.QueueFull):
    """The channel had no room: ``put_nowait`` on a full channel, or ``put`` timed out.

    Also a :class:`queue.Full` and an :class:`asyncio.QueueFull` (what RLinf's
    ``put_nowait`` raises), so code written for either catches it.

    Example:
        >>> issubclass(ChannelFull, queue.Full), issubclass(ChannelFull, asyncio.QueueFull)
        (True, True)
    """


class ChannelEmpty(ChannelError, queue.Empty, asyncio.QueueEmpty):
    """The channel had no item: ``get_nowait`` on an empty channel, or ``get`` timed out.

    Also a :class:`queue.Empty` and an :class:`asyncio.QueueEmpty` (what RLinf's
    ``get_nowait`` raises), so code written for either catches it.

    Example:
        >>> issubclass(ChannelEmpty, queue.Empty), issubclass(ChannelEmpty, asyncio.QueueEmpty)
        (True, True)
    """


class ChannelNotFoundError(ChannelError, LookupError):
    """No channel of that name exists in the job (``connect_channel`` after its timeout)."""


class ChannelExistsError(ChannelError):
    """``create_channel`` was given a name that a live channel of the job already has."""


class ChannelClosedError(ChannelError):
    """The channel was destroyed, or its channel worker died or stopped answering."""
