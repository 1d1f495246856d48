"""Round trips of every dtype and shape class, argument checks, corrupt and truncated input."""

from __future__ import annotations

import ctypes

import lz4.block._block as lz4_ext
import pytest
import torch
from conftest import compress, raw_bytes

from p2p_compress import (
    LZ4_MAX_INPUT_SIZE,
    CompressionError,
    Lz4Codec,
    TensorCodec,
    ZstdCodec,
)

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex32,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]
SHAPES = [(), (0,), (3, 0, 5), (1,), (7,), (33, 17), (2, 3, 4, 5), (40_000,)]


def make(
    dtype: torch.dtype, shape: tuple[int, ...], compressible: bool, seed: int = 0
) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    numel = 1
    for s in shape:
        numel *= s
    if dtype == torch.bool:
        if compressible:
            return (torch.arange(numel) % 97 < 40).reshape(shape)
        return (torch.rand(numel, generator=g) < 0.5).reshape(shape)
    size = dtype.itemsize
    if compressible:
        data = (torch.arange(numel * size) // 64 % 5).to(torch.uint8)
    else:
        data = torch.randint(0, 256, (numel * size,), dtype=torch.uint8, generator=g)
    return data.view(dtype).reshape(shape)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental:UserWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_round_trip_every_dtype_and_shape(
    codec: TensorCodec, dtype: torch.dtype, shape: tuple[int, ...]
) -> None:
    for compressible in (True, False):
        src = make(dtype, shape, compressible)
        payload = compress(codec, src)
        out = torch.empty(shape, dtype=dtype)
        codec.decompress_into(payload, out)
        assert out.dtype == dtype
        assert out.shape == src.shape
        assert raw_bytes(out) == raw_bytes(src)


def test_compressible_data_shrinks(codec: TensorCodec) -> None:
    src = torch.zeros(100_000, dtype=torch.int64)
    payload = compress(codec, src)
    # sparse keeps two bits per 32-bit word (its ceiling is 16x); the others do better
    assert payload.numel() < src.nbytes // (15 if codec.name == "sparse" else 50)


def test_incompressible_data_fits_bound(codec: TensorCodec) -> None:
    for n in (1, 15, 255, 4096, 131_073, 300_001):
        src = torch.randint(
            0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(n)
        )
        payload = compress(codec, src)
        assert payload.numel() >= n  # noise does not shrink; it still fits the bound
        out = torch.empty_like(src)
        codec.decompress_into(payload, out)
        assert torch.equal(out, src)


def test_contiguous_view_with_storage_offset(codec: TensorCodec) -> None:
    base = torch.arange(10_000, dtype=torch.int32)
    src = base[1234:5678]
    assert src.storage_offset() == 1234
    payload = compress(codec, src)
    target_base = torch.full((10_000,), -1, dtype=torch.int32)
    out = target_base[100:4544]
    codec.decompress_into(payload, out)
    assert torch.equal(out, src)
    assert (target_base[:100] == -1).all()
    assert (target_base[4544:] == -1).all()


def test_requires_grad_source(codec: TensorCodec) -> None:
    src = torch.linspace(0, 1, 5000, requires_grad=True)
    out = torch.empty(5000)
    codec.decompress_into(compress(codec, src), out)
    assert torch.equal(out, src.detach())


@pytest.mark.parametrize(
    ("make_bad", "match"),
    [
        (lambda: torch.arange(100.0).reshape(10, 10).t(), "contiguous"),
        (lambda: torch.arange(100.0)[::2], "contiguous"),
        (lambda: torch.ones(1, 10).expand(5, 10), "contiguous"),
        (lambda: torch.ones(2, 3, 4, 5).to(memory_format=torch.channels_last), "contiguous"),
        (lambda: torch.randn(10, dtype=torch.complex64).conj(), "conj"),
        (lambda: torch.ones(10, device="meta"), "CPU"),
        (lambda: torch.ones(3, 3).to_sparse(), "dense"),
    ],
)
def test_bad_source_refused_with_value_error(codec: TensorCodec, make_bad, match: str) -> None:  # type: ignore[no-untyped-def]
    bad = make_bad()
    buf = torch.empty(10_000, dtype=torch.uint8)
    with pytest.raises(ValueError, match=match) as info:
        codec.compress_into(bad, buf)
    assert "src" in str(info.value)
    payload = compress(codec, torch.zeros(100))
    with pytest.raises(ValueError, match=match) as info:
        codec.decompress_into(payload, bad)
    assert "dst" in str(info.value)


def test_argument_types_and_buffer_checks(codec: TensorCodec) -> None:
    src = torch.zeros(1000)
    bound = codec.max_compressed_size(4000)
    assert bound is not None
    with pytest.raises(TypeError, match=r"src must be a torch\.Tensor"):
        codec.compress_into(b"abc", torch.empty(bound, dtype=torch.uint8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"dst must be a torch\.Tensor"):
        codec.compress_into(src, bytearray(bound))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"dst must be a torch.uint8 tensor, got dtype torch.int8"):
        codec.compress_into(src, torch.empty(bound, dtype=torch.int8))
    with pytest.raises(ValueError, match=rf"dst holds {bound - 1} bytes.*needs at least {bound}"):
        codec.compress_into(src, torch.empty(bound - 1, dtype=torch.uint8))
    with pytest.raises(ValueError, match=r"src must be a torch\.uint8 tensor"):
        codec.decompress_into(torch.zeros(10), src)
    with pytest.raises(ValueError, match="nbytes must be >= 0"):
        codec.max_compressed_size(-1)


def test_lz4_bound_matches_library_and_limit() -> None:
    lib = ctypes.CDLL(lz4_ext.__file__)
    lib.LZ4_compressBound.argtypes = (ctypes.c_int,)
    lib.LZ4_compressBound.restype = ctypes.c_int
    codec = Lz4Codec()
    for n in (0, 1, 254, 255, 256, 65_536, 10**6, LZ4_MAX_INPUT_SIZE):
        assert codec.max_compressed_size(n) == lib.LZ4_compressBound(n)
    assert LZ4_MAX_INPUT_SIZE == 0x7E000000
    assert codec.max_compressed_size(LZ4_MAX_INPUT_SIZE + 1) is None
    assert ZstdCodec().max_compressed_size(LZ4_MAX_INPUT_SIZE + 1) is not None


def test_lz4_refuses_input_above_its_limit() -> None:
    # Reserved, never touched: Linux maps the pages lazily.
    huge = torch.empty(LZ4_MAX_INPUT_SIZE + 1, dtype=torch.uint8)
    with pytest.raises(ValueError, match="more than lz4 accepts"):
        Lz4Codec().compress_into(huge, torch.empty(16, dtype=torch.uint8))


def test_codec_parameter_checks() -> None:
    with pytest.raises(ValueError, match="acceleration"):
        Lz4Codec(acceleration=0)
    with pytest.raises(ValueError, match="level"):
        ZstdCodec(level=23)
    with pytest.raises(ValueError, match="backend"):
        ZstdCodec(backend="zlib")
    with pytest.raises(TypeError, match="planes"):
        ZstdCodec(planes="yes")  # type: ignore[arg-type]
    # Huge accelerations are clamped by LZ4 itself, not an error.
    src = torch.arange(50_000, dtype=torch.int64)
    codec = Lz4Codec(acceleration=10**9)
    out = torch.empty_like(src)
    codec.decompress_into(compress(codec, src), out)
    assert torch.equal(out, src)


def test_zstd_backends_read_each_other() -> None:
    src = make(torch.float32, (20_000,), compressible=True)
    native, stream = ZstdCodec(level=3), ZstdCodec(level=3, backend="python-zstandard")
    assert native.backend == "libzstd"
    assert stream.backend == "python-zstandard"
    for a, b in ((native, stream), (stream, native)):
        out = torch.empty_like(src)
        b.decompress_into(compress(a, src), out)
        assert torch.equal(out, src)
    # Empty frames too (the stream path special-cases them).
    for a, b in ((native, stream), (stream, native)):
        out = torch.empty(0)
        b.decompress_into(compress(a, torch.empty(0)), out)


def test_zstd_tuned_for_planes_writes_ordinary_frames_and_shrinks_planes() -> None:
    g = torch.Generator().manual_seed(3)
    weights = (torch.randn(1 << 16, generator=g) * 0.02).to(torch.bfloat16)
    planes = torch.stack([b for b in weights.view(torch.uint8).view(-1, 2).T]).reshape(-1)
    sizes = {}
    for backend in ("libzstd", "python-zstandard"):
        tuned, plain = ZstdCodec(1, backend=backend, planes=True), ZstdCodec(1, backend=backend)
        assert (tuned.planes, plain.planes) == (True, False)
        for a, b in ((tuned, plain), (plain, tuned)):  # each reads the other's frames
            out = torch.empty_like(planes)
            b.decompress_into(compress(a, planes), out)
            assert torch.equal(out, planes)
        sizes[backend] = (compress(tuned, planes).numel(), compress(plain, planes).numel())
    # the sign/exponent plane holds under 3 bits of entropy per byte; the tuned match
    # finder leaves it to the entropy coder, within 5% of level 1's size
    for tuned_size, plain_size in sizes.values():
        assert tuned_size <= 1.05 * plain_size
        assert tuned_size < 0.8 * planes.numel()


# ---------------------------------------------------------------- corrupt input


def _payload(codec: TensorCodec) -> tuple[torch.Tensor, torch.Tensor]:
    src = (torch.arange(3000, dtype=torch.int32) % 251) * 7
    return src, compress(codec, src).clone()


def test_every_truncation_is_an_error(codec: TensorCodec) -> None:
    src, payload = _payload(codec)
    out = torch.empty_like(src)
    for cut in range(payload.numel()):
        with pytest.raises(CompressionError):
            codec.decompress_into(payload[:cut].clone(), out)


def test_trailing_bytes_are_an_error(codec: TensorCodec) -> None:
    src, payload = _payload(codec)
    out = torch.empty_like(src)
    for extra in (
        torch.zeros(1, dtype=torch.uint8),
        payload[:7],
        torch.full((50,), 0xFF, dtype=torch.uint8),
    ):
        with pytest.raises(CompressionError):
            codec.decompress_into(torch.cat([payload, extra]), out)


def test_wrong_target_size_is_an_error(codec: TensorCodec) -> None:
    src, payload = _payload(codec)
    for n in (0, 1, src.numel() - 1, src.numel() + 1, 2 * src.numel()):
        with pytest.raises(CompressionError, match=r"target|corrupt|declares"):
            codec.decompress_into(payload, torch.empty(n, dtype=torch.int32))


def test_wrong_target_dtype_same_bytes_restores_bytes(codec: TensorCodec) -> None:
    # The codec restores bytes; carrying dtype and shape is the caller's job.
    src, payload = _payload(codec)
    out = torch.empty(src.numel() * 2, dtype=torch.int16)
    codec.decompress_into(payload, out)
    assert raw_bytes(out) == raw_bytes(src)


@pytest.mark.parametrize("seed", range(5))
def test_garbage_is_an_error(codec: TensorCodec, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    garbage = torch.randint(0, 256, (200,), dtype=torch.uint8, generator=g)
    with pytest.raises(CompressionError):
        codec.decompress_into(garbage, torch.empty(1000, dtype=torch.uint8))


def test_empty_payload_is_an_error(codec: TensorCodec) -> None:
    with pytest.raises(CompressionError):
        codec.decompress_into(torch.empty(0, dtype=torch.uint8), torch.empty(10))
    with pytest.raises(CompressionError):
        codec.decompress_into(torch.empty(0, dtype=torch.uint8), torch.empty(0))


def test_other_codecs_payload_is_an_error() -> None:
    src = torch.arange(5000, dtype=torch.int64)
    out = torch.empty_like(src)
    with pytest.raises(CompressionError):
        ZstdCodec().decompress_into(compress(Lz4Codec(), src), out)
    with pytest.raises(CompressionError):
        ZstdCodec(backend="python-zstandard").decompress_into(compress(Lz4Codec(), src), out)
    with pytest.raises(CompressionError):
        Lz4Codec().decompress_into(compress(ZstdCodec(), src), out)


def test_bit_flips_never_overrun_or_crash(codec: TensorCodec) -> None:
    # Without a content checksum a flipped literal can decode to other bytes of the right
    # size; everything else is an error. Either way the target's neighbours are untouched.
    src, payload = _payload(codec)
    guard = torch.full((src.numel() + 64,), 0x5A5A5A5A, dtype=torch.int32)
    out = guard[32:-32]
    errors = 0
    for pos in range(payload.numel()):
        for bit in (0, 3, 7):
            bad = payload.clone()
            bad[pos] ^= 1 << bit
            try:
                codec.decompress_into(bad, out)
            except CompressionError:
                errors += 1
            assert (guard[:32] == 0x5A5A5A5A).all()
            assert (guard[-32:] == 0x5A5A5A5A).all()
    assert errors > 0


@pytest.mark.parametrize("acceleration", [1, 7])
def test_lz4_output_matches_python_lz4(acceleration: int) -> None:
    import lz4.block

    src = make(torch.int32, (50_000,), compressible=True)
    ours = compress(Lz4Codec(acceleration), src)
    mode = "default" if acceleration == 1 else "fast"
    theirs = lz4.block.compress(
        src.numpy().tobytes(), mode=mode, acceleration=acceleration, store_size=False
    )
    assert bytes(ours.tolist()) == theirs
    out = torch.empty_like(src)
    Lz4Codec().decompress_into(torch.frombuffer(bytearray(theirs), dtype=torch.uint8), out)
    assert torch.equal(out, src)


def test_lz4_state_is_per_thread() -> None:
    import threading

    codec = Lz4Codec()
    results: list[bool] = []

    def work(seed: int) -> None:
        src = make(torch.int64, (30_000,), compressible=seed % 2 == 0, seed=seed)
        for _ in range(20):
            out = torch.empty_like(src)
            codec.decompress_into(compress(codec, src), out)
            results.append(bool(torch.equal(out, src)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(results) == 120
    assert all(results)
