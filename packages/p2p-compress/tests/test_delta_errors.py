"""Weight deltas: bad arguments, bad metadata, corrupt payloads, and the checksum."""

from __future__ import annotations

import pickle

import pytest
import torch

from p2p_compress import (
    CompressionError,
    DeltaPatch,
    apply_delta,
    encode_delta,
    tensor_checksum,
)

HEADER = 40


def _pair(
    dtype: torch.dtype = torch.bfloat16, n: int = 20_000, frac: float = 0.02
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    base = (torch.randn(n, generator=gen) * 0.02).to(dtype)
    new = base.clone()
    mask = torch.rand(n, generator=gen) < frac
    new[mask] = (torch.randn(int(mask.sum()), generator=gen) * 0.02).to(dtype)
    return new, base


# -- arguments ---------------------------------------------------------------------------


def test_encode_refuses_bad_arguments_naming_them() -> None:
    new, base = _pair()
    with pytest.raises(TypeError, match=r"new must be a torch.Tensor"):
        encode_delta([1.0], None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"base must be a torch.Tensor"):
        encode_delta(new, base.tolist())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"base \(dtype torch.float32.*new \(dtype torch.bfloat16"):
        encode_delta(new, base.float())
    with pytest.raises(ValueError, match=r"base \(dtype torch.bfloat16, numel 19999\)"):
        encode_delta(new, base[1:])
    with pytest.raises(ValueError, match=r"new .*must be contiguous"):
        encode_delta(new.view(100, 200).t(), None)
    with pytest.raises(ValueError, match=r"new has dtype torch.complex128 of 16-byte"):
        encode_delta(torch.zeros(4, dtype=torch.complex128), None)
    with pytest.raises(
        ValueError, match=r"codec must be one of \['raw', 'lz4', 'zstd'\], got 'gzip'"
    ):
        encode_delta(new, base, codec="gzip")
    with pytest.raises(ValueError, match=r"level must be an integer from 1 to 22, got 0"):
        encode_delta(new, base, level=0)
    with pytest.raises(ValueError, match=r"prefer must be one of .*got 'tiny'"):
        encode_delta(new, base, prefer="tiny")


def test_apply_refuses_a_mismatch_before_touching_the_target() -> None:
    new, base = _pair()
    patch = encode_delta(new, base)
    with pytest.raises(TypeError, match=r"patch must be a DeltaPatch"):
        apply_delta(patch.meta(), base.clone())  # type: ignore[arg-type]
    for target in (base.float(), base[:-1].clone(), base.view(torch.int16).clone()):
        before = target.clone()
        with pytest.raises(ValueError, match=r"target \(dtype .*\) does not match the patch"):
            apply_delta(patch, target)
        assert torch.equal(target.view(torch.uint8), before.view(torch.uint8))
    with pytest.raises(TypeError, match=r"target must be a torch.Tensor"):
        apply_delta(patch, None)  # type: ignore[arg-type]
    # pieces: checked together before any is written; the message names the bad one
    half = base.numel() // 2
    for pieces, message in (
        ([base[:half].clone(), base[half:-1].clone()], r"pieces together .*numel"),
        ([base[:half].clone(), base[half:].float()], r"target\[1\] has dtype torch.float32"),
        (
            [base[:half].clone(), base.new_zeros(2 * (base.numel() - half))[::2]],
            r"target\[1\].*contiguous",
        ),
    ):
        before = [p.clone() for p in pieces]
        with pytest.raises(ValueError, match=message):
            apply_delta(patch, pieces)
        assert all(torch.equal(p, b) for p, b in zip(pieces, before, strict=True))
    with pytest.raises(TypeError, match=r"target\[0\] must be a torch.Tensor"):
        apply_delta(patch, [b"x"])  # type: ignore[list-item]
    pieces = [base[:half].clone(), base[half:].clone()]
    apply_delta(patch, pieces)  # still usable: the right pieces take it
    assert torch.equal(torch.cat(pieces).view(torch.int16), new.view(torch.int16))


# -- metadata ----------------------------------------------------------------------------


def test_meta_is_small_and_round_trips() -> None:
    new, base = _pair()
    patch = encode_delta(new, base)
    meta = patch.meta()
    assert meta == {
        "kind": "sparse",
        "dtype": "bfloat16",
        "numel": 20_000,
        "changed": patch.changed,
        "codec": "zstd",
        "wire_nbytes": patch.wire_nbytes,
    }
    assert len(pickle.dumps(meta)) < 200
    assert DeltaPatch.from_meta(meta, patch.payload) == patch
    meta.pop("wire_nbytes")
    assert DeltaPatch.from_meta(meta, patch.payload) == patch


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("kind", "diff", r"meta\['kind'\] must be one of"),
        ("codec", "gzip", r"meta\['codec'\] must be one of"),
        ("dtype", "float128", r"meta\['dtype'\] names no torch dtype"),
        ("dtype", "complex128", r"meta\['dtype'\] is torch.complex128"),
        ("numel", -1, r"meta\['numel'\] must be an integer >= 0"),
        ("numel", "7", r"meta\['numel'\] must be an integer >= 0"),
        ("changed", True, r"meta\['changed'\] must be an integer >= 0"),
        ("changed", 10**9, r"meta\['changed'\] \(1000000000\) exceeds meta\['numel'\]"),
        ("wire_nbytes", 3, r"payload holds \d+ bytes, meta\['wire_nbytes'\] says 3"),
        ("extra", 1, r"meta has unknown keys \['extra'\]"),
    ],
)
def test_from_meta_names_the_bad_key(key: str, value: object, message: str) -> None:
    new, base = _pair()
    patch = encode_delta(new, base)
    meta: dict[str, object] = dict(patch.meta())
    meta[key] = value
    with pytest.raises(ValueError, match=message):
        DeltaPatch.from_meta(meta, patch.payload)


def test_from_meta_refuses_missing_keys_and_bad_payloads() -> None:
    new, base = _pair()
    patch = encode_delta(new, base)
    for key in ("kind", "dtype", "numel", "changed", "codec"):
        meta = dict(patch.meta())
        del meta[key]
        with pytest.raises(ValueError, match=f"meta lacks the key '{key}'"):
            DeltaPatch.from_meta(meta, patch.payload)
    with pytest.raises(TypeError, match=r"meta must be a mapping"):
        DeltaPatch.from_meta([("kind", "full")], patch.payload)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"payload must be a 1-D contiguous CPU torch.uint8"):
        DeltaPatch.from_meta(patch.meta(), patch.payload.view(torch.int8))
    with pytest.raises(TypeError, match=r"payload must be a torch.Tensor"):
        DeltaPatch.from_meta(patch.meta(), bytes(patch.payload.numpy()))  # type: ignore[arg-type]


# -- corrupt payloads --------------------------------------------------------------------


def _cases() -> list[tuple[str, torch.Tensor, torch.Tensor, DeltaPatch]]:
    out = []
    for frac, prefer in ((0.02, "smallest"), (0.8, "smallest"), (0.02, "full")):
        new, base = _pair(frac=frac)
        for codec in ("zstd", "lz4", "raw"):
            patch = encode_delta(new, base, codec=codec, prefer=prefer)
            out.append((f"{patch.kind}-{patch.codec}", new, base, patch))
    return out


CASES = _cases()


@pytest.mark.parametrize(("name", "new", "base", "patch"), CASES, ids=[c[0] for c in CASES])
def test_truncated_payloads_raise(
    name: str, new: torch.Tensor, base: torch.Tensor, patch: DeltaPatch
) -> None:
    size = patch.wire_nbytes
    for cut in sorted({0, 5, HEADER - 1, HEADER, HEADER + 1, size // 2, size - 1}):
        short = DeltaPatch.from_meta(
            {k: v for k, v in patch.meta().items() if k != "wire_nbytes"},
            patch.payload[:cut].clone(),
        )
        target = base.clone()
        with pytest.raises(CompressionError, match=r"corrupt|truncated|decoded to|empty"):
            apply_delta(short, target)
        if patch.kind != "full":  # checked completely before writing
            assert torch.equal(target.view(torch.int16), base.view(torch.int16))


@pytest.mark.parametrize(("name", "new", "base", "patch"), CASES, ids=[c[0] for c in CASES])
def test_flipped_bytes_never_pass_silently(
    name: str, new: torch.Tensor, base: torch.Tensor, patch: DeltaPatch
) -> None:
    """A flipped byte raises CompressionError, or the checksum of the result shows it."""
    want = tensor_checksum(new)
    gen = torch.Generator().manual_seed(3)
    places = torch.randint(HEADER, patch.wire_nbytes, (40,), generator=gen).tolist()
    header = [0, 4, 5, 6, 7, 8, 16, 24, 32]  # magic, version, kind, codec, itemsize, flags,
    raised = []  # numel, changed, body length
    for place in [*header, *places]:
        payload = patch.payload.clone()
        payload[place] ^= 0x5A
        bad = DeltaPatch.from_meta(patch.meta(), payload)
        target = base.clone()
        try:
            apply_delta(bad, target)
        except CompressionError:
            raised.append(place)
            if patch.kind != "full":
                assert torch.equal(target.view(torch.int16), base.view(torch.int16))
            continue
        assert tensor_checksum(target) != want, place
    assert set(header) <= set(raised)  # every header field is checked


def test_payload_of_another_patch_is_refused() -> None:
    new, base = _pair()
    a = encode_delta(new, base)
    b = encode_delta(base, new)  # the same numbers, the other way
    swapped = DeltaPatch.from_meta({**a.meta(), "wire_nbytes": b.wire_nbytes}, b.payload)
    other = encode_delta(new, base, prefer="full")
    target = base.clone()
    apply_delta(swapped, target)  # same metadata: the header cannot tell, the checksum can
    assert tensor_checksum(target) != tensor_checksum(new)
    wrong = DeltaPatch.from_meta({**a.meta(), "wire_nbytes": other.wire_nbytes}, other.payload)
    with pytest.raises(CompressionError, match=r"does not match its metadata"):
        apply_delta(wrong, base.clone())


def test_compression_error_pickles() -> None:
    new, base = _pair()
    patch = encode_delta(new, base)
    with pytest.raises(ValueError, match=r"wire_nbytes"):
        DeltaPatch.from_meta(patch.meta(), patch.payload[:-1].clone())
    bad = DeltaPatch.from_meta(
        {k: v for k, v in patch.meta().items() if k != "wire_nbytes"}, patch.payload[:-1].clone()
    )
    with pytest.raises(CompressionError) as info:
        apply_delta(bad, base.clone())
    again = pickle.loads(pickle.dumps(info.value))
    assert str(again) == str(info.value)


# -- checksum ----------------------------------------------------------------------------

_M = (1 << 64) - 1


def _splitmix(x: int) -> int:
    z = (x + 0x9E3779B97F4A7C15) & _M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    return z ^ (z >> 31)


def _fmix(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _M
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _M
    return h ^ (h >> 33)


def reference_checksum(data: bytes, chunk: int = 1 << 15) -> int:
    """The documented algorithm, word by word in Python integers."""
    h = 0x243F6A8885A308D3
    words = len(data) // 8
    for j, start in enumerate(range(0, words, chunk)):
        s = 0
        for i in range(min(chunk, words - start)):
            w = int.from_bytes(data[8 * (start + i) : 8 * (start + i) + 8], "little")
            s = (s + w * (_splitmix(i + 1) | 1)) & _M
        h = _fmix(h ^ _fmix((s + (j + 1) * 0x9E3779B97F4A7C15) & _M))
    tail = data[8 * words :]
    if tail:
        h = _fmix(h ^ int.from_bytes(tail, "little") ^ (len(tail) << 56))
    return _fmix(h ^ len(data))


def test_checksum_follows_its_documented_algorithm() -> None:
    gen = torch.Generator().manual_seed(0)
    for n in (0, 1, 7, 8, 9, 1000, 8 * (1 << 15) + 13):
        t = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
        data = bytes(t.numpy())
        assert tensor_checksum(t) == reference_checksum(data)


def test_checksum_has_fixed_values() -> None:
    """The same bytes give these values on every machine (any change here breaks peers)."""
    assert tensor_checksum(torch.empty(0)) == reference_checksum(b"")
    values = {
        "empty": tensor_checksum(torch.empty(0)),
        "arange": tensor_checksum(torch.arange(1000, dtype=torch.int64)),
        "ones_bf16": tensor_checksum(torch.ones(77, dtype=torch.bfloat16)),
    }
    assert values == GOLDEN


GOLDEN = {
    "empty": 8848935107335307795,
    "arange": 7926083577890062299,
    "ones_bf16": 3878259769974083779,
}


def test_checksum_depends_on_bytes_only_and_sees_changes() -> None:
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(100_000, generator=gen)
    h = tensor_checksum(a)
    assert tensor_checksum(a.view(torch.int32)) == h
    assert tensor_checksum(a.view(100, 1000)) == h
    assert tensor_checksum(a.view(torch.uint8)) == h
    seen = {h}
    for word in (0, 1, 31_000, 99_999):
        for bit in (0, 1, 15, 22, 30, 31):
            b = a.clone()
            b.view(torch.int32)[word] ^= 1 << bit if bit < 31 else -(1 << 31)
            seen.add(tensor_checksum(b))
    assert len(seen) == 1 + 4 * 6  # every single-bit flip changes the value, all differ
    b = a.clone()
    b[:50_000], b[50_000:] = a[50_000:].clone(), a[:50_000].clone()  # halves swapped
    assert tensor_checksum(b) != h
    assert tensor_checksum(a[:-1].contiguous()) != h
    z = torch.zeros(8, dtype=torch.uint8)
    assert tensor_checksum(z) != tensor_checksum(z[:7].contiguous())  # length counts
    assert tensor_checksum(torch.zeros(1000)) != tensor_checksum(torch.zeros(1001))


def test_checksum_refuses_what_it_cannot_read() -> None:
    with pytest.raises(TypeError, match=r"t must be a torch.Tensor"):
        tensor_checksum(b"bytes")
    with pytest.raises(ValueError, match=r"must be contiguous"):
        tensor_checksum(torch.zeros(10, 10).t())
    with pytest.raises(ValueError, match=r"t\[1\] .*must be contiguous"):
        tensor_checksum([torch.zeros(3), torch.zeros(10, 10).t()])
    with pytest.raises(TypeError, match=r"t\[0\] must be a torch.Tensor"):
        tensor_checksum([b"bytes"])


def test_checksum_separates_random_versions() -> None:
    """2000 versions of a buffer, a few bytes changed in each: no two share a checksum."""
    gen = torch.Generator().manual_seed(4)
    base = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=gen)
    ours = set()
    for _ in range(2000):
        t = base.clone()
        idx = torch.randint(0, 4096, (3,), generator=gen)
        t[idx] = torch.randint(0, 256, (3,), dtype=torch.uint8, generator=gen)
        ours.add((tensor_checksum(t), bytes(t.numpy())))
    assert len({h for h, _ in ours}) == len({d for _, d in ours})
