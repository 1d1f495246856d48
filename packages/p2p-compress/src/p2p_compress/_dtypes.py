"""Torch dtypes written as strings in configuration (``"float32"``, ``"bfloat16"``)."""

from __future__ import annotations

import torch

# Canonical names first; aliases after. Only names this torch build defines are kept.
_CANONICAL = (
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex32",
    "complex64",
    "complex128",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
)
_ALIASES = (
    "half",
    "float",
    "double",
    "short",
    "int",
    "long",
    "chalf",
    "cfloat",
    "cdouble",
)


def _build_table() -> dict[str, torch.dtype]:
    table: dict[str, torch.dtype] = {}
    for name in (*_CANONICAL, *_ALIASES):
        value = getattr(torch, name, None)
        if isinstance(value, torch.dtype):
            table[name] = value
    return table


_BY_NAME = _build_table()
CANONICAL_DTYPE_NAMES: tuple[str, ...] = tuple(n for n in _CANONICAL if n in _BY_NAME)


def dtype_name(dtype: torch.dtype) -> str:
    """Return the canonical config spelling of ``dtype`` (``torch.float32`` -> ``"float32"``)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(value: object) -> torch.dtype | None:
    """Map ``"float32"``, ``"torch.float32"``, an alias (``"float"``) or a dtype to a dtype.

    Returns None when ``value`` names no dtype.
    """
    if isinstance(value, torch.dtype):
        return value
    if not isinstance(value, str):
        return None
    return _BY_NAME.get(value.strip().removeprefix("torch."))
