"""Keys and weights of channel items (RLinf's channel model).

A channel holds one FIFO per *key*; an item put with ``key=k`` is got only by a
``get(key=k)`` / ``get_batch(key=k)``. Items without a key go to :data:`DEFAULT_KEY`
(RLinf's name for it). A *weight* (an int >= 0) lets ``get_batch(target_weight=w)``
collect items until their weights add up to ``w``. An item put with a key or a weight
travels to the channel worker in a :class:`Keyed` envelope, which the channel worker
opens; unkeyed, unweighted items travel bare, as before.
"""

from __future__ import annotations

import pickle
from collections.abc import Hashable
from dataclasses import dataclass

DEFAULT_KEY = "default_queue"
"""The key of items put without one (the same value as RLinf's)."""


@dataclass(frozen=True)
class Keyed:
    """An item with its key and weight, on its way to the channel worker.

    Attributes:
        key: The item's key (hashable, picklable).
        weight: The item's weight (>= 0).
        item: The item itself.
    """

    key: Hashable
    weight: int
    item: object


def check_key(key: object) -> Hashable:
    """Return ``key`` if it can name a channel queue.

    Raises:
        TypeError: ``key`` is unhashable or cannot be pickled.
    """
    try:
        hash(key)
        pickle.dumps(key)
    except Exception as exc:
        raise TypeError(
            f"key={key!r}: a channel key must be hashable and picklable ({exc})"
        ) from None
    return key


def check_weight(weight: object, arg: str = "weight") -> int:
    """Return ``weight`` if it is an int >= 0.

    Raises:
        TypeError: ``weight`` is not an int.
        ValueError: ``weight`` is negative.
    """
    if isinstance(weight, bool) or not isinstance(weight, int):
        raise TypeError(f"{arg} must be an int, got {weight!r}")
    if weight < 0:
        raise ValueError(f"{arg} must be >= 0, got {weight}")
    return weight


def wrap(item: object, key: Hashable, weight: int) -> object:
    """The object to send for ``item``: bare when it has neither key nor weight."""
    if weight == 0 and key == DEFAULT_KEY:
        return item
    return Keyed(key, weight, item)


def unwrap(obj: object) -> tuple[object, Hashable, int]:
    """``(item, key, weight)`` of a received object (bare or :class:`Keyed`)."""
    if isinstance(obj, Keyed):
        return obj.item, obj.key, obj.weight
    return obj, DEFAULT_KEY, 0


def batch_weight(weight: int) -> int:
    """What an item adds to a batch's weight: its weight, and 1 for weight 0.

    With RLinf's rule an item of weight 0 adds nothing, so ``get_batch(target_weight=4)``
    on unweighted items would never be filled; counting it as 1 makes the target a
    count there, and changes nothing for weighted items.
    """
    return weight if weight > 0 else 1
