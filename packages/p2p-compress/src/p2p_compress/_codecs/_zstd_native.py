"""libzstd through ctypes: one-shot compression and decompression on tensor addresses.

python-zstandard ships its own libzstd; its CFFI extension module exports the C API,
so ``ZSTD_compressCCtx`` and ``ZSTD_decompressDCtx`` are called on the tensors' memory
(ctypes releases the GIL during the call). A context with parameters beyond the level
compresses with ``ZSTD_compress2``. A system ``libzstd`` is the fallback.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import weakref
from typing import Any, Final

from p2p_compress._errors import CompressionError

_CONTENTSIZE_ERROR: Final = (1 << 64) - 2
_CONTENTSIZE_UNKNOWN: Final = (1 << 64) - 1
_MIN_VERSION: Final = 10400  # ZSTD_findFrameCompressedSize, ZSTD_getFrameContentSize
# ZSTD_cParameter values (zstd.h, stable since 1.4.0).
C_LEVEL: Final = 100
C_HASH_LOG: Final = 102
C_SEARCH_LOG: Final = 104
C_MIN_MATCH: Final = 105

_lock = threading.Lock()
_loaded = False
_lib: Any = None
_load_errors: list[str] = []


def _bind(cdll: ctypes.CDLL) -> ctypes.CDLL:
    vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    table: dict[str, tuple[tuple[Any, ...], Any]] = {
        "ZSTD_versionNumber": ((), ctypes.c_uint),
        "ZSTD_createCCtx": ((), vp),
        "ZSTD_freeCCtx": ((vp,), sz),
        "ZSTD_createDCtx": ((), vp),
        "ZSTD_freeDCtx": ((vp,), sz),
        "ZSTD_compressCCtx": ((vp, vp, sz, vp, sz, i), sz),
        "ZSTD_compress2": ((vp, vp, sz, vp, sz), sz),
        "ZSTD_CCtx_setParameter": ((vp, i, i), sz),
        "ZSTD_decompressDCtx": ((vp, vp, sz, vp, sz), sz),
        "ZSTD_getFrameContentSize": ((vp, sz), ctypes.c_ulonglong),
        "ZSTD_findFrameCompressedSize": ((vp, sz), sz),
        "ZSTD_isError": ((sz,), ctypes.c_uint),
        "ZSTD_getErrorName": ((sz,), ctypes.c_char_p),
    }
    for name, (args, res) in table.items():
        func = getattr(cdll, name)
        func.argtypes = args
        func.restype = res
    version = int(cdll.ZSTD_versionNumber())
    if version < _MIN_VERSION:
        raise OSError(f"libzstd {version} is older than 1.4.0")
    return cdll


def load_libzstd() -> Any:
    """Return libzstd bound through ctypes, or None when no usable one is found."""
    global _loaded, _lib
    with _lock:
        if _loaded:
            return _lib
        _loaded = True
        candidates: list[str] = []
        try:
            import zstandard._cffi as ext  # the bundled libzstd, C API exported

            candidates.append(str(ext.__file__))
        except ImportError as exc:
            _load_errors.append(f"zstandard._cffi: {exc}")
        system = ctypes.util.find_library("zstd")
        if system is not None:
            candidates.append(system)
        for path in candidates:
            try:
                _lib = _bind(ctypes.CDLL(path))
                return _lib
            except (OSError, AttributeError) as exc:
                _load_errors.append(f"{path}: {exc}")
        return None


class NativeZstd:
    """One libzstd compression context and one decompression context.

    ``params``: ``ZSTD_cParameter`` -> value, set on the compression context on top of
    the level (empty: the level's parameters, one-shot ``ZSTD_compressCCtx``).
    """

    def __init__(self, lib: Any, level: int, params: dict[int, int] | None = None) -> None:
        self._lib = lib
        cctx = lib.ZSTD_createCCtx()
        dctx = lib.ZSTD_createDCtx()
        if not cctx or not dctx:
            lib.ZSTD_freeCCtx(cctx)
            lib.ZSTD_freeDCtx(dctx)
            raise CompressionError("libzstd could not allocate a context")
        self._cctx, self._dctx = cctx, dctx
        self._level = level
        weakref.finalize(self, _free, lib, cctx, dctx)
        self._tuned = bool(params)
        if params:  # the level first: it sets every parameter, the others refine it
            for param, value in {C_LEVEL: level, **params}.items():
                code = lib.ZSTD_CCtx_setParameter(cctx, param, value)
                self._check(code, "ZSTD_CCtx_setParameter")

    def _check(self, code: int, what: str) -> int:
        if self._lib.ZSTD_isError(code):
            name = self._lib.ZSTD_getErrorName(code).decode(errors="replace")
            raise CompressionError(f"{what} failed: {name}")
        return code

    def compress(self, src: int, nbytes: int, dst: int, capacity: int) -> int:
        if self._tuned:  # the context's parameters; the frame defaults as below
            code = self._lib.ZSTD_compress2(self._cctx, dst, capacity, src, nbytes)
            return self._check(code, "ZSTD_compress2")
        # The classic one-shot call: the level's parameters with the frame defaults
        # (content size written, no checksum), a little faster than ZSTD_compress2.
        code = self._lib.ZSTD_compressCCtx(self._cctx, dst, capacity, src, nbytes, self._level)
        return self._check(code, "ZSTD_compressCCtx")

    def decompress(self, src: int, wire: int, dst: int, nbytes: int) -> None:
        lib = self._lib
        declared = int(lib.ZSTD_getFrameContentSize(src, wire))
        if declared in (_CONTENTSIZE_ERROR, _CONTENTSIZE_UNKNOWN) or declared != nbytes:
            what = "no valid zstd frame header" if declared >= _CONTENTSIZE_ERROR else declared
            raise CompressionError(
                f"corrupt zstd payload: frame declares {what} content bytes, the target "
                f"holds {nbytes}"
            )
        end = int(lib.ZSTD_findFrameCompressedSize(src, wire))
        if lib.ZSTD_isError(end):
            name = lib.ZSTD_getErrorName(end).decode(errors="replace")
            raise CompressionError(f"corrupt or truncated zstd payload ({wire} bytes): {name}")
        if end != wire:
            raise CompressionError(
                f"zstd payload has {wire - end} trailing bytes after its {end}-byte frame"
            )
        got = int(lib.ZSTD_decompressDCtx(self._dctx, dst, nbytes, src, wire))
        if lib.ZSTD_isError(got):
            name = lib.ZSTD_getErrorName(got).decode(errors="replace")
            raise CompressionError(
                f"corrupt zstd payload ({wire} bytes, target {nbytes} bytes): {name}"
            )
        if got != nbytes:
            raise CompressionError(
                f"zstd payload decoded to {got} bytes, the target holds {nbytes}"
            )


def _free(lib: Any, cctx: int, dctx: int) -> None:
    lib.ZSTD_freeCCtx(cctx)
    lib.ZSTD_freeDCtx(dctx)


def load_errors() -> list[str]:
    """Why each candidate libzstd failed to load (for messages)."""
    with _lock:
        return list(_load_errors)
