"""The channel worker's Ray methods as a process calls them.

A Ray actor handle is untyped (its methods are looked up by name), so a process sees
its channel worker through :class:`ChannelActor`: each method the client calls, with
what ``ray.get`` of its ``.remote(...)`` returns. ``_server.server.ChannelWorker``
implements them; a handle becomes a :class:`ChannelActor` where Ray hands it out.
"""

from __future__ import annotations

from typing import Protocol

from p2p_worker._channels._protocol.proto import ChannelStats, Hello
from p2p_worker._remote import RemoteMethod


class ChannelActor(Protocol):
    """The methods of a channel worker that a process calls over Ray."""

    @property
    def hello(self) -> RemoteMethod[..., Hello]: ...
    @property
    def settle(self) -> RemoteMethod[..., None]: ...
    @property
    def alive(self) -> RemoteMethod[..., bool]: ...
    @property
    def arrived(self) -> RemoteMethod[..., int | None]: ...
    @property
    def cancel(self) -> RemoteMethod[..., bool]: ...
    @property
    def reset_link(self) -> RemoteMethod[..., None]: ...
    @property
    def destroy(self) -> RemoteMethod[..., None]: ...
    @property
    def peek_all(self) -> RemoteMethod[..., list[object]]: ...
    @property
    def state(self) -> RemoteMethod[..., ChannelStats]: ...
