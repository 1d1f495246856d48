"""TensorCodecProvider: shared lz4 codec; bounded LIFO zstd contexts; saturation and waits."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from p2p_compress import (
    CompressionTimeoutError,
    Lz4Codec,
    Lz4CodecConfig,
    TensorCodecProvider,
    TensorCompressionConfig,
    ZstdCodec,
    ZstdCodecConfig,
)


def test_lz4_one_shared_codec_without_limit() -> None:
    provider = TensorCodecProvider(TensorCompressionConfig(codec=Lz4CodecConfig(acceleration=3)))
    codecs = [provider.acquire_encoder() for _ in range(50)]
    codecs += [provider.acquire_decoder(timeout=0) for _ in range(50)]
    first = codecs[0]
    assert isinstance(first, Lz4Codec)
    assert first.acceleration == 3
    assert all(c is first for c in codecs)
    for c in codecs:
        assert c is not None
        provider.release(c)
    assert provider.codec_name == "lz4"
    assert provider.codec_id == 1
    assert provider.max_inflight is None
    assert provider.stats() == {"codec": "lz4", "max_inflight": None}


def test_zstd_contexts_are_created_lazily_and_bounded() -> None:
    provider = TensorCodecProvider(ZstdCodecConfig(level=5, max_inflight=3))
    assert provider.stats()["created"] == 0
    a, b, c = (provider.acquire_encoder() for _ in range(3))
    assert all(isinstance(x, ZstdCodec) for x in (a, b, c))
    assert len({id(a), id(b), id(c)}) == 3
    assert isinstance(a, ZstdCodec)
    assert a.level == 5
    assert provider.acquire_encoder() is None  # saturated: never waits
    s = provider.stats()
    assert (s["created"], s["in_use"], s["idle"], s["encoder_busy"]) == (3, 3, 0, 1)
    for x in (a, b, c):
        assert x is not None
        provider.release(x)
    s = provider.stats()
    assert (s["created"], s["in_use"], s["idle"]) == (3, 0, 3)


def test_zstd_queue_is_lifo_and_shared_by_both_directions() -> None:
    provider = TensorCodecProvider(ZstdCodecConfig(max_inflight=2))
    a = provider.acquire_encoder()
    b = provider.acquire_decoder(timeout=1)
    assert a is not None
    provider.release(a)
    provider.release(b)  # b released last
    assert provider.acquire_decoder(timeout=1) is b
    assert provider.acquire_encoder() is a
    assert provider.acquire_encoder() is None
    with pytest.raises(CompressionTimeoutError, match="max_inflight=2"):
        provider.acquire_decoder(timeout=0.05)
    assert provider.stats()["decoder_timeouts"] == 1


def test_decoder_waits_for_a_release() -> None:
    provider = TensorCodecProvider(ZstdCodecConfig(max_inflight=1))
    held = provider.acquire_encoder()
    assert held is not None
    got: list[object] = []

    def receiver() -> None:
        got.append(provider.acquire_decoder(timeout=30))

    t = threading.Thread(target=receiver)
    t.start()
    deadline = time.monotonic() + 30
    while provider.stats()["waiting"] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert provider.stats()["waiting"] == 1
    # While a receiver waits, senders get nothing (they stay raw) even after a release.
    assert provider.acquire_encoder() is None
    provider.release(held)
    t.join(timeout=30)
    assert got == [held]
    s = provider.stats()
    assert (s["waiting"], s["decoder_waited"], s["in_use"]) == (0, 1, 1)


def test_decoder_timeout_none_waits_and_zero_fails_fast() -> None:
    provider = TensorCodecProvider(ZstdCodecConfig(max_inflight=1))
    held = provider.acquire_decoder(timeout=None)
    start = time.monotonic()
    with pytest.raises(CompressionTimeoutError) as info:
        provider.acquire_decoder(timeout=0)
    assert time.monotonic() - start < 5
    assert isinstance(info.value, TimeoutError)
    timer = threading.Timer(0.05, provider.release, args=(held,))
    timer.start()
    assert provider.acquire_decoder(timeout=None) is held
    timer.join()


def test_release_checks_ownership() -> None:
    provider = TensorCodecProvider(ZstdCodecConfig(max_inflight=2))
    codec = provider.acquire_encoder()
    assert codec is not None
    provider.release(codec)
    with pytest.raises(ValueError, match="already released"):
        provider.release(codec)
    with pytest.raises(ValueError, match="not acquired from this provider"):
        provider.release(ZstdCodec())
    lz4 = TensorCodecProvider(Lz4CodecConfig())
    with pytest.raises(ValueError, match="does not belong"):
        lz4.release(Lz4Codec())


def test_context_managers() -> None:
    provider = TensorCodecProvider(ZstdCodecConfig(max_inflight=1))
    with provider.encoder() as enc:
        assert enc is not None
        with provider.encoder() as none:
            assert none is None
    with provider.decoder(timeout=1) as dec:
        assert dec is enc
    assert provider.stats()["in_use"] == 0


def test_bad_config_type() -> None:
    with pytest.raises(TypeError, match="config must be"):
        TensorCodecProvider({"codec": "lz4"})  # type: ignore[arg-type]


def test_many_threads_share_bounded_contexts() -> None:
    provider = TensorCodecProvider(ZstdCodecConfig(max_inflight=2))
    src = (torch.arange(20_000, dtype=torch.int32) % 13).contiguous()
    errors: list[BaseException] = []
    in_use_peak = [0]
    busy = [0]
    lock = threading.Lock()
    active: set[int] = set()

    def work(k: int) -> None:
        try:
            for _ in range(30):
                codec = (
                    provider.acquire_encoder() if k % 2 else provider.acquire_decoder(timeout=60)
                )
                if codec is None:
                    with lock:
                        busy[0] += 1
                    continue
                with lock:
                    assert id(codec) not in active  # exclusive use
                    active.add(id(codec))
                    in_use_peak[0] = max(in_use_peak[0], len(active))
                bound = codec.max_compressed_size(src.nbytes)
                assert bound is not None
                buf = torch.empty(bound, dtype=torch.uint8)
                out = torch.empty_like(src)
                codec.decompress_into(buf[: codec.compress_into(src, buf)], out)
                assert torch.equal(out, src)
                with lock:
                    active.discard(id(codec))
                provider.release(codec)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[0]
    s = provider.stats()
    assert in_use_peak[0] <= 2
    assert s["created"] <= 2
    assert s["in_use"] == 0
    assert s["idle"] == s["created"]
    assert s["encoder_busy"] == busy[0]
