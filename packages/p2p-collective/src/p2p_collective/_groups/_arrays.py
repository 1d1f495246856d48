"""Tensor views of what users pass to collectives: torch tensors and numpy arrays."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt
import torch

from p2p_collective._frames._payload import check_tensor

ArrayT = TypeVar("ArrayT", bound="torch.Tensor | npt.NDArray[np.generic]")
"""A tensor argument of a collective: a torch tensor or a numpy array, returned as given."""


def as_tensor(
    value: object, where: str = "tensor", op: str = "as_tensor", *, writable: bool = False
) -> torch.Tensor:
    """A CPU torch tensor that shares memory with ``value``, checked for the wire.

    A ``torch.Tensor`` is returned as is; a ``numpy.ndarray`` is viewed through
    ``torch.from_numpy`` (no copy), so results written into the tensor land in the
    array. N-member groups and p2p-worker's ``compat`` module take their tensor
    arguments through this one check.

    Args:
        value: A torch tensor or a numpy array.
        where: The argument's name, for messages (e.g. ``"tensor_list[2]"``).
        op: The operation, for messages (e.g. ``"allreduce"``).
        writable: The result is written into ``value``: refuse a read-only array. (The
            caller holds the array itself, so a read-only one is a mistake here, or
            memory that must not be written, such as ``bytes`` or a read-only ``mmap``.
            p2p-worker's ``compat`` module, a drop-in for Ray's library, writes into
            Ray's read-only object-store views as Ray does, with a warning.)

    Returns:
        The tensor view.

    Raises:
        TypeError: ``value`` is neither a torch tensor nor a numpy array.
        ValueError: It is not dense and C-contiguous, not on CPU, of a dtype that cannot
            travel (the message names ``where`` and what is allowed), or (with
            ``writable``) a read-only array.

    Example:
        >>> import numpy as np
        >>> from p2p_collective import as_tensor
        >>> a = np.zeros(3, dtype=np.float32)
        >>> as_tensor(a, writable=True).add_(1.0) is not None and float(a.sum())
        3.0
    """
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise ValueError(
                f"{op}: {where} is a non-contiguous numpy array; use np.ascontiguousarray"
            )
        if writable and not value.flags.writeable:
            raise ValueError(
                f"{op}: {where} is a read-only numpy array; the result is written in place"
            )
        try:
            tensor = torch.from_numpy(value)
        except TypeError as exc:
            raise ValueError(
                f"{op}: {where} has numpy dtype {value.dtype}, which torch cannot view: {exc}"
            ) from exc
    elif isinstance(value, torch.Tensor):
        tensor = value
    else:
        raise TypeError(
            f"{op}: {where} is a {type(value).__name__}; allowed: torch.Tensor or"
            " numpy.ndarray (CPU)"
        )
    if tensor.device.type != "cpu":
        raise ValueError(
            f"{op}: {where} is on {tensor.device}; collectives run on CPU (gloo) in this"
            " version -- the accelerator transport is not available yet; use .cpu()"
        )
    check_tensor(tensor, where, op)
    return tensor
