"""Configuration of tensor compression and of the buffer pool, parsed from plain dicts.

The sections follow seed 000's tables exactly: ``tensor_compression`` selects a codec
with ``codec`` and carries only that codec's own parameters next to the shared keys;
``tensor_buffer_pool`` bounds the pooled CPU buffers. Every error is a
:class:`p2p_asyncwork.ConfigError` naming the full key path, the value given and
what is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import torch

from p2p_asyncwork import ConfigError
from p2p_compress._dtypes import CANONICAL_DTYPE_NAMES, dtype_from_name, dtype_name

ZSTD_MAX_LEVEL: Final = 22
DEFAULT_MIN_BYTES: Final = 16384
DEFAULT_POOL_BYTES: Final = 2 * 1024**3
_COMMON_KEYS: Final = ("enabled", "codec", "min_bytes", "excluded_dtypes")


_KEY_ALIASES: Final = {
    "algorithm": "codec",
    "algo": "codec",
    "compressor": "codec",
    "compression": "codec",
    "method": "codec",
    "type": "codec",
    "enable": "enabled",
    "threshold": "min_bytes",
    "min_size": "min_bytes",
    "exclude_dtypes": "excluded_dtypes",
    "compression_level": "level",
    "accel": "acceleration",
}
"""Words people use for a key of ``tensor_compression``: hinted as 'did you mean'."""


def _fail(
    path: str, value: object, allowed: str, what: str = "", choices: tuple[str, ...] = ()
) -> ConfigError:
    return ConfigError.invalid(path, value, allowed, what=what, choices=choices)


def _check_int(value: object, path: str, minimum: int, maximum: int | None = None) -> int:
    if maximum is None:
        allowed = f"an integer >= {minimum}"
    else:
        allowed = f"an integer from {minimum} to {maximum}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(path, value, allowed)
    if value < minimum or (maximum is not None and value > maximum):
        raise _fail(path, value, allowed)
    return int(value)


@dataclass(frozen=True)
class Lz4CodecConfig:
    """Parameters of the lz4 codec (``codec: lz4``).

    Attributes:
        acceleration: LZ4 fast-mode acceleration, >= 1. Higher trades ratio for speed
            (LZ4 itself caps the effect at 65537).
    """

    acceleration: int = 1
    name: ClassVar[str] = "lz4"
    codec_id: ClassVar[int] = 1
    param_names: ClassVar[tuple[str, ...]] = ("acceleration",)

    def __post_init__(self) -> None:
        _check_int(self.acceleration, "acceleration", 1)

    def to_dict(self) -> dict[str, Any]:
        """Return the codec's own keys as written in ``tensor_compression``."""
        return {"acceleration": self.acceleration}


@dataclass(frozen=True)
class ZstdCodecConfig:
    """Parameters of the zstd codec (``codec: zstd``).

    Attributes:
        level: compression level, 1 to 22; higher spends more CPU for a better ratio.
        max_inflight: how many zstd contexts one process may hold at once, shared by
            compression and decompression, >= 1.
    """

    level: int = 1
    max_inflight: int = 4
    name: ClassVar[str] = "zstd"
    codec_id: ClassVar[int] = 2
    param_names: ClassVar[tuple[str, ...]] = ("level", "max_inflight")

    def __post_init__(self) -> None:
        _check_int(self.level, "level", 1, ZSTD_MAX_LEVEL)
        _check_int(self.max_inflight, "max_inflight", 1)

    def to_dict(self) -> dict[str, Any]:
        """Return the codec's own keys as written in ``tensor_compression``."""
        return {"level": self.level, "max_inflight": self.max_inflight}


@dataclass(frozen=True)
class SparseCodecConfig:
    """The ``sparse`` codec (zero-word elision, :class:`~p2p_compress.SparseCodec`).

    It has no parameters. Seed 000's ``tensor_compression.codec`` stays ``lz4`` or
    ``zstd``; ``sparse`` is chosen per link by ``compression_pipeline.adaptive`` (where
    it is one of the ``codecs``), or given programmatically to
    :class:`TensorCompressionConfig` and :func:`~p2p_compress.compress_tensors`.

    Example:
        >>> SparseCodecConfig().codec_id, SparseCodecConfig().to_dict()
        (3, {})
    """

    name: ClassVar[str] = "sparse"
    codec_id: ClassVar[int] = 3
    param_names: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """Return the codec's own keys (none)."""
        return {}


CodecConfig = Lz4CodecConfig | ZstdCodecConfig | SparseCodecConfig
_CODECS: Final[dict[str, type[Lz4CodecConfig] | type[ZstdCodecConfig]]] = {
    "lz4": Lz4CodecConfig,
    "zstd": ZstdCodecConfig,
}


@dataclass(frozen=True)
class TensorCompressionConfig:
    """The parsed ``tensor_compression`` section.

    Attributes:
        codec: the chosen codec and its parameters.
        enabled: False keeps every tensor raw.
        min_bytes: tensors with fewer raw bytes stay raw.
        excluded_dtypes: dtypes that are never tried.

    Example:
        >>> cfg = TensorCompressionConfig(Lz4CodecConfig(), min_bytes=0, excluded_dtypes=())
        >>> cfg.codec_name, cfg.to_dict()["min_bytes"]
        ('lz4', 0)
    """

    codec: CodecConfig
    enabled: bool = True
    min_bytes: int = DEFAULT_MIN_BYTES
    excluded_dtypes: tuple[torch.dtype, ...] = field(default=(torch.float32,))

    def __post_init__(self) -> None:
        if not isinstance(self.codec, (Lz4CodecConfig, ZstdCodecConfig, SparseCodecConfig)):
            raise _fail(
                "codec", self.codec, "an Lz4CodecConfig, a ZstdCodecConfig or a SparseCodecConfig"
            )
        if not isinstance(self.enabled, bool):
            raise _fail("enabled", self.enabled, "true or false")
        _check_int(self.min_bytes, "min_bytes", 0)
        dtypes = _parse_dtypes(self.excluded_dtypes, "excluded_dtypes")
        object.__setattr__(self, "excluded_dtypes", dtypes)

    @property
    def codec_name(self) -> str:
        """``"lz4"``, ``"zstd"`` or ``"sparse"``."""
        return self.codec.name

    @property
    def codec_id(self) -> int:
        """The codec's wire id: 1 for lz4, 2 for zstd, 3 for sparse."""
        return self.codec.codec_id

    def to_dict(self) -> dict[str, Any]:
        """Return the section as a plain dict that :func:`parse_tensor_compression` accepts."""
        out: dict[str, Any] = {
            "enabled": self.enabled,
            "codec": self.codec.name,
            "min_bytes": self.min_bytes,
            "excluded_dtypes": [dtype_name(d) for d in self.excluded_dtypes],
        }
        out.update(self.codec.to_dict())
        return out


@dataclass(frozen=True)
class TensorBufferPoolConfig:
    """The parsed ``tensor_buffer_pool`` section.

    Attributes:
        max_bytes: bound on active plus cached pooled buffer bytes in one process, >= 1.
    """

    max_bytes: int = DEFAULT_POOL_BYTES

    def __post_init__(self) -> None:
        _check_int(self.max_bytes, "max_bytes", 1)

    def to_dict(self) -> dict[str, Any]:
        """Return the section as a plain dict that :func:`parse_tensor_buffer_pool` accepts."""
        return {"max_bytes": self.max_bytes}


def _parse_dtypes(value: object, path: str) -> tuple[torch.dtype, ...]:
    allowed = "a list of dtype names such as [float32, bfloat16]; names: " + ", ".join(
        CANONICAL_DTYPE_NAMES
    )
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _fail(path, value, allowed)
    out: list[torch.dtype] = []
    for i, item in enumerate(value):
        dtype = dtype_from_name(item)
        if dtype is None:
            names = tuple(CANONICAL_DTYPE_NAMES)
            raise _fail(f"{path}[{i}]", item, "a dtype name: " + ", ".join(names), choices=names)
        if dtype not in out:
            out.append(dtype)
    return tuple(out)


def _as_mapping(section: object, path: str) -> Mapping[str, Any]:
    if not isinstance(section, Mapping):
        raise _fail(path, section, "a mapping of keys to values (or omit the section)")
    for key in section:
        if not isinstance(key, str):
            raise _fail(f"{path}.{key!r}", key, "string keys")
    return section


def parse_tensor_compression(
    section: Mapping[str, Any] | None, path: str = "tensor_compression"
) -> TensorCompressionConfig | None:
    """Parse a ``tensor_compression`` section into a frozen config.

    Args:
        section: the section as YAML gives it (a plain dict), or None when omitted.
        path: the section's key path, used in error messages
            (``"cluster.collective.tensor_compression"``).

    Returns:
        The config, or None when the section is omitted or ``enabled`` is false (the raw
        path). A disabled section is still checked, so a typo never hides; ``codec`` is
        required only when enabled.

    Raises:
        ConfigError: a key is unknown or belongs to the other codec, ``codec`` is missing
            or unknown, or a value has the wrong type or range. The message names the
            key path, the value and what is allowed.

    Example:
        >>> cfg = parse_tensor_compression({"codec": "zstd", "level": 3})
        >>> cfg.codec, cfg.min_bytes
        (ZstdCodecConfig(level=3, max_inflight=4), 16384)
        >>> parse_tensor_compression({"codec": "lz4", "enabled": False}) is None
        True
    """
    if section is None:
        return None
    sec = _as_mapping(section, path)
    enabled = sec.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _fail(f"{path}.enabled", enabled, "true or false")
    codec_cls: type[Lz4CodecConfig] | type[ZstdCodecConfig] | None = None
    if "codec" in sec:
        codec_cls = _CODECS.get(sec["codec"]) if isinstance(sec["codec"], str) else None
        if codec_cls is None:
            raise _fail(f"{path}.codec", sec["codec"], "lz4 or zstd", choices=tuple(_CODECS))
    own = codec_cls.param_names if codec_cls is not None else ()
    # Unknown keys first: {"algorithm": "lz5"} is a misspelled key, not a missing codec.
    for key, value in sec.items():
        if key in _COMMON_KEYS or key in own:
            continue
        owner = next((c.name for c in _CODECS.values() if key in c.param_names), None)
        if owner is None:
            keys = (*_COMMON_KEYS, *own)
            raise ConfigError.unknown_key(path, key, value, keys, aliases=_KEY_ALIASES)
        allowed = "keys " + ", ".join((*_COMMON_KEYS, *own))
        if codec_cls is not None:
            what = f"{key!r} is a {owner} parameter, codec {codec_cls.name} does not accept it"
        else:
            what = f"{key!r} is a {owner} parameter and needs codec: {owner}"
        raise _fail(f"{path}.{key}", value, allowed, what)
    if codec_cls is None and enabled:
        raise ConfigError(
            f"{path}.codec: got no value (the key is missing); allowed: lz4 or zstd, "
            "required when compression is enabled",
            path=f"{path}.codec",
        )
    min_bytes = _check_int(sec.get("min_bytes", DEFAULT_MIN_BYTES), f"{path}.min_bytes", 0)
    dtypes = _parse_dtypes(sec.get("excluded_dtypes", ["float32"]), f"{path}.excluded_dtypes")
    codec: CodecConfig
    if codec_cls is ZstdCodecConfig:
        level = _check_int(sec.get("level", 1), f"{path}.level", 1, ZSTD_MAX_LEVEL)
        inflight = _check_int(sec.get("max_inflight", 4), f"{path}.max_inflight", 1)
        codec = ZstdCodecConfig(level=level, max_inflight=inflight)
    else:
        codec = Lz4CodecConfig(_check_int(sec.get("acceleration", 1), f"{path}.acceleration", 1))
    if not enabled:
        return None
    return TensorCompressionConfig(
        codec=codec, enabled=True, min_bytes=min_bytes, excluded_dtypes=dtypes
    )


def parse_tensor_buffer_pool(
    section: Mapping[str, Any] | None, path: str = "tensor_buffer_pool"
) -> TensorBufferPoolConfig:
    """Parse a ``tensor_buffer_pool`` section.

    Args:
        section: the section as a plain dict, or None when omitted (the default pool).
        path: the section's key path, used in error messages.

    Returns:
        The config; ``max_bytes`` defaults to 2 GiB.

    Raises:
        ConfigError: an unknown key, or ``max_bytes`` not an integer >= 1.

    Example:
        >>> parse_tensor_buffer_pool({"max_bytes": 1 << 20})
        TensorBufferPoolConfig(max_bytes=1048576)
        >>> parse_tensor_buffer_pool(None).max_bytes == 2 * 1024**3
        True
    """
    if section is None:
        return TensorBufferPoolConfig()
    sec = _as_mapping(section, path)
    for key, value in sec.items():
        if key != "max_bytes":
            raise ConfigError.unknown_key(path, key, value, ("max_bytes",))
    max_bytes = _check_int(sec.get("max_bytes", DEFAULT_POOL_BYTES), f"{path}.max_bytes", 1)
    return TensorBufferPoolConfig(max_bytes=max_bytes)
