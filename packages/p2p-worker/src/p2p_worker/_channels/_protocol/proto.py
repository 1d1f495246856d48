"""What a channel worker and its peers agree on: names, the creation spec, the hello answer."""

from __future__ import annotations

import math
import re
from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Literal, TypedDict, cast

from p2p_collective import CollectiveGroup, MultiCollectiveGroup
from p2p_worker._address import WorkerAddress
from p2p_worker._runtime._state import JobContext

CHANNEL_NAMESPACE = "p2p_channels"
DEFAULT_TRANSFER_TIMEOUT = 60.0  # seconds one payload transfer may take, by default
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_channel_name(name: object) -> str:
    """Return ``name`` if it is a valid channel name.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: ``name`` is empty or holds other than letters, digits, ``_ . -``.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if not _NAME_RE.match(name):
        raise ValueError(
            f"name={name!r} is not a valid channel name: use letters, digits, '_', '.' and '-'"
        )
    return name


@dataclass(frozen=True)
class ChannelSpec:
    """What a channel worker is created with."""

    name: str
    uid: str
    maxsize: int
    job: JobContext
    node_rank: int
    transfer_timeout: float | None


@dataclass(frozen=True)
class Hello:
    """The channel worker's answer to a peer that connects."""

    name: str
    uid: str
    maxsize: int
    address: str
    gen: int
    transfer_timeout: float | None


class ChannelStats(TypedDict):
    """The channel worker's counters (``Channel.stats()``; see its docstring)."""

    name: str
    maxsize: int
    held: int
    queued: int
    arriving: int
    waiting_putters: int
    waiting_getters: int
    credits: int
    keys: dict[str, int]
    closed: bool
    peers: dict[str, int]
    puts: int
    gets: int
    failures: int
    resets: int
    voids: int
    inline: int
    prefetched: int


def wire_timeout(seconds: float | None) -> float:
    """The timeout of a collective operation for a channel's ``seconds`` (None: no limit).

    The collective reads ``timeout=None`` as its configured ``op_timeout``, so "no limit"
    is passed as ``math.inf``. A receive that waits for a peer's next request or answer
    (idle for as long as the peer likes) uses ``wire_timeout(None)``: a job's short
    ``op_timeout`` must not end it (a put waiting for room sends nothing for a while).
    """
    return math.inf if seconds is None else seconds


def channel_address(name: str) -> WorkerAddress:
    """The worker address of the channel worker of channel ``name``."""
    return WorkerAddress(f"p2p_channel.{name}", 0)


def pair(group: CollectiveGroup | MultiCollectiveGroup) -> CollectiveGroup:
    """``group`` as the pair group it is: every group of a channel has two members."""
    return cast("CollectiveGroup", group)


def link_group_name(uid: str, peer: str, gen: int) -> str:
    """Name of the collective group of one peer's link, shared by both sides."""
    return f"p2pch.{uid}.{peer}.{gen}"


def control_group_name(uid: str, peer: str, gen: int) -> str:
    """Name of the collective group that carries one peer's requests to the channel worker."""
    return f"p2pch.{uid}.{peer}.{gen}.ctl"


# Requests travel on a peer's control group as plain tuples (cheap to pickle):
#   (PUT, token, block, timeout, credits)
#   (PUT_INLINE, token, block, timeout, credits, sync, obj): a small item riding in its
#       put request (see INLINE_BYTES); granted, it enters the channel at once
#   (GET, token, max_items, max_bytes, block, timeout, sync, key, target_weight, prefetch)
#       prefetch > 1: a blocking get() that may take up to ``prefetch`` items at once;
#       it reserved the tokens token .. token + prefetch - 1, one per item (see PREFETCH)
#   (GIVE_BACK, token, ...): prefetched items of these tokens were not used: back to the head
#   (ACK, token, ...): the items of gets ``token, ...`` have arrived
#   (ACKED, (token, ...), request): those acknowledgements riding on a request
#   (QSIZE, token, sync, key): how many items ``key`` holds (the answer is the count)
# Answers travel back on the peer's link as (token, answer, count) where answer is an int
# as below or an exception, followed by ``count`` items (the items a get was granted), or
# as (token, answer, 0, objects) with the items inline (items without tensors). A receipt
# (RECEIPT, n, 0) says that n of the peer's payloads on this link have arrived.
AnswerMessage = (
    tuple[int, int | BaseException, int] | tuple[int, int | BaseException, int, list[object]]
)
"""An answer as it travels: ``(token, answer, count)`` or ``(token, answer, 0, objects)``."""

PUT: Final = 0
GET: Final = 1
ACK: Final = 2
QSIZE: Final = 3
ACKED: Final = 4
PUT_INLINE: Final = 5
GIVE_BACK: Final = 6
RECEIPT: Final = -1  # the token of a receipt (requests are numbered from 0)

if TYPE_CHECKING:  # the requests above as types (Literal[n]: the kinds just defined)
    from typing import TypeAlias, Unpack

    Sync: TypeAlias = tuple[int, int]  # (link generation, payloads sent on it)
    PutMessage: TypeAlias = tuple[Literal[0], int, bool, float | None, int]
    PutInlineMessage: TypeAlias = tuple[Literal[5], int, bool, float | None, int, Sync, object]
    GetMessage: TypeAlias = tuple[
        Literal[1], int, int, int | None, bool, float | None, Sync, Hashable, int | None, int
    ]
    QsizeMessage: TypeAlias = tuple[Literal[3], int, Sync, Hashable]
    GiveBackMessage: TypeAlias = tuple[Literal[6], Unpack[tuple[int, ...]]]
    AckMessage: TypeAlias = tuple[Literal[2], Unpack[tuple[int, ...]]]
    Served: TypeAlias = PutMessage | PutInlineMessage | GetMessage | QsizeMessage
    """A request that the channel worker answers."""
    Carried: TypeAlias = Served | GiveBackMessage
    """A request that acknowledgements may ride on."""
    AckedMessage: TypeAlias = tuple[Literal[4], tuple[int, ...], Carried]
    Request: TypeAlias = Carried | AckMessage | AckedMessage
    """A message of either kind on a peer's control group."""

PREFETCH = 8
"""Most items a blocking ``get()`` takes at once when queued (see ``_channels._client.prefetch``).

Only items without tensors, only when the channel worker can answer at once and no
other get of that key waits; each extra item is numbered with a token the request
reserved, so it is acknowledged (or given back) on its own."""

INLINE_BYTES = 1024
"""Largest pickled item without tensors that rides inside its put request.

Such a put costs one request and one answer, no payload message. While it waits for
room the channel worker holds the item (as it holds the request); a process sends at
most one such put at a time (the next ones take the payload path), so waiting inline
puts hold at most ``INLINE_BYTES`` per producer beyond ``maxsize`` items."""


def actor_name(store_host: str, store_port: int, name: str) -> str:
    """The Ray actor name of a channel, scoped to its job by the job's store address."""
    return f"{store_host}:{store_port}/{name}"


# An answer travels as one int, cheap to pickle (and to return from put_begin over Ray).
# Negative: no grant; otherwise gen * _SPLIT + count.
NO_ROOM = -1  # put: full; get: empty
CANCELLED_ANSWER = -2  # the call was withdrawn (ChannelWork.cancel): nothing put or taken
RESET_ANSWER = -3  # the peer's link was reset while the call waited: nothing put or taken
_SPLIT = 1 << 32
MAX_BATCH = _SPLIT - 1


def granted(gen: int, count: int = 0) -> int:
    """The answer granting ``count`` items (0 for a put) on link generation ``gen``."""
    return gen * _SPLIT + count


def decode(answer: int) -> tuple[int, int]:
    """``(gen, count)`` of a granting answer (``answer >= 0``)."""
    return divmod(answer, _SPLIT)
