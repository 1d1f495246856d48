"""Synthetic tensors that stand in for typical payloads, for ``advise`` and benchmarks."""

from __future__ import annotations

from collections.abc import Callable

import torch

SYNTHETIC_KINDS: tuple[str, ...] = (
    "random_float32",
    "sparse_float32",
    "bf16_weights",
    "int64_token_ids",
    "bool_mask",
    "repeated",
)
"""Names accepted by :func:`make_synthetic_tensor`."""


def _random_float32(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(n // 4, generator=g)


def _sparse_float32(n: int, g: torch.Generator) -> torch.Tensor:
    values = torch.randn(n // 4, generator=g)
    return values * (torch.rand(n // 4, generator=g) < 0.1)


def _bf16_weights(n: int, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(n // 2, generator=g) * 0.02).to(torch.bfloat16)


def _int64_token_ids(n: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 50257, (n // 8,), generator=g, dtype=torch.int64)


def _bool_mask(n: int, g: torch.Generator) -> torch.Tensor:
    # Padding masks: rows of 1024 positions, each valid up to a random length.
    row = 1024
    rows = -(-n // row)
    lengths = torch.randint(0, row + 1, (rows, 1), generator=g)
    mask = torch.arange(row).expand(rows, row) < lengths
    return mask.reshape(-1)[:n].clone()


def _repeated(n: int, g: torch.Generator) -> torch.Tensor:
    # Runs of 16 equal float32 values drawn from 8 distinct values.
    count = n // 4
    palette = torch.randn(8, generator=g)
    picks = torch.randint(0, 8, (-(-count // 16),), generator=g)
    return palette[picks].repeat_interleave(16)[:count].clone()


_MAKERS: dict[str, Callable[[int, torch.Generator], torch.Tensor]] = {
    "random_float32": _random_float32,
    "sparse_float32": _sparse_float32,
    "bf16_weights": _bf16_weights,
    "int64_token_ids": _int64_token_ids,
    "bool_mask": _bool_mask,
    "repeated": _repeated,
}


def make_synthetic_tensor(kind: str, nbytes: int, *, seed: int = 0) -> torch.Tensor:
    """Make a deterministic 1-d CPU tensor of about ``nbytes`` bytes.

    Kinds: ``random_float32`` (dense noise, hardly compressible), ``sparse_float32``
    (90% zeros), ``bf16_weights`` (small normal weights in bfloat16), ``int64_token_ids``
    (vocabulary ids below 50257), ``bool_mask`` (padding masks with long runs) and
    ``repeated`` (runs of a few repeated float32 values).

    Args:
        kind: one of :data:`SYNTHETIC_KINDS`.
        nbytes: target size; rounded down to whole elements.
        seed: random seed.

    Returns:
        The tensor.

    Raises:
        ValueError: unknown ``kind`` or negative ``nbytes``.

    Example:
        >>> t = make_synthetic_tensor("int64_token_ids", 1 << 16)
        >>> t.dtype, t.numel()
        (torch.int64, 8192)
    """
    maker = _MAKERS.get(kind)
    if maker is None:
        raise ValueError(f"kind must be one of {', '.join(SYNTHETIC_KINDS)}; got {kind!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be an integer >= 0, got {nbytes!r}")
    return maker(nbytes, torch.Generator().manual_seed(seed))
