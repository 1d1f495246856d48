"""tensor_checksum: a fast 64-bit content checksum of a CPU tensor's raw bytes.

The bytes are read as little-endian 64-bit words ``w`` in chunks of 32768 words (256
KiB). Each chunk ``j`` gives ``s_j = sum(w_i * k_i) mod 2**64``, a dot product with fixed
odd keys ``k_i`` (splitmix64 of the word's place in the chunk, lowest bit set), which
numpy computes in one pass at memory speed with unsigned wrap-around arithmetic, so
the value does not depend on the order of the additions, the CPU or the library build.
The chunk sums are then folded in order through the murmur3 64-bit finalizer, with the
chunk number, the bytes after the last whole word and the total length.

What it catches: any change of a single word (the keys are odd, so ``d * k_i`` is never
0 mod ``2**64`` for ``d != 0``); changes of several words unless ``sum(d_i * k_i)``
happens to vanish mod ``2**64``, which random changes (a stale or wrong buffer, a torn
copy, a patch applied to the wrong base) do with probability about ``2**-64``; moved
chunks and a change of length. What it does not promise: it is no CRC and no
cryptographic hash. An even number of flips confined to bit 63 of words of one chunk
cancels (``2**63 * (k_a + k_b)`` is 0 mod ``2**64``), and flips confined to the top few
bits of the words are caught with less than full probability.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import torch

from p2p_compress._codecs._memory import tensor_bytes

CHUNK_WORDS: Final = 1 << 15
_MASK: Final = (1 << 64) - 1
_GOLDEN: Final = 0x9E3779B97F4A7C15


def _splitmix64(x: np.ndarray) -> np.ndarray:
    z = x + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


_KEYS: Final = _splitmix64(np.arange(1, CHUNK_WORDS + 1, dtype=np.uint64)) | np.uint64(1)
_WORD: Final = np.dtype("<u8")


def _fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _MASK
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _MASK
    return h ^ (h >> 33)


def tensor_checksum(t: object) -> int:
    """A 64-bit checksum of a contiguous CPU tensor's raw bytes.

    Equal bytes give the equal value on every machine, whatever the dtype or shape that
    holds them (the value depends on the bytes only). Meant to catch accidental
    corruption, not tampering: see the module notes for what it detects. Reads at
    roughly memory speed (several GB/s per core; ``benchmarks/bench_delta.py``
    compares it with ``zlib.crc32``).

    Args:
        t: a contiguous dense CPU tensor of any dtype and shape.

    Returns:
        An integer in ``[0, 2**64)``.

    Raises:
        TypeError: ``t`` is not a tensor.
        ValueError: ``t`` is not a contiguous dense CPU tensor.

    Example:
        >>> a = torch.arange(1000, dtype=torch.float32)
        >>> tensor_checksum(a) == tensor_checksum(a.clone().view(torch.int32))
        True
        >>> b = a.clone()
        >>> b[500] = -b[500]
        >>> tensor_checksum(a) == tensor_checksum(b)
        False
    """
    nbytes = tensor_bytes(t, "t")
    h = 0x243F6A8885A308D3
    if nbytes:
        assert isinstance(t, torch.Tensor)
        data = t.reshape(-1).view(torch.uint8).numpy()
        words = nbytes // 8
        w = data[: words * 8].view(_WORD)
        for j, start in enumerate(range(0, words, CHUNK_WORDS)):
            part = w[start : start + CHUNK_WORDS]
            s = int(np.dot(part, _KEYS[: part.size]))
            h = _fmix64(h ^ _fmix64((s + (j + 1) * _GOLDEN) & _MASK))
        tail = bytes(data[words * 8 :])
        if tail:
            h = _fmix64(h ^ int.from_bytes(tail, "little") ^ (len(tail) << 56))
    return _fmix64(h ^ nbytes)
