"""WorkerAddress: a worker's hierarchical name, root group name plus a path of ranks."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import total_ordering
from typing import cast

_SEP = ":"
_GROUP_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_group_name(name: object, arg: str = "name") -> str:
    """Return ``name`` if it is a valid group name, else raise ``TypeError``/``ValueError``."""
    if not isinstance(name, str):
        raise TypeError(f"{arg} must be a str, got {type(name).__name__}")
    if not _GROUP_RE.match(name):
        raise ValueError(
            f"{arg}={name!r} is not a valid group name: use letters, digits, '_', '.' and '-' "
            f"(no '{_SEP}', which separates ranks in worker addresses)"
        )
    return name


def _check_ranks(ranks: int | Iterable[int], arg: str = "ranks") -> tuple[int, ...]:
    if isinstance(ranks, bool):
        raise TypeError(f"{arg} must be an int or a sequence of ints, got bool")
    if not isinstance(ranks, (int, Iterable)) or isinstance(ranks, (str, bytes)):
        raise TypeError(f"{arg} must be an int or a sequence of ints, got {type(ranks).__name__}")
    seq: tuple[object, ...] = (ranks,) if isinstance(ranks, int) else tuple(ranks)
    for r in seq:
        if not isinstance(r, int) or isinstance(r, bool):
            raise TypeError(f"{arg} must hold ints, got {r!r} ({type(r).__name__})")
        if r < 0:
            raise ValueError(f"{arg} must hold ranks >= 0, got {r}")
    return cast("tuple[int, ...]", seq)  # every item checked above


def parse_group_name(name: object, arg: str = "group_name") -> WorkerAddress:
    """Read a group name as ``send``/``recv`` and collectives take it, as an address.

    Two forms name a group of workers: a root group's name (``"trainer"``, whose workers
    are ``trainer:0``, ``trainer:1``, ...) and the address of a worker whose children
    form the group (``"trainer:0"``, whose children are ``trainer:0:0``, ...). The
    latter is the ``name`` of a child :class:`~p2p_worker.WorkerGroup`.

    Args:
        name: The group name.
        arg: Argument name used in error messages.

    Returns:
        The address of the group: no ranks for a root group, the parent's ranks for a
        child group.

    Raises:
        TypeError: ``name`` is not a str.
        ValueError: ``name`` is neither a valid group name nor a worker address.

    Example:
        >>> parse_group_name("trainer:0").get_child_address(1)
        WorkerAddress('trainer:0:1')
    """
    if isinstance(name, str) and _SEP in name:
        try:
            return WorkerAddress.from_name(name)
        except ValueError as exc:
            raise ValueError(
                f"{arg}={name!r} is neither a group name nor a worker address ('group:rank:...'"
                f" names the children of that worker): {exc}"
            ) from None
    return WorkerAddress(check_group_name(name, arg))


def member_address(
    group_name: object, rank: object, group_arg: str = "group_name", rank_arg: str = "rank"
) -> WorkerAddress:
    """The address of worker ``rank`` (an int or a rank path) of group ``group_name``.

    ``member_address("g", (0, 1))`` and ``member_address("g:0", 1)`` are both ``g:0:1``.

    Raises:
        TypeError: A name or a rank has the wrong type.
        ValueError: The name is invalid or a rank is negative or the path is empty.

    Example:
        >>> member_address("g:0", 1) == member_address("g", [0, 1])
        True
    """
    base = parse_group_name(group_name, group_arg)
    try:
        ranks = _check_ranks(rank, rank_arg)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{rank_arg}={rank!r}: {exc}") from None
    if not ranks:
        raise ValueError(f"{rank_arg}={rank!r}: give a rank or a non-empty rank path")
    return WorkerAddress(base.root_group_name, (*base.ranks, *ranks))


@total_ordering
@dataclass(frozen=True, init=False)
class WorkerAddress:
    """Unique, hierarchical name of a worker: a root group name and a path of ranks.

    ``WorkerAddress("trainer", 3)`` is rank 3 of the root group ``trainer`` and prints as
    ``"trainer:3"``; a worker that rank 3 created as its child of rank 1 is
    ``"trainer:3:1"``. The address with no ranks names the root group itself. Addresses
    are immutable, hashable and ordered (by group name, then rank path), so they work as
    dict keys and sort deterministically. Every worker can address every other, even in
    another group, which is how ``Worker.send`` finds its peer.

    Args:
        root_group_name: Name of the root worker group (letters, digits, ``_ . -``).
        ranks: One rank or a path of ranks from the root group downwards.

    Raises:
        TypeError: ``root_group_name`` is not a str or a rank is not an int.
        ValueError: The group name is empty or holds ``':'``, or a rank is negative.

    Example:
        >>> addr = WorkerAddress("trainer", (3, 1))
        >>> addr.get_name()
        'trainer:3:1'
        >>> addr.get_parent_address().get_name(), addr.get_parent_rank()
        ('trainer:3', 3)
        >>> WorkerAddress.from_name("trainer:3").get_child_address(0)
        WorkerAddress('trainer:3:0')
    """

    root_group_name: str
    ranks: tuple[int, ...]

    def __init__(self, root_group_name: str, ranks: int | Iterable[int] = ()) -> None:
        object.__setattr__(self, "root_group_name", check_group_name(root_group_name))
        object.__setattr__(self, "ranks", _check_ranks(ranks))

    @classmethod
    def from_name(cls, name: str) -> WorkerAddress:
        """Parse an address from its string form, e.g. ``"trainer:3:1"``.

        Args:
            name: The text ``get_name()`` produces.

        Returns:
            The address.

        Raises:
            TypeError: ``name`` is not a str.
            ValueError: ``name`` is not ``group[:rank]*`` with non-negative int ranks.

        Example:
            >>> WorkerAddress.from_name("g:0:2").ranks
            (0, 2)
        """
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        group, *parts = name.split(_SEP)
        ranks: list[int] = []
        for part in parts:
            if not part.isdigit():
                raise ValueError(
                    f"name={name!r} is not a worker address: expected 'group:rank:...' "
                    f"with non-negative integer ranks, got rank {part!r}"
                )
            ranks.append(int(part))
        return cls(group, ranks)

    def get_name(self) -> str:
        """Return the string form: the group name and the ranks joined by ``':'``."""
        return _SEP.join([self.root_group_name, *map(str, self.ranks)])

    @property
    def rank(self) -> int | None:
        """The last rank of the path (this worker's rank in its group); ``None`` for a group."""
        return self.ranks[-1] if self.ranks else None

    def get_parent_address(self) -> WorkerAddress | None:
        """Return the address one level up (a root worker's parent is its root group).

        Returns:
            The parent address, or ``None`` for a root group's address (no ranks).
        """
        if not self.ranks:
            return None
        return WorkerAddress(self.root_group_name, self.ranks[:-1])

    def get_parent_rank(self) -> int | None:
        """Return the rank of the parent worker, or ``None`` when the parent is a root group.

        Example:
            >>> WorkerAddress("g", (2, 5)).get_parent_rank()
            2
            >>> WorkerAddress("g", 2).get_parent_rank() is None
            True
        """
        return self.ranks[-2] if len(self.ranks) >= 2 else None

    def get_child_address(self, rank: int) -> WorkerAddress:
        """Return the address of this worker's child ``rank`` (one level down).

        Raises:
            TypeError: ``rank`` is not an int.
            ValueError: ``rank`` is negative.
        """
        return WorkerAddress(self.root_group_name, (*self.ranks, *_check_ranks(rank, "rank")))

    def _key(self) -> tuple[str, tuple[int, ...]]:
        return (self.root_group_name, self.ranks)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, WorkerAddress):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        return self.get_name()

    def __repr__(self) -> str:
        return f"WorkerAddress({self.get_name()!r})"
