"""The relay: targets ordered by node and arranged as a chain or a tree under the source.

The source sends every byte once, to the first target; each target forwards to at most
``fanout`` others (``fanout=1``: a chain). Targets are ordered by node so that consecutive
hops stay on one node (where the groups use shared memory) and each node is entered once
on a chain; on each node the targets that can take a delta come first, so that a delta
travels as far as it can before a target needs a full copy.

With lending (``lend=True``), one target per node is in that chain or tree (the node's
entry: the first in the order above) and every other target of a node hangs directly
under its node's entry, or under the source on the source's own node; those leaves read
full buckets by reference from their parent's shared arena (see ``_arena``), so a node
holds each bucket once however many targets it has. Leaves do not count against
``fanout``: lending one costs its parent no copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def check_fanout(value: object) -> int:
    """Return ``value`` if it is a valid fan-out (an int >= 1), else raise naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"fanout: expected an int, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"fanout: got {value}; allowed: 1 (a chain) or more (a tree)")
    return value


@dataclass(frozen=True)
class Tree:
    """Who sends to whom: ``parent[name]`` for every target (the source's is absent)."""

    source: str
    order: tuple[str, ...]
    parent: dict[str, str]
    lent: tuple[str, ...] = ()
    """The leaves that read full buckets from their parent's arena."""

    def children(self, name: str) -> list[str]:
        """The nodes ``name`` sends to, in order."""
        return [t for t in self.order if self.parent[t] == name]

    def ancestors(self, name: str) -> list[str]:
        """From ``name``'s parent up to the source."""
        out: list[str] = []
        while name in self.parent:
            name = self.parent[name]
            out.append(name)
        return out


def build_tree(
    source: str,
    targets: Sequence[tuple[str, int, int]],
    fanout: int,
    *,
    lend: bool = False,
    source_node: int | None = None,
) -> Tree:
    """Arrange ``(name, node, stale_buckets)`` targets under ``source``.

    Order: by node, then fewest stale buckets first (they pass deltas on), then name.
    The first relayed target's parent is the source; relayed target ``j`` > 0 hangs
    under relayed target ``(j - 1) // fanout`` (breadth first). Without ``lend`` every
    target is relayed; with it, only each node's entry (none on ``source_node``), and
    the others are lent leaves under their entry (or the source).
    """
    check_fanout(fanout)
    ranked = sorted(targets, key=lambda t: (t[1], t[2], t[0]))
    order = tuple(name for name, _, _ in ranked)
    parent: dict[str, str] = {}
    lent: list[str] = []
    relayed: list[str] = []
    entry: dict[int, str] = {}
    for name, node, _ in ranked:
        if not lend:
            relayed.append(name)
        elif node == source_node:
            parent[name] = source
            lent.append(name)
        elif node in entry:
            parent[name] = entry[node]
            lent.append(name)
        else:
            entry[node] = name
            relayed.append(name)
    for j, name in enumerate(relayed):
        parent[name] = source if j == 0 else relayed[(j - 1) // fanout]
    return Tree(source, order, parent, tuple(lent))
