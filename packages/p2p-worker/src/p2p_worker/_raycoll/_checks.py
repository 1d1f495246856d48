"""Argument checks in Ray's terms, done before anything is queued or sent.

The conditions and exception bases follow ``ray.util.collective``: an unsupported tensor
type or a malformed tensor list is a ``RuntimeError`` there, a rank out of range a
``ValueError``, a bad size or rank at initialization an ``AssertionError``. The types
here are all of those plus a p2p type (see :mod:`p2p_worker._raycoll._errors`).
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import TypeAlias

import numpy as np
import numpy.typing as npt
import torch

from p2p_asyncwork.internal import CONFIGURED
from p2p_asyncwork.internal import check_timeout as check_seconds
from p2p_collective import as_tensor
from p2p_worker._raycoll._errors import (
    CollectiveArgumentError,
    GroupSpecError,
    ReadOnlyArrayWarning,
    TensorTypeError,
)

Tensor: TypeAlias = torch.Tensor | npt.NDArray[np.generic]
"""What the operations take: a CPU ``torch.Tensor`` or a ``numpy.ndarray``."""

_TORCH_READ_ONLY = "The given NumPy array is not writable"
"""The start of torch's own warning at ``torch.from_numpy`` of a read-only array."""
_OUR_MODULES = ("p2p_worker._raycoll", "p2p_worker.compat")

_warned_lock = threading.Lock()
_warned = False


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_group_name(group_name: object) -> str:
    """Return ``group_name``; refuse anything but a non-empty string.

    Raises:
        CollectiveArgumentError: ``group_name`` is empty or not a string.
    """
    if not isinstance(group_name, str) or not group_name:
        raise CollectiveArgumentError(
            f"group_name: got {group_name!r}; allowed: a non-empty string"
        )
    return group_name


def check_spec(world_size: object, rank: object) -> tuple[int, int]:
    """Check ``world_size >= 1`` and ``0 <= rank < world_size`` (Ray asserts both).

    Raises:
        GroupSpecError: Either is not an int in range.
    """
    if not _is_int(world_size) or world_size < 1:  # type: ignore[operator]
        raise GroupSpecError(f"world_size: got {world_size!r}; allowed: an int >= 1")
    if not _is_int(rank) or not 0 <= rank < world_size:  # type: ignore[operator]
        raise GroupSpecError(
            f"rank: got {rank!r}; allowed: an int in 0..{world_size - 1}"  # type: ignore[operator]
        )
    assert isinstance(world_size, int)
    assert isinstance(rank, int)
    return world_size, rank


def check_gloo_timeout(gloo_timeout: object) -> float:
    """Return ``gloo_timeout`` (milliseconds, as in Ray) in seconds.

    Raises:
        CollectiveArgumentError: It is not a number >= 0.
    """
    if isinstance(gloo_timeout, bool) or not isinstance(gloo_timeout, (int, float)):
        raise CollectiveArgumentError(
            f"gloo_timeout: got {gloo_timeout!r}; allowed: milliseconds >= 0"
        )
    if gloo_timeout < 0:
        raise CollectiveArgumentError(
            f"gloo_timeout: got {gloo_timeout!r}; allowed: milliseconds >= 0"
        )
    return float(gloo_timeout) / 1000.0


def check_timeout(timeout: object) -> float | None:
    """Return ``timeout`` (seconds or None).

    Raises:
        CollectiveArgumentError: It is neither None nor a number >= 0.
    """
    try:
        return check_seconds(timeout, none=CONFIGURED)
    except ValueError as exc:
        raise CollectiveArgumentError(str(exc)) from None


def check_tensor(value: object, where: str, op: str) -> None:
    """Refuse anything that is neither a ``torch.Tensor`` nor a ``numpy.ndarray``.

    Raises:
        TensorTypeError: The message names the argument, its type and what is allowed.
    """
    if not isinstance(value, (torch.Tensor, np.ndarray)):
        raise TensorTypeError(
            f"{op}: {where} is a {type(value).__name__}; allowed: torch.Tensor or"
            " numpy.ndarray (CPU)"
        )


def check_tensor_list(value: object, where: str, op: str, length: int | None) -> list[Tensor]:
    """Check a non-empty list of tensors (of ``length`` items when given); return it.

    Raises:
        TensorTypeError: ``value`` is not a list, or an item is not a tensor/array.
        CollectiveArgumentError: The list is empty or has the wrong length.
    """
    if not isinstance(value, list):
        raise TensorTypeError(
            f"{op}: {where} is a {type(value).__name__}; allowed: a list of tensors"
        )
    if not value:
        raise CollectiveArgumentError(f"{op}: {where} is an empty list; allowed: a list of tensors")
    for i, item in enumerate(value):
        check_tensor(item, f"{where}[{i}]", op)
    if length is not None and len(value) != length:
        raise CollectiveArgumentError(
            f"{op}: {where} has {len(value)} tensors; allowed: exactly world_size = {length}"
        )
    return value


def check_rank(rank: object, world_size: int, arg: str) -> int:
    """Check ``0 <= rank < world_size``; return it.

    Raises:
        CollectiveArgumentError: (a ``ValueError``, as in Ray) naming ``arg``.
    """
    if not _is_int(rank) or not 0 <= rank < world_size:  # type: ignore[operator]
        raise CollectiveArgumentError(
            f"{arg}: got {rank!r}; allowed: a rank in 0..{world_size - 1} (world_size {world_size})"
        )
    assert isinstance(rank, int)
    return rank


def check_not_self(rank: int, own: int, arg: str) -> None:
    """Refuse a send or receive to this member itself (a ``RuntimeError`` in Ray).

    Raises:
        CollectiveArgumentError: ``rank`` is this member's own rank.
    """
    if rank == own:
        raise CollectiveArgumentError(f"{arg}: got {rank}, this member's own rank")


def as_torch(value: Tensor, where: str, op: str, *, writable: bool = False) -> torch.Tensor:
    """A torch view of a CPU tensor or numpy array (no copy): ``p2p_collective.as_tensor``.

    A read-only numpy array is viewed as it is, as Ray's library does: with
    ``writable`` (the operation writes its result into it) the result lands in the
    array all the same, and the first such write in the process issues a
    :class:`ReadOnlyArrayWarning`. Torch's own warning about a non-writable array is
    kept quiet here; ours names the hazard instead.

    Raises:
        TensorTypeError: Neither a tensor nor an array.
        CollectiveArgumentError: Not contiguous, not on CPU, or of a dtype that cannot
            travel.
    """
    check_tensor(value, where, op)
    try:
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            # torch warns once per process (TORCH_WARN_ONCE); the filter is global while
            # the block runs, and only ever hides that one message
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", _TORCH_READ_ONLY, UserWarning)
                tensor = as_tensor(value, where, op)
            if writable:
                _warn_read_only(where, op)
            return tensor
        return as_tensor(value, where, op, writable=writable)
    except ValueError as exc:
        raise CollectiveArgumentError(str(exc)) from exc


def _warn_read_only(where: str, op: str) -> None:
    """Issue :class:`ReadOnlyArrayWarning` the first time in this process; else nothing.

    Counted once the warning returned: under a filter that turns it into an error, every
    such write raises it (before anything is written), so that filter makes the layer
    refuse read-only arrays as p2p-collective does.
    """
    global _warned
    with _warned_lock:
        if _warned:
            return
        _warn(where, op)
        _warned = True


def _warn(where: str, op: str) -> None:
    warnings.warn(
        f"{op}: {where} is a read-only numpy array, such as the zero-copy view of an"
        " object in Ray's object store that an actor receives as an argument or from"
        " ray.get; the result is written into it in place, as ray.util.collective does,"
        " which changes the object for every other reader of it on this node. Pass a"
        " copy (np.array(a)) to keep the object unchanged. (Warned once per process.)",
        ReadOnlyArrayWarning,
        stacklevel=_caller_level(),
    )


def _caller_level() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside this layer."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and str(frame.f_globals.get("__name__", "")).startswith(_OUR_MODULES):
        level += 1
        frame = frame.f_back  # type: ignore[assignment]
    return level
