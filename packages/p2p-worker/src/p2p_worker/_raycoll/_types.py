"""``ReduceOp`` and ``Backend`` with Ray's names and values, and the backend check."""

from __future__ import annotations

import enum
from typing import TypeAlias

from p2p_worker._raycoll._errors import BackendUnavailableError

_GLOO_NAMES = ("GLOO", "TORCH_GLOO")


class ReduceOp(enum.Enum):
    """The reduction of ``allreduce``, ``reduce`` and ``reducescatter`` (Ray's values).

    The strings ``"sum"``, ``"product"``, ``"min"``, ``"max"`` and Ray's own
    ``ray.util.collective.types.ReduceOp`` members are accepted as well.

    Example:
        >>> ReduceOp.SUM.value, ReduceOp.MAX.name
        (0, 'MAX')
    """

    SUM = 0
    PRODUCT = 1
    MIN = 2
    MAX = 3


ReduceOpLike: TypeAlias = ReduceOp | enum.Enum | str
"""What ``op`` takes: a :class:`ReduceOp`, Ray's ``ReduceOp`` member, or a name (``"sum"`` ...)."""


class Backend:
    """Backend names as in Ray: ``Backend("gloo")`` is ``Backend.GLOO`` (the string ``"GLOO"``).

    ``"torch_gloo"`` names the gloo backend too. ``Backend.NCCL`` exists so code written
    for Ray imports unchanged, but a group on it raises :class:`BackendUnavailableError`
    until the accelerator transport of N-member groups exists.

    Raises:
        ValueError: The name is none of ``nccl``, ``gloo``, ``torch_gloo`` (any case).

    Example:
        >>> Backend("torch_gloo") == Backend.GLOO == "GLOO"
        True
    """

    NCCL = "NCCL"
    GLOO = "GLOO"
    UNRECOGNIZED = "unrecognized"

    def __new__(cls, name: str) -> str:  # type: ignore[misc]
        """Return the canonical name of the backend ``name``."""
        key = str(name).upper()
        if key in _GLOO_NAMES:
            return cls.GLOO
        if key == cls.NCCL:
            return cls.NCCL
        raise ValueError(f"backend: got {name!r}; allowed: 'gloo', 'torch_gloo' or 'nccl'")


def check_backend(backend: object) -> str:
    """Return ``"GLOO"`` for a gloo backend name; refuse anything else with a clear error.

    Raises:
        BackendUnavailableError: ``backend`` is NCCL (not available yet) or unknown.
    """
    key = backend.upper() if isinstance(backend, str) else None
    if key in _GLOO_NAMES:
        return Backend.GLOO
    if key == Backend.NCCL:
        raise BackendUnavailableError(
            f"backend: got {backend!r}; the NCCL transport of N-member groups is not"
            " available in this version (no accelerator transport for collectives yet);"
            " use backend='gloo' with CPU tensors or numpy arrays. Note that Ray's default"
            " backend is NCCL, so pass backend='gloo' explicitly."
        )
    raise BackendUnavailableError(
        f"backend: got {backend!r}; allowed: 'gloo' or 'torch_gloo' ('nccl' once the"
        " accelerator transport exists)"
    )
