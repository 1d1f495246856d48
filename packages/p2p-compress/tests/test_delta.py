"""Weight deltas: bit-exact round trips of every dtype and kind, the kind chosen, the sizes."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2p_compress import (
    DELTA_CODECS,
    DELTA_PREFERENCES,
    DeltaPatch,
    TensorBufferPool,
    apply_delta,
    encode_delta,
    tensor_checksum,
)

HEADER = 40
DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.float8_e4m3fn,
    torch.int16,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.float32,
    torch.int64,
    torch.float64,
    torch.complex64,
]
INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def bits(t: torch.Tensor) -> list[int]:
    """The elements' bit patterns (NaN payloads and signed zeros compare exactly)."""
    return t.reshape(-1).view(INTS[t.element_size()]).tolist()


def random_bits(dtype: torch.dtype, numel: int, gen: torch.Generator) -> torch.Tensor:
    """Random bit patterns of ``dtype`` (NaNs with payloads, infinities, -0.0 included)."""
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=gen).bool()
    raw = torch.randint(0, 256, (numel * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return raw.view(dtype)


def changed_copy(
    base: torch.Tensor, frac: float, small: bool, gen: torch.Generator
) -> torch.Tensor:
    """``base`` with about ``frac`` of its elements changed: by +-1..3 in their bit
    patterns (like an optimizer step) when ``small``, else to random bits."""
    new = base.clone()
    n = base.numel()
    if n == 0 or frac == 0:
        return new
    mask = torch.rand(n, generator=gen) < frac
    if base.dtype == torch.bool:
        new[mask] = ~new[mask]
        return new
    ints = new.view(INTS[base.element_size()])
    if small:
        step = torch.randint(-3, 4, (n,), generator=gen).to(ints.dtype)
        ints[mask] += step[mask]
    else:
        ints[mask] = random_bits(base.dtype, n, gen).view(ints.dtype)[mask]
    return new


def true_changed(new: torch.Tensor, base: torch.Tensor) -> int:
    a = np.asarray(bits(new), dtype=object) if new.numel() else np.empty(0)
    b = np.asarray(bits(base), dtype=object) if base.numel() else np.empty(0)
    return int((a != b).sum())


@st.composite
def cases(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, str, str, bool]:
    dtype = draw(st.sampled_from(DTYPES))
    numel = draw(st.one_of(st.integers(0, 40), st.integers(0, 3000)))
    frac = draw(st.sampled_from([0.0, 0.003, 0.02, 0.1, 0.3, 0.6, 0.9, 1.0]))
    small = draw(st.booleans())
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    base = random_bits(dtype, numel, gen)
    new = changed_copy(base, frac, small, gen)
    codec = draw(st.sampled_from(DELTA_CODECS))
    prefer = draw(st.sampled_from(DELTA_PREFERENCES))
    with_base = draw(st.booleans())
    return new, base, codec, prefer, with_base


@SETTINGS
@given(cases())
def test_round_trip_is_bit_exact(case: tuple[torch.Tensor, torch.Tensor, str, str, bool]) -> None:
    new, base, codec, prefer, with_base = case
    new_before, base_before = bits(new), bits(base)
    patch = encode_delta(new, base if with_base else None, codec=codec, prefer=prefer)
    assert bits(new) == new_before
    assert bits(base) == base_before
    assert patch.dtype == new.dtype
    assert patch.numel == new.numel()
    assert patch.changed == (true_changed(new, base) if with_base else new.numel())
    assert patch.wire_nbytes <= HEADER + new.numel() * new.element_size()
    if not with_base or prefer == "full":
        assert patch.kind == "full"
    if codec == "raw":
        assert patch.codec == "raw"
    # Through the wire: meta pickled, payload copied.
    meta = pickle.loads(pickle.dumps(patch.meta()))
    received = DeltaPatch.from_meta(meta, patch.payload.clone())
    assert received == patch
    target = base.clone() if with_base else torch.full_like(base, 0)
    apply_delta(received, target)
    assert bits(target) == bits(new)
    assert tensor_checksum(target) == tensor_checksum(new)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("codec", DELTA_CODECS)
def test_every_kind_round_trips(dtype: torch.dtype, codec: str) -> None:
    gen = torch.Generator().manual_seed(7)
    base = random_bits(dtype, 5000, gen)
    kinds = set()
    for frac, small, prefer in [
        (0.02, True, "smallest"),  # sparse
        (0.8, True, "smallest"),  # xor (zstd/lz4)
        (0.5, True, "fast"),  # xor by the fast rule
        (1.0, False, "smallest"),  # full (or xor)
        (0.02, True, "full"),
    ]:
        new = changed_copy(base, frac, small, gen)
        patch = encode_delta(new, base, codec=codec, prefer=prefer)
        kinds.add(patch.kind)
        target = base.clone()
        apply_delta(patch, target)
        assert bits(target) == bits(new), (frac, prefer, patch)
    expected = {"sparse", "full"} if codec == "raw" else {"sparse", "xor", "full"}
    assert expected <= kinds, kinds


# (base, new) bit patterns per float dtype: 0.0 -> -0.0, -0.0 -> 0.0, a NaN -> a NaN with
# another payload, +inf -> -inf, a quiet NaN -> a signalling one; then unchanged values.
SPECIALS = {
    torch.bfloat16: [
        (0x0000, 0x8000),
        (0x8000, 0x0000),
        (0x7FC0, 0x7FC1),
        (0x7F80, 0xFF80),
        (0xFFC0, 0x7F81),
    ],
    torch.float16: [
        (0x0000, 0x8000),
        (0x8000, 0x0000),
        (0x7E00, 0x7E01),
        (0x7C00, 0xFC00),
        (0xFE00, 0x7C01),
    ],
    torch.float32: [
        (0, 0x80000000),
        (0x80000000, 0),
        (0x7FC00000, 0x7FC00001),
        (0x7F800000, 0xFF800000),
        (0xFFC00000, 0x7F800001),
    ],
    torch.float64: [
        (0, 1 << 63),
        (1 << 63, 0),
        (0x7FF8 << 48, (0x7FF8 << 48) + 1),
        (0x7FF << 52, 0xFFF << 52),
        (0xFFF8 << 48, (0x7FF << 52) + 1),
    ],
}


def _from_bits(values: list[int], dtype: torch.dtype) -> torch.Tensor:
    size = dtype.itemsize
    signed = [v - (1 << (8 * size)) if v >= 1 << (8 * size - 1) else v for v in values]
    return torch.tensor(signed, dtype=INTS[size]).view(dtype)


@pytest.mark.parametrize("dtype", list(SPECIALS), ids=str)
def test_nan_payloads_and_signed_zeros_travel_exactly(dtype: torch.dtype) -> None:
    pairs = SPECIALS[dtype] * 40 + [(0x3C00, 0x3C00)] * 300  # the rest unchanged
    base = _from_bits([b for b, _ in pairs], dtype)
    new = _from_bits([n for _, n in pairs], dtype)
    for codec in DELTA_CODECS:
        for prefer in DELTA_PREFERENCES:
            patch = encode_delta(new, base, codec=codec, prefer=prefer)
            assert patch.changed == 200
            target = base.clone()
            apply_delta(patch, target)
            assert bits(target) == bits(new)


def test_nothing_changed_is_a_header_only_sparse_patch() -> None:
    base = torch.randn(10_000).to(torch.bfloat16)
    for codec in DELTA_CODECS:
        patch = encode_delta(base.clone(), base, codec=codec)
        assert (patch.kind, patch.changed, patch.wire_nbytes) == ("sparse", 0, HEADER)
        target = base.clone()
        apply_delta(patch, target)
        assert bits(target) == bits(base)


def test_everything_changed_round_trips() -> None:
    gen = torch.Generator().manual_seed(3)
    base = random_bits(torch.float32, 4096, gen)
    new = (base.view(torch.int32) ^ 1).view(torch.float32)
    for prefer in DELTA_PREFERENCES:
        patch = encode_delta(new, base, prefer=prefer)
        assert patch.changed == 4096
        target = base.clone()
        apply_delta(patch, target)
        assert bits(target) == bits(new)
    # XOR of a one-bit change everywhere is one repeated value: xor beats sparse and full.
    assert encode_delta(new, base).kind == "xor"


@pytest.mark.parametrize("shape", [(0,), (3, 0, 2), (), (1,), (7, 5, 3)])
def test_shapes_are_read_flat(shape: tuple[int, ...]) -> None:
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(shape, generator=gen).to(torch.bfloat16)
    new = base.clone() + 1 if base.numel() else base.clone()
    for with_base in (True, False):
        patch = encode_delta(new, base if with_base else None)
        target = base.clone()
        apply_delta(patch, target)
        assert target.shape == base.shape
        assert bits(target) == bits(new)
    target = base.reshape(-1).clone()  # any shape of the same numel
    apply_delta(encode_delta(new, base), target)
    assert bits(target) == bits(new)


def test_adam_like_step_is_40_times_smaller_than_bf16() -> None:
    """2% of bf16 values moved by one or two ulps (what an lr 1e-6 AdamW step does)."""
    gen = torch.Generator().manual_seed(0)
    base = (torch.randn(1 << 20, generator=gen) * 0.02).to(torch.bfloat16)
    new = base.clone()
    ints = new.view(torch.int16)
    mask = torch.rand(base.numel(), generator=gen) < 0.02
    steps = torch.randint(1, 3, (base.numel(),), generator=gen, dtype=torch.int16)
    ints[mask] += steps[mask]
    patch = encode_delta(new, base)
    assert patch.kind == "sparse"
    assert patch.codec == "zstd"
    assert patch.wire_nbytes * 40 <= new.nbytes
    dense = encode_delta(new, base, prefer="full")
    assert patch.wire_nbytes * 10 < dense.wire_nbytes
    target = base.clone()
    apply_delta(patch, target)
    assert bits(target) == bits(new)


def test_wide_gaps_are_escaped() -> None:
    """Gaps of 255 elements and more travel in the wide stream."""
    base = torch.zeros(200_000, dtype=torch.int32)
    new = base.clone()
    positions = [0, 254, 255 + 254 + 1, 100_000, 199_999]
    new[positions] = torch.tensor([1, -1, 7, 2**31 - 1, -(2**31)], dtype=torch.int32)
    for codec in DELTA_CODECS:
        patch = encode_delta(new, base, codec=codec)
        assert patch.kind == "sparse"
        assert patch.changed == len(positions)
        target = base.clone()
        apply_delta(patch, target)
        assert bits(target) == bits(new)


@pytest.mark.parametrize("itemsize", [1, 2, 4, 8])
def test_the_sparse_body_keeps_its_documented_layout(itemsize: int) -> None:
    """Scan, body and decode against the format's own words, over several scan chunks.

    The planes hold byte ``j`` of every change's zigzag code, plane by plane (the
    strided copy ``codes.reshape(c, s).T``), then a byte per gap, then the escaped gaps:
    however the body is built and read, its bytes stay these.
    """
    from p2p_compress._delta import _sparse

    rng = np.random.default_rng(itemsize)
    u = np.dtype(f"uint{8 * itemsize}")
    n = 2 * _sparse.SCAN_CHUNK + 12_345  # changes in three chunks, the last one short
    base = rng.integers(0, np.iinfo(u).max, n, dtype=u, endpoint=True)
    new = base.copy()
    changed = np.flatnonzero(rng.random(n) < 0.2)
    changed = np.union1d(changed, [n - 1])  # the very last element too
    new[changed] += rng.integers(1, 5, changed.size).astype(u)
    new[changed[::7]] -= 9  # some go down: negative differences wrap
    count, found = _sparse.scan(new, base, n)
    assert found is not None
    assert count == changed.size
    pos, diff = found
    assert np.array_equal(pos, changed)
    assert np.array_equal(diff, new[changed] - base[changed])
    gaps = _sparse.gaps_of(pos)
    nbig = int(np.count_nonzero(gaps >= 255))
    body = torch.empty(_sparse.body_size(itemsize, count, nbig, n), dtype=torch.uint8)
    _sparse.write_body(diff, gaps, body)
    signed = diff.view({1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}[itemsize])
    codes = ((signed << 1) ^ (signed >> (8 * itemsize - 1))).view(np.uint8)
    planes = codes.reshape(count, itemsize).T.reshape(-1)  # the documented layout
    got = body.numpy()
    assert np.array_equal(got[: itemsize * count], planes)
    assert np.array_equal(got[itemsize * count : (itemsize + 1) * count], np.minimum(gaps, 255))
    back_pos, back_diff = _sparse.read_body(body, count, n, itemsize)
    assert np.array_equal(back_pos, pos)
    assert np.array_equal(back_diff, diff)
    assert _sparse.scan(new, base, count - 1) == (count, None)  # too many: only counted
    assert _sparse.scan(new, base, -1) == (count, None)


def test_patch_owns_its_payload() -> None:
    base = torch.zeros(1000, dtype=torch.float32)
    new = torch.ones(1000)
    pool = TensorBufferPool(max_bytes=1 << 20)
    for with_base in (base, None):
        patch = encode_delta(new, with_base, codec="raw", pool=pool)
        before = patch.payload.clone()
        new.add_(1)  # the caller reuses its tensors
        pool.acquire(10_000)  # and the pool hands its buffers out again
        assert torch.equal(patch.payload, before)
        assert patch.payload.untyped_storage().nbytes() == patch.wire_nbytes


def test_pool_buffers_are_returned_and_results_equal() -> None:
    gen = torch.Generator().manual_seed(5)
    base = random_bits(torch.bfloat16, 50_000, gen)
    pool = TensorBufferPool(max_bytes=1 << 22)
    for frac in (0.02, 0.7, 1.0):
        new = changed_copy(base, frac, True, gen)
        plain = encode_delta(new, base)
        pooled = encode_delta(new, base, pool=pool)
        assert pooled == plain
        assert pool.stats()["active_bytes"] == 0
        target = base.clone()
        apply_delta(pooled, target, pool=pool)
        assert pool.stats()["active_bytes"] == 0
        assert bits(target) == bits(new)
    assert pool.stats()["cached_bytes"] > 0  # the scratch was reused, not leaked


def test_lz4_and_raw_codecs_stay_what_they_say() -> None:
    gen = torch.Generator().manual_seed(2)
    base = random_bits(torch.bfloat16, 100_000, gen)
    new = changed_copy(base, 0.02, True, gen)
    raw = encode_delta(new, base, codec="raw")
    lz4 = encode_delta(new, base, codec="lz4")
    zstd = encode_delta(new, base, codec="zstd")
    assert (raw.kind, raw.codec) == ("sparse", "raw")
    # raw sparse: (itemsize + 1) bytes per change, plus 4 per escaped gap
    assert 3 * raw.changed + HEADER <= raw.wire_nbytes < 3.2 * raw.changed + HEADER
    assert lz4.codec == "lz4"
    assert zstd.codec == "zstd"
    assert zstd.wire_nbytes < lz4.wire_nbytes < raw.wire_nbytes


def test_slices_of_a_bucket_work_in_place() -> None:
    """Tensors that are views into one flat bucket (at odd offsets) encode and apply."""
    gen = torch.Generator().manual_seed(9)
    bucket_old = random_bits(torch.bfloat16, 30_001, gen)
    bucket_new = changed_copy(bucket_old, 0.05, True, gen)
    target = bucket_old.clone()
    for start, stop in ((1, 10_000), (10_000, 10_003), (10_003, 30_001)):
        for prefer in DELTA_PREFERENCES:
            patch = encode_delta(bucket_new[start:stop], bucket_old[start:stop], prefer=prefer)
            view = target[start:stop]
            view.copy_(bucket_old[start:stop])
            apply_delta(patch, view)
            assert bits(view) == bits(bucket_new[start:stop])
    assert bits(target[:1]) == bits(bucket_old[:1])  # nothing outside the views moved
    assert tensor_checksum(target[1:]) == tensor_checksum(bucket_new[1:])


def test_changes_crowded_in_a_later_chunk_switch_to_a_dense_kind() -> None:
    """Few changes in the first 100K elements, most after: the scan gives up sparse."""
    gen = torch.Generator().manual_seed(12)
    base = random_bits(torch.float16, 700_000, gen)
    new = base.clone()
    new[:100_000] = changed_copy(base[:100_000], 0.01, True, gen)
    new[100_000:] = changed_copy(base[100_000:], 0.95, True, gen)
    for codec in DELTA_CODECS:
        for prefer in ("smallest", "fast"):
            patch = encode_delta(new, base, codec=codec, prefer=prefer)
            assert patch.kind == ("full" if codec == "raw" else "xor")
            assert patch.changed == true_changed(new, base)
            target = base.clone()
            apply_delta(patch, target)
            assert bits(target) == bits(new)
    spread = changed_copy(base, 0.02, True, gen)  # a few changes in every chunk
    patch = encode_delta(spread, base)
    assert patch.kind == "sparse"
    assert patch.changed == true_changed(spread, base)
    target = base.clone()
    apply_delta(patch, target)
    assert bits(target) == bits(spread)


def _split(t: torch.Tensor, cuts: list[int]) -> list[torch.Tensor]:
    """Copies of ``t``'s runs between the cuts (each its own tensor, as a bucket's pieces)."""
    edges = [0, *cuts, t.numel()]
    return [t[a:b].clone() for a, b in itertools.pairwise(edges)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.uint8])
@pytest.mark.parametrize("frac", [0.0, 0.02, 0.4, 0.95])
def test_a_patch_applies_to_pieces_as_to_their_concatenation(
    dtype: torch.dtype, frac: float
) -> None:
    """Pieces in several tensors (odd cuts, an empty piece) end up as one target would,
    for every kind and codec; nothing outside the pieces is written."""
    gen = torch.Generator().manual_seed(21)
    n = 70_001
    base = random_bits(dtype, n, gen)
    new = changed_copy(base, frac, True, gen)
    cuts = [1, 3, 3, 20_000, 65_537]
    kinds = set()
    for codec in DELTA_CODECS:
        for prefer in DELTA_PREFERENCES:
            patch = encode_delta(new, base, codec=codec, prefer=prefer)
            kinds.add(patch.kind)
            pieces = _split(base, cuts)
            apply_delta(patch, pieces)
            assert bits(torch.cat(pieces)) == bits(new), (codec, prefer, patch.kind)
            assert tensor_checksum(pieces) == tensor_checksum(new)
            assert [p.numel() for p in pieces] == [1, 2, 0, 19_997, 45_537, 4_464]
    assert "full" in kinds
    assert frac > 0.5 or "sparse" in kinds


def test_checksum_of_pieces_equals_the_checksum_of_their_bytes_end_to_end() -> None:
    """Cuts inside words, at and across chunk edges, mixed dtypes, empty pieces."""
    gen = torch.Generator().manual_seed(22)
    chunk = 8 * (1 << 15)
    data = torch.randint(0, 256, (3 * chunk + 13,), dtype=torch.uint8, generator=gen)
    whole = tensor_checksum(data)
    for cuts in (
        [],
        [5],
        [chunk],
        [chunk - 3, chunk + 5],
        [7, 7, 2 * chunk + 1],
        list(range(1000, 3 * chunk, 40_001)),
    ):
        assert tensor_checksum(_split(data, cuts)) == whole, cuts
        assert tensor_checksum(tuple(_split(data, cuts))) == whole, cuts
    mixed = [data[:8].view(torch.float64).clone(), data[8:14].view(torch.bfloat16).clone()]
    mixed.append(data[14:].clone())
    assert tensor_checksum(mixed) == whole
    assert tensor_checksum([]) == tensor_checksum(torch.empty(0))
    assert tensor_checksum(_split(data, [100])) != tensor_checksum(_split(data[1:], [99]))
