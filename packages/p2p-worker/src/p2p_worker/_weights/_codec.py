"""Per-bucket checksums, bit-level deltas and packing, from p2p-compress; a bucket's form.

The checksum is ``p2p_compress.tensor_checksum`` (64 bits over the bucket's raw bytes,
whatever its dtype); the delta is ``p2p_compress.encode_delta`` / ``apply_delta`` (a
sparse, XOR or full patch of the bits, whichever is smallest, then zstd or lz4); a
packed bucket is a full patch (its bits in byte planes, then the codec), which needs no
base. :func:`bucket_form` and :func:`packed_form` choose how a bucket travels.
"""

from __future__ import annotations

from typing import Final

import torch

import p2p_compress
from p2p_worker._weights import _messages as m

PACK_SAVING: Final = 8
"""A bucket travels packed only when that saves at least 1/PACK_SAVING of its bytes."""
Packed = tuple[m.Header, torch.Tensor]
"""A packed bucket: its header and payload."""


def checksum(buf: torch.Tensor | list[torch.Tensor]) -> int:
    """Checksum of a contiguous CPU tensor's bytes, or of a list of them end to end."""
    return int(p2p_compress.tensor_checksum(buf))


def encode_delta(
    new: torch.Tensor, base: torch.Tensor | None, codec: str, level: int
) -> tuple[dict[str, int | str], torch.Tensor, int]:
    """The patch that turns ``base`` into ``new``: ``(meta, payload, wire_nbytes)``.

    ``base`` None: a full patch (``new`` compressed without loss, in byte planes).
    """
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


def bucket_form(
    index: int,
    new: torch.Tensor,
    base: torch.Tensor | None,
    encode: bool,
    crc: int,
    nbytes: int,
    codec: str,
    level: int,
) -> tuple[m.Header, torch.Tensor | None]:
    """How bucket ``index`` (new bits ``new``) travels to the children that hold ``base``.

    ``base`` None: no child holds it (in full); ``encode``: some child takes deltas.
    Unchanged, as a delta, or in full.
    """
    if base is None:
        return m.Header(index, m.FULL, crc, None, nbytes), new
    if encode:  # its scan finds "nothing changed" too: no separate compare
        meta, payload, wire = encode_delta(new, base, codec, level)
        if meta["changed"] == 0:
            return m.Header(index, m.SAME, crc, None, 0), None
        if wire < nbytes:
            return m.Header(index, m.DELTA, crc, meta, payload.numel()), payload
    elif torch.equal(new.view(torch.uint8), base.view(torch.uint8)):
        return m.Header(index, m.SAME, crc, None, 0), None
    return m.Header(index, m.FULL, crc, None, nbytes), new


def packed_form(
    index: int, new: torch.Tensor, crc: int, nbytes: int, codec: str, level: int
) -> Packed | None:
    """Bucket ``index`` packed, or None when that does not save 1/PACK_SAVING of it."""
    meta, payload, wire = encode_delta(new, None, codec, level)
    if wire > nbytes - nbytes // PACK_SAVING:
        return None
    return m.Header(index, m.PACKED, crc, meta, payload.numel()), payload
