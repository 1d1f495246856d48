"""``ReduceOp`` and ``Backend``, where Ray keeps them (``ray.util.collective.types``).

So ``from ray.util.collective.types import ReduceOp`` becomes
``from p2p_worker.compat.types import ReduceOp``.

Example:
    >>> from p2p_worker.compat.types import Backend, ReduceOp
    >>> Backend("gloo"), ReduceOp.SUM.value
    ('GLOO', 0)
"""

from __future__ import annotations

from p2p_worker._raycoll._types import Backend, ReduceOp

__all__ = ["Backend", "ReduceOp"]
