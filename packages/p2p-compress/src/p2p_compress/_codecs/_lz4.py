"""The lz4 block codec, calling liblz4 through ctypes on tensor memory.

python-lz4's ``lz4.block`` always returns new ``bytes``; its extension module also
exports the liblz4 C functions, so the codec calls them on the tensors' addresses
(ctypes releases the GIL during the call). A system ``liblz4`` is the fallback.

Compression runs ``LZ4_initStream`` + ``LZ4_compress_fast_continue`` on a per-thread
state, the same path ``lz4.block.compress`` takes (byte-identical output, and up to
20% faster than ``LZ4_compress_fast`` on highly repetitive data); decompression is
``LZ4_decompress_safe`` with the exact target size.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from typing import Any, ClassVar, Final

import torch

from p2p_compress._codecs._codec import CODEC_LZ4, TensorCodec
from p2p_compress._codecs._memory import address
from p2p_compress._errors import CompressionError

LZ4_MAX_INPUT_SIZE: Final = 0x7E000000
LZ4_ACCELERATION_MAX: Final = 65537
_INT_MAX: Final = 0x7FFFFFFF
_INSTALL_HINT: Final = "install python-lz4: pip install 'lz4>=4.3'"

_lib: Any = None
_lib_lock = threading.Lock()


def _bind(cdll: ctypes.CDLL) -> ctypes.CDLL:
    vp, i = ctypes.c_void_p, ctypes.c_int
    cdll.LZ4_compress_fast.argtypes = (vp, vp, i, i, i)
    cdll.LZ4_compress_fast.restype = i
    cdll.LZ4_decompress_safe.argtypes = (vp, vp, i, i)
    cdll.LZ4_decompress_safe.restype = i
    cdll.LZ4_compressBound.argtypes = (i,)
    cdll.LZ4_compressBound.restype = i
    cdll.LZ4_versionNumber.argtypes = ()
    cdll.LZ4_versionNumber.restype = i
    cdll.LZ4_sizeofState.argtypes = ()
    cdll.LZ4_sizeofState.restype = i
    cdll.LZ4_initStream.argtypes = (vp, ctypes.c_size_t)
    cdll.LZ4_initStream.restype = vp
    cdll.LZ4_compress_fast_continue.argtypes = (vp, vp, vp, i, i, i)
    cdll.LZ4_compress_fast_continue.restype = i
    return cdll


def load_lz4_library() -> Any:
    """Return liblz4 bound through ctypes, loading it once.

    Raises:
        CompressionError: neither python-lz4's extension nor a system liblz4 exports the
            functions; the message says what to install.
    """
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        errors: list[str] = []
        try:
            import lz4.block._block as ext

            _lib = _bind(ctypes.CDLL(ext.__file__))
            return _lib
        except (ImportError, OSError, AttributeError) as exc:
            errors.append(f"python-lz4 extension: {exc}")
            cause: BaseException = exc
        path = ctypes.util.find_library("lz4")
        if path is not None:
            try:
                _lib = _bind(ctypes.CDLL(path))
                return _lib
            except (OSError, AttributeError) as exc:
                errors.append(f"system {path}: {exc}")
                cause = exc
        raise CompressionError(
            "the lz4 codec library is unavailable (" + "; ".join(errors) + f"); {_INSTALL_HINT}"
        ) from cause


class Lz4Codec(TensorCodec):
    """Stateless lz4 block codec; one instance is safely shared by every thread.

    Args:
        acceleration: LZ4 fast-mode acceleration, >= 1 (values above 65537 act as 65537).

    Raises:
        ValueError: ``acceleration`` is not an integer >= 1.
        CompressionError: liblz4 cannot be loaded.

    Example:
        >>> Lz4Codec().max_compressed_size(1000)
        1019
    """

    name: ClassVar[str] = "lz4"
    codec_id: ClassVar[int] = CODEC_LZ4

    def __init__(self, acceleration: int = 1) -> None:
        if isinstance(acceleration, bool) or not isinstance(acceleration, int) or acceleration < 1:
            raise ValueError(f"acceleration must be an integer >= 1, got {acceleration!r}")
        self.acceleration = acceleration
        self._accel = min(acceleration, LZ4_ACCELERATION_MAX)
        lib = load_lz4_library()
        self._init_stream = lib.LZ4_initStream
        self._compress_continue = lib.LZ4_compress_fast_continue
        self._decompress_safe = lib.LZ4_decompress_safe
        self._state_size = int(lib.LZ4_sizeofState())
        self._local = threading.local()  # one LZ4_stream_t per thread

    def _state(self) -> int:
        address: int | None = getattr(self._local, "address", None)
        if address is None:
            buffer = ctypes.create_string_buffer(self._state_size + 64)
            self._local.buffer = buffer  # keeps the memory alive with the thread
            address = self._local.address = (ctypes.addressof(buffer) + 63) & ~63
        return address

    def max_compressed_size(self, nbytes: int) -> int | None:
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        if nbytes > LZ4_MAX_INPUT_SIZE:
            return None
        return nbytes + nbytes // 255 + 16

    def _compress(self, src: torch.Tensor, nbytes: int, dst: torch.Tensor, capacity: int) -> int:
        state = self._state()
        if not self._init_stream(state, self._state_size):
            raise CompressionError("LZ4_initStream rejected its state buffer")
        written = int(
            self._compress_continue(
                state,
                address(src, nbytes),
                address(dst, capacity),
                nbytes,
                min(capacity, _INT_MAX),
                self._accel,
            )
        )
        if written <= 0:
            raise CompressionError(
                f"LZ4_compress_fast_continue failed on {nbytes} bytes into {capacity} "
                f"(returned {written})"
            )
        return written

    def _decompress(self, src: torch.Tensor, wire: int, dst: torch.Tensor, nbytes: int) -> None:
        if wire == 0:
            raise CompressionError("lz4 payload is empty; a valid block holds at least 1 byte")
        if wire > _INT_MAX or nbytes > LZ4_MAX_INPUT_SIZE:
            raise CompressionError(
                f"lz4 payload of {wire} bytes into {nbytes} bytes exceeds lz4's size limits"
            )
        got = int(self._decompress_safe(address(src, wire), address(dst, nbytes), wire, nbytes))
        if got < 0:
            raise CompressionError(
                f"corrupt or truncated lz4 payload ({wire} bytes, target {nbytes} bytes): "
                f"LZ4_decompress_safe returned {got}"
            )
        if got != nbytes:
            raise CompressionError(
                f"lz4 payload decoded to {got} bytes but the target holds {nbytes}"
            )
