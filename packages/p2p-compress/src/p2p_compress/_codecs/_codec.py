"""The codec interface shared by lz4 and zstd, and the wire ids of codecs."""

from __future__ import annotations

import abc
from typing import ClassVar, Final

import torch

from p2p_compress._codecs._memory import tensor_bytes, uint8_buffer_bytes

CODEC_RAW: Final = 0
"""Wire id of an uncompressed payload."""
CODEC_LZ4: Final = 1
"""Wire id of an lz4 block payload."""
CODEC_ZSTD: Final = 2
"""Wire id of a zstd frame payload."""
CODEC_SPARSE: Final = 3
"""Wire id of a zero-word-elision payload (:class:`~p2p_compress.SparseCodec`)."""
CODEC_NAMES: Final[dict[int, str]] = {
    CODEC_RAW: "raw",
    CODEC_LZ4: "lz4",
    CODEC_ZSTD: "zstd",
    CODEC_SPARSE: "sparse",
}


class TensorCodec(abc.ABC):
    """Lossless compression of a CPU tensor's raw bytes into a preallocated buffer.

    Both directions work on memory the caller owns: ``compress_into`` reads the tensor's
    storage and writes into a ``torch.uint8`` buffer, ``decompress_into`` writes straight
    into the target tensor. No intermediate Python ``bytes`` object is made. dtype and
    shape are the caller's to carry; the codec restores the bytes exactly.

    Instances of :class:`Lz4Codec` are stateless and thread-safe; a :class:`ZstdCodec`
    holds native contexts and must be used by one thread at a time (the
    :class:`TensorCodecProvider` hands each one out exclusively).
    """

    name: ClassVar[str]
    codec_id: ClassVar[int]

    @abc.abstractmethod
    def max_compressed_size(self, nbytes: int) -> int | None:
        """Return the buffer size that always holds ``nbytes`` compressed.

        Args:
            nbytes: raw byte count, >= 0.

        Returns:
            The worst-case compressed size in bytes, or None when the codec cannot take
            an input this large (the caller keeps such a tensor raw).

        Raises:
            ValueError: ``nbytes`` is negative.
        """

    def compress_into(self, src: torch.Tensor, dst: torch.Tensor) -> int:
        """Compress ``src``'s bytes into the front of ``dst``.

        Args:
            src: a contiguous CPU tensor of any dtype and shape (0-d and empty work).
            dst: a contiguous CPU ``torch.uint8`` tensor with at least
                ``max_compressed_size(src.nbytes)`` elements.

        Returns:
            The number of bytes written at the start of ``dst``.

        Raises:
            TypeError: an argument is not a tensor.
            ValueError: a tensor is not a contiguous dense CPU tensor, ``dst`` is not
                uint8 or is too small, or ``src`` is larger than the codec supports.
            CompressionError: the codec library failed.

        Example:
            >>> codec = Lz4Codec()
            >>> src = torch.zeros(1000, dtype=torch.int64)
            >>> dst = torch.empty(codec.max_compressed_size(8000), dtype=torch.uint8)
            >>> n = codec.compress_into(src, dst)
            >>> out = torch.empty_like(src)
            >>> codec.decompress_into(dst[:n], out)
            >>> bool(torch.equal(out, src)), n < 8000
            (True, True)
        """
        nbytes = tensor_bytes(src, "src")
        capacity = uint8_buffer_bytes(dst, "dst")
        bound = self.max_compressed_size(nbytes)
        if bound is None:
            raise ValueError(
                f"src holds {nbytes} bytes, more than {self.name} accepts in one input; "
                "keep such a tensor raw"
            )
        if capacity < bound:
            raise ValueError(
                f"dst holds {capacity} bytes; {self.name} needs at least {bound} "
                f"(max_compressed_size({nbytes}))"
            )
        return self._compress(src, nbytes, dst, capacity)

    def decompress_into(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Decompress ``src`` straight into ``dst``'s memory.

        Args:
            src: a contiguous CPU ``torch.uint8`` tensor holding exactly one payload made
                by :meth:`compress_into` (its length is the wire size).
            dst: the contiguous CPU target; it receives exactly ``dst.nbytes`` bytes.

        Raises:
            TypeError: an argument is not a tensor.
            ValueError: a tensor is not a contiguous dense CPU tensor or ``src`` is not uint8.
            CompressionError: ``src`` is corrupt or truncated, or decodes to a size other
                than ``dst``'s. ``dst`` may then hold partial data; it is never read
                out of bounds or overrun.
        """
        wire = uint8_buffer_bytes(src, "src")
        nbytes = tensor_bytes(dst, "dst")
        self._decompress(src, wire, dst, nbytes)

    @abc.abstractmethod
    def _compress(self, src: torch.Tensor, nbytes: int, dst: torch.Tensor, capacity: int) -> int:
        """Compress checked arguments; return bytes written."""

    @abc.abstractmethod
    def _decompress(self, src: torch.Tensor, wire: int, dst: torch.Tensor, nbytes: int) -> None:
        """Decompress checked arguments."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
