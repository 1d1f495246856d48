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

from p2p_compress._codecs._memory import tensor_pieces

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


class _Folder:
    """The running state of one checksum over pieces: chunk sums folded in order.

    A piece boundary needs no copy: a chunk's sum is the sum of partial dot products
    (each with the keys of its words' places), and only a word split between two pieces
    is put together from its bytes.
    """

    def __init__(self) -> None:
        self.h = 0x243F6A8885A308D3
        self.chunks = 0
        self.total = 0
        self.sum = 0  # of the running chunk
        self.words = 0  # words of the running chunk summed so far
        self.partial = b""  # bytes of a word split between pieces

    def _add(self, part: np.ndarray) -> None:
        """Add whole words to the running chunk (at most those it still lacks)."""
        k = _KEYS[self.words : self.words + part.size]
        self.sum = (self.sum + int(np.dot(part, k))) & _MASK
        self.words += int(part.size)
        if self.words == CHUNK_WORDS:
            self._fold()

    def _fold(self) -> None:
        self.chunks += 1
        self.h = _fmix64(self.h ^ _fmix64((self.sum + self.chunks * _GOLDEN) & _MASK))
        self.sum = 0
        self.words = 0

    def feed(self, data: np.ndarray) -> None:
        """Read the next ``data.size`` bytes of the stream."""
        size = int(data.size)
        self.total += size
        pos = 0
        if self.partial:  # finish the word an earlier piece began
            pos = min(8 - len(self.partial), size)
            self.partial += bytes(data[:pos])
            if len(self.partial) < 8:
                return
            self._add(np.frombuffer(self.partial, dtype=_WORD))
            self.partial = b""
        while size - pos >= 8:
            n = min((size - pos) // 8, CHUNK_WORDS - self.words)
            self._add(data[pos : pos + 8 * n].view(_WORD))
            pos += 8 * n
        self.partial = bytes(data[pos:])

    def value(self) -> int:
        """The checksum of everything fed: the last, partial chunk and the tail, then the length."""
        if self.words:
            self._fold()
        tail = self.partial
        if tail:
            self.h = _fmix64(self.h ^ int.from_bytes(tail, "little") ^ (len(tail) << 56))
        return _fmix64(self.h ^ self.total)


def tensor_checksum(t: object) -> int:
    """A 64-bit checksum of a contiguous CPU tensor's raw bytes, or of several end to end.

    Equal bytes give the equal value on every machine, whatever the dtype or shape that
    holds them (the value depends on the bytes only), and however they are split into
    pieces: ``tensor_checksum([a, b])`` is the checksum of ``a``'s bytes followed by
    ``b``'s, the value ``tensor_checksum(torch.cat(...))`` gives for their concatenation
    when they share a dtype, without making it. Meant to catch accidental corruption, not
    tampering: see the module notes for what it detects. Reads at roughly memory speed
    (several GB/s per core; ``benchmarks/bench_delta.py`` compares it with ``zlib.crc32``).

    Args:
        t: a contiguous dense CPU tensor of any dtype and shape, or a list or tuple of
            them (of any dtypes).

    Returns:
        An integer in ``[0, 2**64)``.

    Raises:
        TypeError: ``t`` (or a piece of it) is not a tensor.
        ValueError: ``t`` (or a piece, named by its index) is not a contiguous dense CPU
            tensor.

    Example:
        >>> a = torch.arange(1000, dtype=torch.float32)
        >>> tensor_checksum(a) == tensor_checksum(a.clone().view(torch.int32))
        True
        >>> tensor_checksum(a) == tensor_checksum([a[:333], a[333:]])
        True
        >>> b = a.clone()
        >>> b[500] = -b[500]
        >>> tensor_checksum(a) == tensor_checksum(b)
        False
    """
    folder = _Folder()
    for piece, _ in tensor_pieces(t, "t"):
        if piece.numel():
            folder.feed(piece.reshape(-1).view(torch.uint8).numpy())
    return folder.value()
