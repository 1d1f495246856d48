"""Put requests, and which small items ride inside them (no payload message of their own).

A put of an item without tensors whose pickle is at most :data:`INLINE_BYTES` long sends
the item inside its request (``PUT_INLINE``): granted, the channel worker queues it at
once, so the put costs one request and one answer instead of a request, an answer and a
payload, and the channel worker does not post, wait for and hand over a payload receive.

Order: the channel worker queues the item only once the producer's earlier payloads (on
the link) have arrived (the request carries ``(gen, payloads sent)``, as a get does), and
a producer sends an inline put only while none of its earlier puts is still being
granted or processed; the puts after it take their place behind it.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Protocol

from p2p_worker._channels._protocol.keys import unwrap
from p2p_worker._channels._protocol.payload import payload_nbytes
from p2p_worker._channels._protocol.proto import INLINE_BYTES, PUT, PUT_INLINE

if TYPE_CHECKING:
    from p2p_worker._channels._protocol.proto import PutInlineMessage, PutMessage


def rides_inline(item: object) -> bool:
    """Whether ``item`` (bare or keyed) may ride inside its put request.

    Example:
        >>> rides_inline({"step": 3, "tag": "rollout"}), rides_inline("x" * 5000)
        (True, False)
    """
    if payload_nbytes(unwrap(item)[0]):
        return False  # tensors take the payload path (framed, maybe compressed)
    try:
        return len(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL)) <= INLINE_BYTES
    except Exception:  # not picklable here: the payload path reports it
        return False


class PutLink(Protocol):
    """What a put's request asks of the link (``ChannelLink``'s methods of those names)."""

    def want_credits(self) -> int: ...
    def puts_settled(self) -> bool: ...
    def sync(self) -> tuple[int, int]: ...


class PutRequest:
    """Builds one put's request when its token is known; says whether the item rode in it.

    Called by ``ChannelLink.submit`` holding the link's lock. ``settled()`` says whether
    every earlier put of this process has been processed (its payload sent), and
    ``sync()`` what the channel worker must have received before it queues this item.
    """

    __slots__ = ("block", "credits", "inline", "item", "link", "small", "timeout")

    def __init__(self, link: PutLink, item: object, block: bool, timeout: float | None) -> None:
        self.link = link
        self.item = item
        self.block = block
        self.timeout = timeout
        self.small = rides_inline(item)
        self.inline = False

    def __call__(self, token: int) -> PutMessage | PutInlineMessage:
        link = self.link
        credits = link.want_credits() if self.block else 0
        if self.small and link.puts_settled():
            self.inline = True
            sync = link.sync()  # reentrant: the link's lock is held already
            return (PUT_INLINE, token, self.block, self.timeout, credits, sync, self.item)
        return (PUT, token, self.block, self.timeout, credits)
