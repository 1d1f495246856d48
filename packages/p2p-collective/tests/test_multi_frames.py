"""N-member object broadcasts carry a frame head: magic, version, sequence, length."""

from __future__ import annotations

import pytest
import torch

from p2p_collective import FramingError
from p2p_collective._framing import FRAME_VERSION, MAGIC
from p2p_collective._multi_ops import OBJ_HEADER, header_for, inline_meta, meta_length


def test_a_head_round_trips_with_inline_or_separate_metadata() -> None:
    small, large = b"m" * 100, b"L" * 5000
    head = header_for(small, 7)
    assert head.numel() == OBJ_HEADER
    assert bytes(head[:4].tolist()) == MAGIC
    assert head[4].item() == FRAME_VERSION
    assert meta_length(head, 7, "t") == 100
    assert inline_meta(head, 100) == small
    head = header_for(large, 0)
    assert meta_length(head, 0, "t") == 5000
    assert inline_meta(head, 5000) is None  # travels as a second message


def test_a_head_out_of_step_is_a_framing_error_naming_both_numbers() -> None:
    head = header_for(b"x", 3)
    with pytest.raises(FramingError, match=r"number 3 .* where number 2 was expected"):
        meta_length(head, 2, "coll[g]: broadcast(obj) from 'a'")


def test_a_message_that_is_no_head_is_a_framing_error() -> None:
    junk = torch.arange(OBJ_HEADER, dtype=torch.int64).to(torch.uint8)
    with pytest.raises(FramingError, match="not an object broadcast head"):
        meta_length(junk, 0, "coll[g]")
    old = header_for(b"x", 0)
    old[4] = FRAME_VERSION - 1  # a member on another protocol version
    with pytest.raises(FramingError, match=f"version {FRAME_VERSION - 1}"):
        meta_length(old, 0, "coll[g]")
