"""probe_codec_library and the messages when a codec library is missing."""

from __future__ import annotations

import ctypes.util
import sys

import pytest

import p2p_compress._codecs._lz4 as lz4_mod
import p2p_compress._codecs._zstd_native as native_mod
from p2p_compress import CompressionError, Lz4Codec, ZstdCodec, probe_codec_library


def test_probe_installed_libraries() -> None:
    probe_codec_library("lz4")
    probe_codec_library("zstd")


def test_probe_rejects_unknown_name() -> None:
    with pytest.raises(ValueError, match="'lz4', 'zstd' or 'sparse', got 'gzip'"):
        probe_codec_library("gzip")


def test_missing_lz4_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    # Hide python-lz4's extension and any system liblz4 from the loader.
    monkeypatch.setattr(lz4_mod, "_lib", None)
    monkeypatch.setitem(sys.modules, "lz4.block._block", None)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    with pytest.raises(
        CompressionError, match=r"lz4 codec library is unavailable.*pip install 'lz4>=4.3'"
    ) as info:
        probe_codec_library("lz4")
    assert isinstance(info.value.__cause__, ImportError)
    with pytest.raises(CompressionError, match="pip install"):
        Lz4Codec()


def test_missing_libzstd_falls_back_to_python_zstandard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_mod, "_loaded", True)
    monkeypatch.setattr(native_mod, "_lib", None)
    assert ZstdCodec().backend == "python-zstandard"
    probe_codec_library("zstd")
    with pytest.raises(CompressionError, match="no usable libzstd"):
        ZstdCodec(backend="libzstd")


def test_missing_zstandard_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_mod, "_loaded", True)
    monkeypatch.setattr(native_mod, "_lib", None)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(
        CompressionError, match=r"zstd codec library is unavailable.*pip install 'zstandard>=0.22'"
    ):
        probe_codec_library("zstd")


def test_system_liblz4_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    if ctypes.util.find_library("lz4") is None:
        pytest.skip("no system liblz4 on this machine")
    monkeypatch.setattr(lz4_mod, "_lib", None)
    monkeypatch.setitem(sys.modules, "lz4.block._block", None)
    probe_codec_library("lz4")
