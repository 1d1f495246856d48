"""N-member object broadcasts carry the pair frame: magic, version, sequence, metadata."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import pytest
import torch

from p2p_collective import FramingError, ObjectRefusedError
from p2p_collective._frames._framing import FRAME_VERSION, MAGIC
from p2p_collective._groups._multi_frames import OBJ_HEADER, Incoming, encode_object, read_head


@dataclasses.dataclass
class _State:
    step: int
    weights: torch.Tensor


def _round_trip(obj: object, seq: int = 0, policy: str = "pickle") -> object:
    """What a receiving member rebuilds from the messages the broadcaster sends."""
    msgs = encode_object(obj, "broadcast(obj)").messages(seq)
    head = msgs[0].clone()
    assert head.numel() == OBJ_HEADER
    hdr, rest_len = read_head(head, seq, "t")
    rest = msgs[1].clone() if rest_len else None
    if rest is not None:
        assert rest.numel() == rest_len
    incoming = Incoming(hdr, head, rest, "t")
    sent = msgs[2:] if rest_len else msgs[1:]
    assert len(sent) == len(incoming.views)
    for view, msg in zip(incoming.views, sent, strict=True):
        view.copy_(msg)
    return incoming.rebuild(policy, ())


def test_a_head_round_trips_with_inline_or_separate_metadata() -> None:
    head = encode_object({"k": 1}, "b").messages(7)[0]
    assert bytes(head[:4].tolist()) == MAGIC
    assert head[4].item() == FRAME_VERSION
    assert _round_trip({"k": 1}, 7) == {"k": 1}
    big = {"blob": "L" * 5000}  # the frame is longer than the head message
    assert len(encode_object(big, "b").messages(0)) == 2
    assert _round_trip(big) == big


def test_every_payload_kind_of_a_pair_send_round_trips() -> None:
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    assert torch.equal(_round_trip(t), t)  # type: ignore[arg-type]
    got = _round_trip([t, t + 1])
    assert isinstance(got, list)
    assert torch.equal(got[1], t + 1)
    assert isinstance(_round_trip((t,)), tuple)
    od = _round_trip(OrderedDict([("b", t), ("a", t * 2)]))
    assert isinstance(od, OrderedDict)
    assert list(od) == ["b", "a"]
    assert torch.equal(_round_trip({1: t})[1], t)  # type: ignore[index]
    state = _round_trip(_State(3, t))
    assert isinstance(state, _State)
    assert state.step == 3
    assert torch.equal(state.weights, t)
    assert _round_trip(torch.empty(0)).numel() == 0  # type: ignore[attr-defined]


def test_a_refused_object_is_refused_after_its_tensors_are_taken() -> None:
    with pytest.raises(ObjectRefusedError):
        _round_trip(_State(1, torch.ones(2)), policy="plain")


def test_bad_payloads_are_refused_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match=r"payload\[1\].*not contiguous"):
        encode_object([torch.ones(2), torch.ones(4, 4).t()], "broadcast(obj)")


def test_a_head_out_of_step_is_a_framing_error_naming_both_numbers() -> None:
    head = encode_object(b"x", "b").messages(3)[0]
    with pytest.raises(FramingError, match=r"number 3 .* where number 2 was expected"):
        read_head(head, 2, "coll[g]: broadcast(obj) from 'a'")


def test_a_message_that_is_no_head_is_a_framing_error() -> None:
    junk = torch.arange(OBJ_HEADER, dtype=torch.int64).to(torch.uint8)
    with pytest.raises(FramingError, match="not an object broadcast head"):
        read_head(junk, 0, "coll[g]")
    old = encode_object(b"x", "b").messages(0)[0]
    old[4] = FRAME_VERSION - 1  # a member on another protocol version
    with pytest.raises(FramingError, match=f"version {FRAME_VERSION - 1}"):
        read_head(old, 0, "coll[g]")
