"""Per-bucket checksums and bit-level deltas, both from p2p-compress.

The checksum is ``p2p_compress.tensor_checksum`` (64 bits over the bucket's raw bytes,
whatever its dtype); the delta is ``p2p_compress.encode_delta`` / ``apply_delta`` (a
sparse, XOR or full patch of the bits, whichever is smallest, then zstd or lz4).
"""

from __future__ import annotations

import torch

import p2p_compress


def checksum(buf: torch.Tensor | list[torch.Tensor]) -> int:
    """Checksum of a contiguous CPU tensor's bytes, or of a list of them end to end."""
    return int(p2p_compress.tensor_checksum(buf))


def encode_delta(
    new: torch.Tensor, base: torch.Tensor, codec: str, level: int
) -> tuple[dict[str, int | str], torch.Tensor, int]:
    """The patch that turns ``base`` into ``new``: ``(meta, payload, wire_nbytes)``."""
    patch = p2p_compress.encode_delta(new, base, codec=codec, level=level)
    return dict(patch.meta()), patch.payload, int(patch.wire_nbytes)


def apply_delta(
    meta: dict[str, int | str], payload: torch.Tensor, target: torch.Tensor | list[torch.Tensor]
) -> None:
    """Apply a patch in place: ``target`` holds the base on entry, the new bits on exit.

    ``target`` is one tensor or the bucket's pieces in the own tensors, end to end.

    Raises:
        ValueError: The patch's dtype or size does not fit ``target`` (untouched).
        p2p_compress.CompressionError: The payload is corrupt; a sparse or XOR patch
            leaves ``target`` untouched, a compressed full one may have written part of
            it (the bucket's checksum catches that).
    """
    patch = p2p_compress.DeltaPatch.from_meta(meta, payload)
    p2p_compress.apply_delta(patch, target)
