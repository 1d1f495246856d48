"""Property tests (hypothesis): round trips, corrupt input, pool invariants."""

from __future__ import annotations

import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p_compress import (
    CompressionError,
    Lz4Codec,
    TensorBufferPool,
    TensorCodec,
    ZstdCodec,
    compress_tensors,
)
from p2p_compress.internal import BufferLease

CODECS: list[TensorCodec] = [
    Lz4Codec(),
    ZstdCodec(),
    ZstdCodec(level=5, backend="python-zstandard"),
]
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 12), max_size=4)))
    numel = math.prod(shape)
    nbytes = numel * dtype.itemsize
    # Mix runs (compressible) and free bytes (incompressible).
    chunks = draw(
        st.lists(
            st.one_of(
                st.binary(min_size=1, max_size=64),
                st.tuples(st.integers(0, 255), st.integers(1, 200)).map(
                    lambda p: bytes([p[0]]) * p[1]
                ),
            ),
            max_size=30,
        )
    )
    data = (b"".join(chunks) + bytes(nbytes))[:nbytes]
    raw = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )
    if dtype == torch.bool:
        # A bool tensor may only hold bytes 0 and 1; map every drawn byte onto them.
        # (Drawing one boolean per element would ask hypothesis for lists longer
        # than it supports: shapes reach 12**4 elements.)
        return (raw % 2).to(torch.bool).reshape(shape)
    return raw.view(dtype).reshape(shape)


def as_bytes(t: torch.Tensor) -> bytes:
    return bytes(t.reshape(-1).view(torch.uint8).tolist()) if t.numel() else b""


def compress(codec: TensorCodec, t: torch.Tensor) -> torch.Tensor:
    bound = codec.max_compressed_size(t.numel() * t.element_size())
    assert bound is not None
    buf = torch.empty(bound, dtype=torch.uint8)
    return buf[: codec.compress_into(t, buf)].clone()


@SETTINGS
@given(t=tensors(), codec=st.sampled_from(CODECS))
def test_codec_round_trip_is_byte_exact(t: torch.Tensor, codec: TensorCodec) -> None:
    out = torch.empty(t.shape, dtype=t.dtype)
    codec.decompress_into(compress(codec, t), out)
    assert as_bytes(out) == as_bytes(t)


@SETTINGS
@given(
    data=st.dictionaries(st.text(min_size=1, max_size=5), tensors(), max_size=4),
    codec=st.sampled_from(["lz4", "zstd"]),
)
def test_standalone_round_trip(data: dict[str, torch.Tensor], codec: str) -> None:
    with compress_tensors(data, codec) as packed:
        restored = packed.decompress(timeout=30)
    assert isinstance(restored, dict)
    assert list(restored) == list(data)
    for key, t in data.items():
        assert restored[key].dtype == t.dtype
        assert restored[key].shape == t.shape
        assert as_bytes(restored[key]) == as_bytes(t)


@SETTINGS
@given(
    t=tensors(),
    codec=st.sampled_from(CODECS),
    edit=st.one_of(
        st.tuples(st.just("flip"), st.integers(0, 10**6), st.integers(0, 7)),
        st.tuples(st.just("cut"), st.integers(0, 10**6), st.just(0)),
        st.tuples(st.just("append"), st.integers(1, 40), st.integers(0, 255)),
        st.tuples(st.just("resize"), st.integers(-3, 3), st.just(0)),
    ),
)
def test_damaged_payload_raises_or_fills_exactly(
    t: torch.Tensor, codec: TensorCodec, edit: tuple[str, int, int]
) -> None:
    payload = compress(codec, t)
    kind, a, b = edit
    nbytes = t.numel() * t.element_size()
    target_bytes = nbytes
    if kind == "flip":
        payload[a % payload.numel()] ^= 1 << b
    elif kind == "cut":
        payload = payload[: a % payload.numel()].clone()
    elif kind == "append":
        payload = torch.cat([payload, torch.full((a,), b, dtype=torch.uint8)])
    else:
        target_bytes = max(0, nbytes + a)
    guard = torch.full((target_bytes + 32,), 0xC3, dtype=torch.uint8)
    out = guard[16 : 16 + target_bytes]
    try:
        codec.decompress_into(payload, out)
    except CompressionError:
        pass
    else:
        # Only a flipped literal (no content checksum) or an unchanged size may succeed.
        assert kind in ("flip", "resize")
        if kind == "resize":
            assert target_bytes == nbytes
            assert as_bytes(out) == as_bytes(t)
    assert bool((guard[:16] == 0xC3).all())
    assert bool((guard[16 + target_bytes :] == 0xC3).all())


@SETTINGS
@given(
    max_bytes=st.integers(1, 4096),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("acquire"), st.integers(0, 3000)),
            st.tuples(st.just("release"), st.integers(0, 50)),
            st.tuples(st.just("discard"), st.integers(0, 50)),
        ),
        max_size=60,
    ),
)
def test_pool_rules_and_accounting(max_bytes: int, ops: list[tuple[str, int]]) -> None:
    pool = TensorBufferPool(max_bytes)
    live: list[BufferLease] = []
    idle: list[int] = []  # model of cached capacities
    for op, arg in ops:
        before = pool.stats()
        if op == "acquire":
            fitting = sorted(c for c in idle if c >= arg)
            active = sum(lease.capacity for lease in live)
            lease = pool.acquire(arg)
            if lease is None:
                assert not fitting
                assert active + arg > max_bytes
            else:
                assert lease.buffer.numel() == lease.capacity >= arg
                if fitting and (fitting[0] <= 2 * arg or active + sum(idle) + arg > max_bytes):
                    assert lease.capacity == fitting[0]
                    idle.remove(fitting[0])
                else:
                    assert lease.capacity == arg
                    # evict largest idle first until it fits
                    while active + sum(idle) + arg > max_bytes:
                        idle.remove(max(idle))
                live.append(lease)
        elif live:
            lease = live.pop(arg % len(live))
            if op == "release":
                assert lease.release()
                idle.append(lease.capacity)
            else:
                assert lease.discard()
            assert not lease.release()
            assert not lease.discard()
        s = pool.stats()
        assert s["active_bytes"] == sum(lease.capacity for lease in live)
        assert s["active_buffers"] == len(live)
        assert s["cached_bytes"] == sum(idle)
        assert s["cached_buffers"] == len(idle)
        assert s["active_bytes"] + s["cached_bytes"] <= max_bytes
        assert s["hits"] + s["misses"] + s["rejections"] >= before["hits"] + before["misses"]
