"""Fuzzing the decoders (hypothesis): random, truncated and mutated compressed payloads.

Whatever the payload, decoding ends in exactly one of two ways: ``CompressionError``, or
the target filled with exactly its size (a random lz4 block can be valid: lz4 carries no
checksum). Nothing else is raised, and the memory around the target is never written.
A strict prefix of a valid payload always ends in ``CompressionError``; so do random
bytes that do not start with a zstd frame magic, for zstd.
"""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from p2p_compress import (
    CompressionError,
    Lz4Codec,
    Lz4CodecConfig,
    SparseCodec,
    SparseCodecConfig,
    TensorCodec,
    TensorCodecProvider,
    TensorCompressionConfig,
    ZstdCodec,
    ZstdCodecConfig,
    compress_tensors,
    decompress_into_tensor,
)
from p2p_compress.internal import CODEC_LZ4, CODEC_RAW, CODEC_SPARSE, CODEC_ZSTD

CODECS: dict[str, TensorCodec] = {
    "lz4": Lz4Codec(),
    "zstd": ZstdCodec(),
    "zstd-stream": ZstdCodec(level=3, backend="python-zstandard"),
    "sparse": SparseCodec(),
}
PROVIDERS = {
    CODEC_LZ4: TensorCodecProvider(
        TensorCompressionConfig(Lz4CodecConfig(), min_bytes=0, excluded_dtypes=())
    ),
    CODEC_ZSTD: TensorCodecProvider(
        TensorCompressionConfig(ZstdCodecConfig(), min_bytes=0, excluded_dtypes=())
    ),
    CODEC_SPARSE: TensorCodecProvider(
        TensorCompressionConfig(SparseCodecConfig(), min_bytes=0, excluded_dtypes=())
    ),
}
ZSTD_MAGIC = bytes.fromhex("28b52ffd")
GUARD = 64  # bytes of sentinel on each side of every target
SENTINEL = 0xA5
FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

codec_names = st.sampled_from(sorted(CODECS))


def guarded_target(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A uint8 target of ``nbytes`` inside a buffer with sentinel bytes on both sides."""
    whole = torch.full((nbytes + 2 * GUARD,), SENTINEL, dtype=torch.uint8)
    return whole, whole[GUARD : GUARD + nbytes]


def guards_intact(whole: torch.Tensor) -> bool:
    return bool((whole[:GUARD] == SENTINEL).all() and (whole[-GUARD:] == SENTINEL).all())


def as_tensor(data: bytes) -> torch.Tensor:
    if not data:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def decode(codec: TensorCodec, payload: bytes, nbytes: int) -> tuple[bool, torch.Tensor]:
    """Decode into a guarded target; return (succeeded, target). Only CompressionError."""
    whole, target = guarded_target(nbytes)
    try:
        codec.decompress_into(as_tensor(payload), target)
        ok = True
    except CompressionError:
        ok = False
    assert guards_intact(whole), "the decoder wrote outside its target"
    return ok, target


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """Small tensors of mixed compressibility: runs, ramps and random bytes."""
    dtype = draw(st.sampled_from([torch.uint8, torch.int32, torch.int64, torch.float32]))
    shape = tuple(draw(st.lists(st.integers(0, 40), min_size=1, max_size=3)))
    numel = math.prod(shape)
    parts = draw(
        st.lists(
            st.one_of(
                st.binary(min_size=1, max_size=96),
                st.tuples(st.integers(0, 255), st.integers(1, 400)).map(
                    lambda p: bytes([p[0]]) * p[1]
                ),
                st.integers(1, 200).map(lambda n: bytes(range(256))[:n]),
            ),
            max_size=20,
        )
    )
    nbytes = numel * dtype.itemsize
    data = (b"".join(parts) + bytes(nbytes))[:nbytes]
    return as_tensor(data).view(dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype)


def compressed(codec: TensorCodec, t: torch.Tensor) -> bytes:
    bound = codec.max_compressed_size(t.numel() * t.element_size())
    assert bound is not None
    buf = torch.empty(bound, dtype=torch.uint8)
    n = codec.compress_into(t, buf)
    return bytes(buf[:n].tolist())


# -- random payloads ------------------------------------------------------------------------


@FUZZ
@given(name=codec_names, payload=st.binary(max_size=2048), nbytes=st.integers(0, 8192))
@example(name="lz4", payload=b"\x00", nbytes=0)  # a valid, empty lz4 block
@example(name="zstd", payload=ZSTD_MAGIC, nbytes=0)  # a magic and nothing else
def test_random_payload_is_an_error_or_fills_exactly(
    name: str, payload: bytes, nbytes: int
) -> None:
    ok, _ = decode(CODECS[name], payload, nbytes)
    if name.startswith("zstd") and not payload.startswith(ZSTD_MAGIC):
        assert not ok, "random bytes without a zstd frame magic decoded"


@FUZZ
@given(
    name=st.sampled_from(["zstd", "zstd-stream"]),
    tail=st.binary(max_size=512),
    nbytes=st.integers(0, 4096),
    declared=st.booleans(),
)
def test_random_zstd_frame_bodies(name: str, tail: bytes, nbytes: int, declared: bool) -> None:
    # A real frame header (so the decoder goes past the magic), then random blocks.
    codec = CODECS[name]
    header = compressed(codec, torch.zeros(nbytes if declared else nbytes + 1, dtype=torch.uint8))
    ok, target = decode(codec, header[:6] + tail, nbytes)
    if ok:
        assert target.numel() == nbytes


# -- truncated and mutated payloads ---------------------------------------------------------


@FUZZ
@given(name=codec_names, t=tensors(), cut=st.floats(0.0, 1.0, exclude_max=True))
def test_every_strict_prefix_is_an_error(name: str, t: torch.Tensor, cut: float) -> None:
    codec = CODECS[name]
    payload = compressed(codec, t)
    ok, _ = decode(codec, payload[: int(len(payload) * cut)], t.numel() * t.element_size())
    assert not ok, "a truncated payload decoded"


@st.composite
def mutations(draw: st.DrawFn) -> tuple[str, int, int]:
    kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "swap", "append"]))
    return kind, draw(st.integers(0, 1 << 20)), draw(st.integers(0, 255))


def mutate(payload: bytes, edits: list[tuple[str, int, int]]) -> bytes:
    data = bytearray(payload)
    for kind, pos, value in edits:
        at = pos % (len(data) + 1)
        if kind == "insert":
            data[at:at] = bytes([value]) * (1 + value % 7)
        elif kind == "append":
            data += bytes([value]) * (1 + value % 33)
        elif not data:
            continue
        elif kind == "flip":
            data[pos % len(data)] ^= 1 << (value % 8)
        elif kind == "set":
            data[pos % len(data)] = value
        elif kind == "delete":
            del data[pos % len(data) : pos % len(data) + 1 + value % 5]
        else:  # swap two bytes
            i, j = pos % len(data), (pos + value) % len(data)
            data[i], data[j] = data[j], data[i]
    return bytes(data)


@FUZZ
@given(
    name=codec_names,
    t=tensors(),
    edits=st.lists(mutations(), min_size=1, max_size=4),
    resize=st.sampled_from([0, 0, 0, -1, 1, 7]),
)
def test_mutated_payload_is_an_error_or_fills_exactly(
    name: str, t: torch.Tensor, edits: list[tuple[str, int, int]], resize: int
) -> None:
    codec = CODECS[name]
    nbytes = max(0, t.numel() * t.element_size() + resize)
    decode(codec, mutate(compressed(codec, t), edits), nbytes)


# -- through the public receive entry point -------------------------------------------------


@FUZZ
@given(
    codec_id=st.one_of(
        st.sampled_from([CODEC_RAW, CODEC_LZ4, CODEC_ZSTD, CODEC_SPARSE]), st.integers(0, 255)
    ),
    provider_id=st.sampled_from([CODEC_LZ4, CODEC_ZSTD, CODEC_SPARSE]),
    payload=st.binary(max_size=1024),
    nbytes=st.integers(0, 2048),
)
def test_decompress_into_tensor_with_any_codec_id(
    codec_id: int, provider_id: int, payload: bytes, nbytes: int
) -> None:
    whole, target = guarded_target(nbytes)
    try:
        decompress_into_tensor(
            codec_id, as_tensor(payload), target, PROVIDERS[provider_id], timeout=10.0
        )
        ok = True
    except CompressionError:
        ok = False
    assert guards_intact(whole)
    if codec_id not in (CODEC_RAW, provider_id):
        assert not ok, f"codec id {codec_id} was decoded by a {provider_id} provider"
    if codec_id == CODEC_RAW:
        assert ok == (len(payload) == nbytes)
        if ok:
            assert bytes(target.tolist()) == payload


@FUZZ
@given(
    codec=st.sampled_from(["lz4", "zstd", "sparse"]),
    values=st.lists(tensors(), min_size=1, max_size=3),
    edits=st.lists(mutations(), min_size=1, max_size=3),
)
def test_corrupted_compressed_tensors_never_escape_compression_error(
    codec: str, values: list[torch.Tensor], edits: list[tuple[str, int, int]]
) -> None:
    configs = {"lz4": Lz4CodecConfig(), "zstd": ZstdCodecConfig(), "sparse": SparseCodecConfig()}
    config = TensorCompressionConfig(configs[codec], min_bytes=0, excluded_dtypes=())
    with compress_tensors(values, config) as packed:
        for item in packed.items:
            if item.codec_id != CODEC_RAW and item.wire_bytes:
                damaged = as_tensor(mutate(bytes(item.payload.tolist()), edits[:1]))
                n = min(damaged.numel(), item.payload.numel())
                item.payload[:n].copy_(damaged[:n])  # in place: the length stays the same
                if n < item.payload.numel():
                    item.payload[n:].fill_(0)
        try:
            restored = packed.decompress(timeout=10.0)
        except CompressionError:
            return
    assert [tuple(r.shape) for r in restored] == [tuple(v.shape) for v in values]
