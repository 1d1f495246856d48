"""Byte shuffle: exact round trips at every length and element size, and what it buys lz4."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2p_compress import Lz4Codec, make_synthetic_tensor, shuffle_bytes, unshuffle_bytes
from p2p_compress._codecs._planes import SLICE, from_planes, to_planes
from p2p_compress.internal import SHUFFLE_ITEMSIZES, shuffle_itemsize


@given(
    data=st.binary(min_size=0, max_size=300),
    itemsize=st.sampled_from(SHUFFLE_ITEMSIZES),
)
@settings(max_examples=200, deadline=None)
def test_unshuffle_restores_every_byte_of_any_length(data: bytes, itemsize: int) -> None:
    src = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )
    planes = torch.empty(len(data), dtype=torch.uint8)
    back = torch.empty(len(data), dtype=torch.uint8)
    shuffle_bytes(src, planes, itemsize)
    unshuffle_bytes(planes, back, itemsize)
    assert bytes(back.numpy()) == data
    body = len(data) // itemsize * itemsize
    assert bytes(planes[body:].numpy()) == data[body:]  # a partial element stays as it is


def test_planes_hold_each_byte_position_in_turn() -> None:
    src = torch.tensor([0x0102, 0x0304, 0x0506], dtype=torch.int16).view(torch.uint8)
    planes = torch.empty(6, dtype=torch.uint8)
    shuffle_bytes(src, planes, 2)
    assert planes.tolist() == [0x02, 0x04, 0x06, 0x01, 0x03, 0x05]


def test_lz4_shrinks_shuffled_int64_token_ids_about_twice_as_much() -> None:
    ids = make_synthetic_tensor("int64_token_ids", 1 << 20, seed=3).view(torch.uint8)
    codec = Lz4Codec()
    bound = codec.max_compressed_size(ids.numel())
    assert bound is not None
    out = torch.empty(bound, dtype=torch.uint8)
    plain = ids.numel() / codec.compress_into(ids, out)
    planes = torch.empty_like(ids)
    shuffle_bytes(ids, planes, 8)
    shuffled = ids.numel() / codec.compress_into(planes, out)
    assert 1.8 < plain < 2.1
    assert shuffled > 3.5


@pytest.mark.parametrize(
    ("args", "error", "says"),
    [
        ((b"x", 2), TypeError, "src must be a torch.Tensor, got bytes"),
        ((torch.zeros(4, dtype=torch.int32), 2), ValueError, "src must be a flat contiguous"),
        (
            (torch.zeros(8, dtype=torch.uint8), 3),
            ValueError,
            r"itemsize must be one of \[2, 4, 8\]",
        ),
        ((torch.zeros(8, dtype=torch.uint8), 2, 4), ValueError, "dst holds 4 bytes, src has 8"),
    ],
    ids=["not-a-tensor", "not-uint8", "itemsize", "dst-short"],
)
def test_bad_arguments_are_named(args: tuple[object, ...], error: type, says: str) -> None:
    src, itemsize = args[0], args[1]
    dst = torch.empty(args[2] if len(args) > 2 else 8, dtype=torch.uint8)  # type: ignore[misc]
    for fn in (shuffle_bytes, unshuffle_bytes):
        with pytest.raises(error, match=says):
            fn(src, dst, itemsize)  # type: ignore[arg-type]


def test_the_sample_decides_which_tensors_are_shuffled() -> None:
    def flat(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(-1).view(torch.uint8)

    ids = make_synthetic_tensor("int64_token_ids", 64 * 1024)
    assert shuffle_itemsize(torch.int64, flat(ids)) == 8
    runs = make_synthetic_tensor("repeated", 64 * 1024)
    assert shuffle_itemsize(torch.float32, flat(runs)) == 0  # runs of elements: plain
    assert shuffle_itemsize(torch.uint8, flat(ids)) == 0  # one byte: nothing to regroup
    assert shuffle_itemsize(torch.int64, flat(ids)[:512]) == 0  # too short to judge


@pytest.mark.parametrize("itemsize", [2, 4, 8])
@pytest.mark.parametrize("count", [1, 1000, SLICE, 2 * SLICE + 123])
def test_byte_planes_match_the_strided_copy_across_slices(itemsize: int, count: int) -> None:
    rng = np.random.default_rng(count + itemsize)
    elements = rng.integers(0, 256, count * itemsize, dtype=np.uint8)
    reference = np.ascontiguousarray(elements.reshape(-1, itemsize).T)
    # rows of a larger body, as a patch's piece sees them: strided, not contiguous
    body = np.zeros((itemsize, count + 7), dtype=np.uint8)
    rows = body[:, 3 : 3 + count]
    to_planes(elements, rows)
    assert np.array_equal(rows, reference)
    assert not body[:, :3].any()  # nothing beside the rows is written
    assert not body[:, 3 + count :].any()
    back = np.empty_like(elements)
    from_planes(rows, back)
    assert np.array_equal(back, elements)
    base = rng.integers(0, 256, count * itemsize, dtype=np.uint8)
    mixed = base.copy()
    from_planes(rows, mixed, xor=True)
    assert np.array_equal(mixed, base ^ elements)


def test_byte_planes_refuse_shapes_that_do_not_fit_by_name() -> None:
    planes = np.zeros((2, 4), dtype=np.uint8)
    with pytest.raises(ValueError, match=r"elements must be a contiguous \(8,\) uint8 array"):
        to_planes(np.zeros(6, dtype=np.uint8), planes)
    with pytest.raises(ValueError, match=r"planes must be a \(2, 4 or 8, n\) uint8 array"):
        from_planes(np.zeros((3, 4), dtype=np.uint8), np.zeros(12, dtype=np.uint8))
    out = np.zeros(8, dtype=np.uint8)
    from_planes(np.array([[1, 2, 3, 4], [0, 0, 0, 1]], dtype=np.uint8), out)  # still works
    assert out.view("<u2").tolist() == [1, 2, 3, 260]
