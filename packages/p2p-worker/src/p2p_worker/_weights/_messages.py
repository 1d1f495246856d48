"""The small messages of a sync, as plain tuples (they travel pickled, inline).

``hello`` (target -> source): what the target holds. ``plan`` (source -> every
target): the version, the layout parameters and the relay tree. ``bucket`` headers
travel down the tree, each followed by its payload unless the bucket is unchanged or
lent (its bits wait in the parent's shared arena). A bucket travels ``full`` (its
bits), ``packed`` (its bits, compressed without loss: a p2p-compress full patch, which
needs no base), ``delta`` (a patch against the base), ``same`` or ``lent``. ``lend``
(parent -> a same-node child, before the buckets) names that arena; ``borrow`` (the
child's answer) says whether the child mapped it. ``result`` (target -> source): what
the target holds afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TypeVar, overload

from p2p_collective import FramingError

FULL, PACKED, DELTA, SAME, LENT = "full", "packed", "delta", "same", "lent"


@dataclass(frozen=True)
class Hello:
    """What a target holds: its tensors, the layout and bucket generations it holds."""

    name: str
    node: int
    entries: tuple[tuple[str, tuple[int, ...], str], ...]  # (key, shape, dtype)
    digest: str | None
    gens: tuple[str | None, ...]
    version: int | None


@dataclass(frozen=True)
class Plan:
    """One version's sync: layout parameters, the tree, who holds which bucket's base."""

    version: int
    gen: str
    bucket_bytes: int
    frozen: tuple[str, ...]
    order: tuple[str, ...]
    parent: dict[str, str]
    stale: dict[str, tuple[int, ...]]  # target -> buckets it does not hold the base of
    keys: tuple[int, ...]  # the targets' entries this source fills (all but for a shard)
    lent: tuple[str, ...] = ()  # targets whose parent lends them full buckets by reference


@dataclass(frozen=True)
class Lend:
    """A parent's shared arena (``fd`` of process ``pid``); ``fd`` -1: none, ``why``."""

    pid: int
    fd: int
    nbytes: int
    arena: str
    line: int
    why: str | None = None


@dataclass(frozen=True)
class Borrow:
    """A child's answer to :class:`Lend`: it mapped the arena, or ``why`` not."""

    ok: bool
    why: str | None = None


@dataclass(frozen=True)
class Abort:
    """The sync stops before or during the buckets; ``reason`` says why."""

    reason: str
    peer_died: bool = False


@dataclass(frozen=True)
class Resume:
    """A target whose parent died asks the source for the buckets from ``index`` on."""

    name: str
    index: int


@dataclass(frozen=True)
class Header:
    """One bucket: how it travels, the checksum of its new bits, the payload's size.

    ``lent``: no payload follows; ``meta["offset"]`` says where in the parent's arena the
    bucket's ``nbytes`` lie. ``packed`` and ``delta``: ``meta`` is the patch's, and
    ``nbytes`` the payload's size.
    """

    index: int
    mode: str
    crc: int
    meta: dict[str, int | str] | None
    nbytes: int


@dataclass(frozen=True)
class Result:
    """What a target holds after a sync (``version`` None: torn) and what went wrong."""

    name: str
    version: int | None
    error: str | None
    torn: bool


_KINDS: dict[str, type] = {
    c.__name__: c for c in (Hello, Plan, Lend, Borrow, Abort, Resume, Header, Result)
}


def to_wire(msg: object) -> tuple[object, ...]:
    """A message as a tuple of builtins (a receiver's ``object_policy="plain"`` takes it)."""
    return (type(msg).__name__, *(getattr(msg, f.name) for f in fields(msg)))  # type: ignore[arg-type]


T1 = TypeVar("T1")
T2 = TypeVar("T2")


@overload
def from_wire(obj: object, kinds: tuple[type[T1]], peer: str, what: str) -> T1: ...
@overload
def from_wire(obj: object, kinds: tuple[type[T1], type[T2]], peer: str, what: str) -> T1 | T2: ...


@overload
def from_wire(obj: object, kinds: tuple[type, ...], peer: str, what: str) -> object: ...


def from_wire(obj: object, kinds: tuple[type, ...], peer: str, what: str) -> object:
    """The message in ``obj`` if it is one of ``kinds``.

    Raises:
        FramingError: ``obj`` is no such message (the peers are out of step).
    """
    if isinstance(obj, tuple) and obj and obj[0] in _KINDS:
        cls = _KINDS[obj[0]]
        if cls in kinds and len(obj) == len(fields(cls)) + 1:
            return cls(*obj[1:])
    raise FramingError(
        f"weight sync: expected {' or '.join(k.__name__ for k in kinds)} from {peer}"
        f" ({what}), got {type(obj).__name__}: {obj!r:.200}"
    )
