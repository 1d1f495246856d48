"""What travels on a link besides requests and answers: a put's payload, or a ``Void``.

A payload is the item itself (its tensors on the tensor path); :func:`payload_nbytes` is
what both sides count of it (a put's item rides inline only without tensors; a get's
``max_bytes`` bounds it). A :class:`Void` fills a granted slot without an item.
"""

from __future__ import annotations

import dataclasses

import torch


def payload_nbytes(obj: object) -> int:
    """Tensor bytes of an item: what ``max_bytes`` of ``get_batch`` counts.

    Tensors, lists/tuples of tensors, dicts of tensors and dataclass tensor fields are
    counted; any other part of an item counts as 0 bytes.

    Example:
        >>> payload_nbytes({"x": torch.zeros(4), "step": 3})
        16
    """
    if isinstance(obj, torch.Tensor):
        return int(obj.numel() * obj.element_size())
    if isinstance(obj, (list, tuple)):
        return sum(payload_nbytes(x) for x in obj if isinstance(x, torch.Tensor))
    if isinstance(obj, dict):
        return sum(payload_nbytes(v) for v in obj.values() if isinstance(v, torch.Tensor))
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(
            payload_nbytes(v)
            for f in dataclasses.fields(obj)
            if isinstance(v := getattr(obj, f.name, None), torch.Tensor)
        )
    return 0


class Void:
    """Sent by a producer in place of its item when it abandoned a granted put.

    The channel worker frees the slot and queues nothing, so the producer's link stays
    in step without the item entering the channel.
    """

    def __repr__(self) -> str:
        return "<channel void>"
