"""Scratch buffers and the codec that compresses a patch's body.

Temporaries come from a :class:`TensorBufferPool` when one is given (and has room),
else from plain allocations; the final payload is always a fresh tensor of its exact
size, so a patch never holds pooled memory. zstd contexts are kept per thread and level
(a :class:`ZstdCodec` is used by one thread at a time); the lz4 codec is shared.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from p2p_compress._codecs._codec import TensorCodec
from p2p_compress._codecs._lz4 import Lz4Codec
from p2p_compress._codecs._zstd import ZstdCodec
from p2p_compress._delta._patch import FLAG_PLANES, HEADER_SIZE, pack_header
from p2p_compress._errors import CompressionError
from p2p_compress._pool import TensorBufferPool

_local = threading.local()
_lz4_lock = threading.Lock()
_lz4: Lz4Codec | None = None

U_TYPES: dict[int, type[np.unsignedinteger]] = {
    1: np.uint8,
    2: np.uint16,
    4: np.uint32,
    8: np.uint64,
}
I_TYPES: dict[int, type[np.signedinteger]] = {
    1: np.int8,
    2: np.int16,
    4: np.int32,
    8: np.int64,
}


def codec_for(name: str, level: int, planes: bool = False) -> TensorCodec | None:
    """The codec called ``name`` for this thread (None for ``"raw"``).

    ``planes``: a zstd codec tuned for byte planes (``ZstdCodec(planes=True)``).
    """
    global _lz4
    if name == "raw":
        return None
    if name == "lz4":
        with _lz4_lock:
            if _lz4 is None:
                _lz4 = Lz4Codec()
            return _lz4
    cache: dict[tuple[int, bool], ZstdCodec] | None = getattr(_local, "zstd", None)
    if cache is None:
        cache = _local.zstd = {}
    key = (level, planes)
    codec = cache.get(key)
    if codec is None:
        codec = cache[key] = ZstdCodec(level, planes=planes)
    return codec


@contextmanager
def scratch(pool: TensorBufferPool | None, nbytes: int) -> Iterator[torch.Tensor]:
    """A flat ``torch.uint8`` tensor of exactly ``nbytes`` elements, pooled when possible."""
    lease = pool.acquire(nbytes) if pool is not None and nbytes > 0 else None
    if lease is None:
        yield torch.empty(nbytes, dtype=torch.uint8)
        return
    try:
        yield lease.buffer[:nbytes]
    finally:
        lease.release()


def as_numpy(t: torch.Tensor, itemsize: int) -> np.ndarray:
    """A flat numpy view of a contiguous CPU tensor's bits as unsigned integers."""
    flat = t.reshape(-1)
    if flat.numel() == 0:
        return np.empty(0, dtype=U_TYPES[itemsize])
    b = flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat
    return b.numpy().view(U_TYPES[itemsize])


def seal(
    kind: str,
    codec_name: str,
    level: int,
    itemsize: int,
    flags: int,
    numel: int,
    changed: int,
    body: torch.Tensor,
    pool: TensorBufferPool | None,
) -> tuple[str, torch.Tensor]:
    """Header + compressed body as a fresh payload; raw when compression does not shrink it.

    A dense body in byte planes (``FLAG_PLANES``) at zstd level 1 is compressed with
    the codec tuned for planes (2.3x faster on bf16 weights, and smaller); sparse bodies
    keep the level's own parameters (at 1-2% changed those were 2.5% smaller and
    faster there).

    Returns:
        The codec that was used (``"raw"`` when compressing did not pay) and the payload.
    """
    size = int(body.numel())
    codec = codec_for(codec_name, level, bool(flags & FLAG_PLANES) and level == 1) if size else None
    bound = codec.max_compressed_size(size) if codec is not None else None
    if codec is not None and bound is not None:
        with scratch(pool, bound) as out:
            wrote = codec.compress_into(body, out)
            if wrote < size:
                payload = torch.empty(HEADER_SIZE + wrote, dtype=torch.uint8)
                head = pack_header(kind, codec_name, itemsize, flags, numel, changed, size)
                payload.numpy()[:HEADER_SIZE] = np.frombuffer(head, dtype=np.uint8)
                payload[HEADER_SIZE:].copy_(out[:wrote])
                return codec_name, payload
    payload = torch.empty(HEADER_SIZE + size, dtype=torch.uint8)
    head = pack_header(kind, "raw", itemsize, flags, numel, changed, size)
    payload.numpy()[:HEADER_SIZE] = np.frombuffer(head, dtype=np.uint8)
    payload[HEADER_SIZE:].copy_(body)
    return "raw", payload


def open_body(payload: torch.Tensor, codec_name: str, body: int, out: torch.Tensor) -> None:
    """Decompress (or copy) the payload's body into ``out`` (exactly ``body`` bytes).

    Raises:
        CompressionError: the body is corrupt, truncated or of another length.
    """
    wire = payload[HEADER_SIZE:]
    codec = codec_for(codec_name, 1)
    if codec is None:
        if wire.numel() != body:
            raise CompressionError(
                f"corrupt delta payload: its raw body holds {wire.numel()} bytes, the header "
                f"says {body}"
            )
        out.copy_(wire)
        return
    if body == 0:
        raise CompressionError(f"corrupt delta payload: an empty body marked {codec_name}")
    codec.decompress_into(wire, out)
