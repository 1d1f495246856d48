"""Deciding when a group call's arguments are big enough to put in the object store once."""

from __future__ import annotations

from collections.abc import Mapping

LARGE_ARGS_BYTES = 1 << 20


def _nbytes(value: object) -> int:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    nbytes = getattr(value, "nbytes", None)  # torch.Tensor, numpy.ndarray
    return nbytes if isinstance(nbytes, int) else 0


def looks_large(args: tuple[object, ...], kwargs: Mapping[str, object]) -> bool:
    """Return True if the arguments hold at least 1 MiB of tensors/arrays/bytes.

    Looks at the arguments and one level into lists, tuples and dicts; that is enough to
    catch a batch passed to every worker, which then travels to the object store once
    instead of once per worker.
    """
    total = 0
    for value in (*args, *kwargs.values()):
        total += _nbytes(value)
        if isinstance(value, (list, tuple)):
            total += sum(_nbytes(v) for v in value)
        elif isinstance(value, Mapping):
            total += sum(_nbytes(v) for v in value.values())
        if total >= LARGE_ARGS_BYTES:
            return True
    return False
