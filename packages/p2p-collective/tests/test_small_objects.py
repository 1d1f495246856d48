"""The small-object path: one pickling, one message, read back without metadata parsing.

A loopback link stands in for the transport (in-process), so these checks look at the
exact bytes each frame puts on the wire; the two-process tests in
test_collective_sendrecv.py cover the same payloads over real gloo.
"""

from __future__ import annotations

import dataclasses
import datetime
import pickle
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from p2p_collective import (
    HEADER_MAX,
    Collective,
    CollectiveGroup,
    FramingError,
    parse_collective_config,
)
from p2p_collective._frames._framing import FIXED, Flag, Kind, parse_fixed
from p2p_collective._frames._payload import (
    SMALL_OBJECT_MAX,
    encode,
    encode_small,
    encode_small_tensor,
)
from p2p_collective._frames._tensor_pickle import dumps


class LoopLink:
    """A link whose receive returns what was last sent (one message at a time)."""

    peer = "b"
    transport = "loop"
    transport_reason = "in-process test link"

    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []

    def send(self, t: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        self.sent.append(t.clone())

    def recv(self, t: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        msg = self.sent.pop(0)
        t[: msg.numel()].copy_(msg)

    def post_recv(self, t: torch.Tensor) -> torch.Tensor:
        return t  # filled when waited: in-process, the peer's send may come later

    def wait_recv(self, posted: torch.Tensor, deadline: float | None) -> None:
        self.recv(posted, deadline)

    def set_on_gone(self, fn: Any) -> None:
        pass

    def stats(self) -> dict[str, str | None]:
        return {"transport": self.transport, "transport_reason": self.transport_reason}

    def close(self) -> None:
        pass


@pytest.fixture
def looped(request: pytest.FixtureRequest) -> Iterator[tuple[CollectiveGroup, LoopLink]]:
    store = dist.TCPStore(
        "127.0.0.1", 0, 1, True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10)
    )
    config = getattr(request, "param", None)  # a CollectiveConfig, through indirect=True
    coll = Collective("a", store, timeout=10.0, config=config)
    group = coll.create_collective_group(["a", "b"])
    link = LoopLink()
    group._send.link = link  # type: ignore[assignment]
    group._recv.link = link  # type: ignore[assignment]
    yield group, link
    group._send.link = group._recv.link = None
    coll.close()


@dataclasses.dataclass
class Plain:
    step: int
    note: str


PLAIN_OBJECTS = [
    {"step": 12345, "loss": 0.03125, "lr": 3e-4, "done": False, "tag": "rollout-7"},
    [1, "two", 3.0],
    ("a", None),
    {},
    [],
    Plain(3, "x"),
    "x" * 1000,
    [torch.ones(2), 5],  # a list mixing tensors and other values is a pickled object
]


def has_tensor(obj: Any) -> bool:
    return isinstance(obj, list) and any(isinstance(x, torch.Tensor) for x in obj)


@pytest.mark.parametrize("obj", PLAIN_OBJECTS, ids=lambda o: type(o).__name__)
def test_a_plain_object_is_one_message_of_header_plus_pickle(
    looped: tuple[CollectiveGroup, LoopLink], obj: Any
) -> None:
    group, link = looped
    group.send(obj)
    assert len(link.sent) == 1
    msg = link.sent[0]
    data = dumps(obj)  # pickle, with plain tensors inside as their raw bytes
    assert data == pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) or has_tensor(obj)
    assert msg.numel() == FIXED.size + len(data)
    hdr = parse_fixed(msg.numpy().data, 0, "b")
    assert (hdr.kind, hdr.n_tensors, hdr.meta_len, hdr.obj_len) == (Kind.OBJECT, 0, 0, len(data))
    got = group.recv()
    if isinstance(obj, list) and obj and isinstance(obj[0], torch.Tensor):
        assert torch.equal(got[0], obj[0])
        assert got[1] == obj[1]
    else:
        assert got == obj
    stats = group.stats()
    assert stats["send"]["transport_messages"] == stats["recv"]["transport_messages"] == 1
    assert stats["send"]["wire_bytes"] == stats["recv"]["wire_bytes"] == msg.numel()
    assert stats["send"]["payload_bytes"] == stats["recv"]["payload_bytes"] == len(data)


def test_sequence_numbers_advance_across_small_and_framed_sends(
    looped: tuple[CollectiveGroup, LoopLink],
) -> None:
    group, link = looped
    group.send({"a": 1})
    group.send({"t": torch.arange(4)})
    group.send(7)
    assert len(link.sent) == 3  # the small tensor rides inline in its header message
    seqs = [parse_fixed(m.numpy().data, i, "b").seq for i, m in enumerate(link.sent)]
    assert seqs == [0, 1, 2]
    assert group.recv() == {"a": 1}
    assert torch.equal(group.recv()["t"], torch.arange(4))
    assert group.recv() == 7


def test_tensor_containers_are_not_small_objects() -> None:
    assert encode_small(torch.ones(2)) is None
    assert encode_small([torch.ones(2), torch.zeros(1)]) is None
    assert encode_small({"x": torch.ones(2)}) is None

    @dataclasses.dataclass
    class WithTensor:
        t: torch.Tensor
        n: int

    assert encode_small(WithTensor(torch.ones(1), 2)) is None
    small = encode_small({"x": 1})
    assert small is not None
    assert pickle.loads(small.data) == {"x": 1}


def test_a_large_object_is_pickled_once_and_framed_as_before(
    looped: tuple[CollectiveGroup, LoopLink],
) -> None:
    group, link = looped
    big = {"blob": b"\x01" * (SMALL_OBJECT_MAX + 10)}
    small = encode_small(big)
    assert small is not None
    assert len(small.data) > SMALL_OBJECT_MAX
    # The framed encoding reuses the bytes already pickled: identical to pickling again.
    again = encode(big)
    reused = encode(big, pickled=small.data)
    assert bytes(reused.view) == bytes(again.view)
    group.send(big)
    assert link.sent[0].numel() == FIXED.size  # EXT: the object travels in a second message
    assert link.sent[1].numel() == len(small.data)
    assert group.recv() == big


def test_an_unpicklable_small_object_is_refused_and_the_group_still_works(
    looped: tuple[CollectiveGroup, LoopLink],
) -> None:
    group, link = looped
    with pytest.raises(ValueError, match=r"send\(obj\).*cannot be pickled"):
        group.send({"f": lambda: 1})
    assert link.sent == []
    group.send({"ok": True})
    assert group.recv() == {"ok": True}


def test_a_small_frame_with_a_wrong_sequence_number_is_a_framing_error(
    looped: tuple[CollectiveGroup, LoopLink],
) -> None:
    group, _link = looped
    group.send("first")
    group._recv.seq = 5  # this side now expects frame 5
    with pytest.raises(FramingError, match="sequence number 0, expected 5"):
        group.recv()


def test_the_header_budget_matches_the_receive_buffer() -> None:
    assert FIXED.size + SMALL_OBJECT_MAX == HEADER_MAX


# -- a single small tensor -----------------------------------------------------------------

SMALL_TENSORS = [
    torch.arange(16, dtype=torch.float32),
    torch.arange(12, dtype=torch.int64).reshape(3, 4),
    torch.tensor([True, False, True]),
    torch.arange(8, dtype=torch.float32).to(torch.bfloat16),
    torch.tensor(3.5),  # 0-dim
    torch.empty(0, 5),  # no bytes
    torch.ones(4, requires_grad=True),
    torch.zeros(SMALL_OBJECT_MAX - 24 - 8, dtype=torch.uint8),  # exactly fills the header
]


@pytest.mark.parametrize("t", SMALL_TENSORS, ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
def test_a_small_tensor_frame_is_byte_for_byte_the_generic_one(t: torch.Tensor) -> None:
    lean = encode_small_tensor(t)
    assert lean is not None
    buf = bytearray(HEADER_MAX)
    n = lean.pack_into(memoryview(buf), 9)
    generic = bytearray(encode(t).view)
    generic[8:16] = (9).to_bytes(8, "little")  # the sequence number, patched when sent
    assert bytes(buf[:n]) == bytes(generic)


def test_a_tensor_too_large_for_the_header_takes_the_generic_path() -> None:
    assert encode_small_tensor(torch.zeros(SMALL_OBJECT_MAX - 24 - 7, dtype=torch.uint8)) is None
    assert encode_small_tensor(torch.zeros(HEADER_MAX, dtype=torch.uint8)) is None


@pytest.mark.parametrize("t", SMALL_TENSORS[:7], ids=lambda t: f"{t.dtype}{tuple(t.shape)}")
def test_a_small_tensor_is_one_message_and_arrives_whole(
    looped: tuple[CollectiveGroup, LoopLink], t: torch.Tensor
) -> None:
    group, link = looped
    group.send(t)
    assert len(link.sent) == 1
    size = link.sent[0].numel()
    got = group.recv()
    assert got.dtype == t.dtype
    assert got.shape == t.shape
    assert got.requires_grad == t.requires_grad
    assert torch.equal(got.detach(), t.detach())
    stats = group.stats()
    nbytes = t.numel() * t.element_size()
    assert stats["send"]["payload_bytes"] == stats["recv"]["payload_bytes"] == nbytes
    assert stats["send"]["wire_bytes"] == stats["recv"]["wire_bytes"] == size
    if nbytes:
        assert stats["send"]["raw_tensors"] == stats["recv"]["raw_tensors"] == 1
        assert stats["send"]["raw_reasons"] == {"disabled": 1}


def test_a_small_tensor_is_copied_when_send_is_called(
    looped: tuple[CollectiveGroup, LoopLink],
) -> None:
    group, _link = looped
    t = torch.arange(8)
    group.send(t, async_op=True).wait(timeout=10)
    t.fill_(-1)  # changing it after the call does not change what was sent
    assert torch.equal(group.recv(), torch.arange(8))
    with pytest.raises(ValueError, match=r"send\(obj\): payload is not contiguous"):
        group.send(torch.arange(8).reshape(2, 4).t())
    group.send(torch.ones(2))  # the group still works
    assert torch.equal(group.recv(), torch.ones(2))


# -- how large a frame travels inline, and min_bytes inside it --------------------------------

ZSTD = parse_collective_config({"tensor_compression": {"codec": "zstd", "excluded_dtypes": []}})
LZ4_DEFAULT = parse_collective_config({"tensor_compression": {"codec": "lz4"}})


@pytest.mark.parametrize(
    ("looped", "reason"),
    [(None, "disabled"), (ZSTD, None)],
    ids=["no-compression", "zstd"],
    indirect=["looped"],
)
def test_a_100_kib_tensor_is_one_message_and_compressed_inside_it_when_configured(
    looped: tuple[CollectiveGroup, LoopLink], reason: str | None
) -> None:
    # Frames up to HEADER_MAX (128 KiB) are one message, with or without compression;
    # with compression the eligible tensor's bytes ride there compressed.
    group, link = looped
    t = torch.zeros(100 * 1024 // 8, dtype=torch.int64)
    assert t.numel() * 8 + FIXED.size + 64 < HEADER_MAX
    group.send({"ids": t})
    assert len(link.sent) == 1
    first = link.sent[0].numel()
    got = group.recv()
    assert torch.equal(got["ids"], t)
    stats = group.stats()["send"]
    if reason is None:
        assert stats["compressed_tensors"] == 1
        assert stats["wire_bytes"] == first < t.numel()  # zstd shrinks zeros to almost nothing
    else:
        assert stats["raw_reasons"] == {reason: 1}
        assert stats["wire_bytes"] == first > t.numel() * 8


@pytest.mark.parametrize("kib", [16, 32, 60, 127])
@pytest.mark.parametrize("as_dict", [False, True], ids=["tensor", "dict"])
@pytest.mark.parametrize("looped", [LZ4_DEFAULT], ids=["lz4-defaults"], indirect=True)
def test_min_bytes_is_the_only_size_rule_for_small_frames(
    looped: tuple[CollectiveGroup, LoopLink], kib: int, as_dict: bool
) -> None:
    # Issue 21: a 32 KiB all-zero int64 tensor used to go raw ("inline") at the default
    # min_bytes of 16 KiB; every tensor of at least min_bytes is now a candidate.
    group, link = looped
    t = torch.zeros(kib * 1024 // 8, dtype=torch.int64)
    payload: Any = {"ids": t} if as_dict else t
    group.send(payload)
    assert len(link.sent) == 1  # still one message: the compressed bytes ride inline
    hdr = parse_fixed(link.sent[0].numpy().data, 0, "b")
    assert hdr.flags & Flag.INLINE
    got = group.recv()
    assert torch.equal(got["ids"] if as_dict else got, t)
    stats = group.stats()["send"]
    assert (stats["compressed_tensors"], stats["raw_reasons"]) == (1, {})
    assert stats["tensor_wire_bytes"] * 50 < t.numel() * 8
    assert group.stats()["recv"]["compressed_tensors"] == 1


@pytest.mark.parametrize("looped", [LZ4_DEFAULT], ids=["lz4-defaults"], indirect=True)
def test_below_min_bytes_excluded_and_incompressible_small_tensors_say_why(
    looped: tuple[CollectiveGroup, LoopLink],
) -> None:
    group, link = looped
    gen = torch.Generator().manual_seed(3)
    payloads = [
        torch.zeros(16 * 1024 // 8 - 1, dtype=torch.int64),  # 8 bytes under min_bytes
        torch.zeros(8 * 1024, dtype=torch.float32),  # 32 KiB, float32 excluded by default
        torch.randint(0, 256, (40 * 1024,), dtype=torch.uint8, generator=gen),  # random
        [torch.zeros(4096, dtype=torch.int64), torch.zeros(1000, dtype=torch.int64)],
    ]
    for p in payloads:
        group.send(p)
        got = group.recv()
        if isinstance(p, list):
            assert all(torch.equal(a, b) for a, b in zip(got, p, strict=True))
        else:
            assert torch.equal(got, p)
    assert len(link.sent) == 0
    stats = group.stats()["send"]
    assert stats["raw_reasons"] == {"below_min_bytes": 2, "excluded_dtype": 1, "not_smaller": 1}
    assert stats["compressed_tensors"] == 1  # the 32 KiB zeros of the list
    assert "inline" not in stats["raw_reasons"]


@pytest.mark.parametrize("looped", [ZSTD], ids=["zstd"], indirect=True)
def test_payload_frames_that_compress_into_the_header_become_one_message(
    looped: tuple[CollectiveGroup, LoopLink],
) -> None:
    group, link = looped
    # 1.5 MiB of zeros (below two chunks: compressed whole): a few hundred bytes in zstd
    t = torch.zeros(3 << 16, dtype=torch.int64)
    group.send([t, torch.arange(10)])
    assert len(link.sent) == 1
    got = group.recv()
    assert torch.equal(got[0], t)
    assert torch.equal(got[1], torch.arange(10))
    pool = group._wire.pool.stats() if group._wire is not None else None
    assert pool is not None
    assert pool["active_bytes"] == 0
