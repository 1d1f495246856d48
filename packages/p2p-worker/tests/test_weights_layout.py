"""Weight sync's pure parts: buckets, tied tensors, the relay tree, messages, errors, slots."""

from __future__ import annotations

import pickle
import time

import pytest
import torch

from p2p_collective import CollectiveTimeoutError, FramingError
from p2p_compress import apply_delta, encode_delta, tensor_checksum
from p2p_worker import WeightSyncError
from p2p_worker._weights import _messages as m
from p2p_worker._weights._layout import (
    Entry,
    Layout,
    auto_bucket_bytes,
    gather,
    named_tensors,
    pieces,
    scatter,
    target_entries,
)
from p2p_worker._weights._pipeline import BucketPools, Slots
from p2p_worker._weights._topology import build_tree


def test_the_automatic_bucket_size_cuts_a_model_into_about_16_buckets() -> None:
    # ~1 GB of bf16 (Qwen2.5-0.5B's size): 32 MiB buckets, the cap.
    big = [
        Entry("embed", (151_936, 896), "torch.bfloat16"),
        Entry("w", (360_000_000,), "torch.bfloat16"),
    ]
    assert auto_bucket_bytes(big) == 32 << 20
    assert len(Layout.build(big, auto_bucket_bytes(big)).buckets) == 30
    # 10 MB of bf16 (a small model): 2 MiB buckets, five of them (smaller ones cost more
    # in per-bucket work than a longer pipeline saves)
    small = [Entry("a", (5_000_000,), "torch.bfloat16")]
    assert auto_bucket_bytes(small) == 2 << 20
    assert len(Layout.build(small, auto_bucket_bytes(small)).buckets) == 5
    # the bounds: never under 2 MiB, never over 32 MiB, whatever the size
    assert auto_bucket_bytes([Entry("t", (3,), "torch.float32")]) == 2 << 20
    assert auto_bucket_bytes([Entry("h", (1 << 34,), "torch.float32")]) == 32 << 20
    assert auto_bucket_bytes([Entry("m", (40 << 20,), "torch.float32")]) == 8 << 20
    assert auto_bucket_bytes([Entry("n", (16 << 20,), "torch.float32")]) == 4 << 20
    assert auto_bucket_bytes([Entry("p", (8 << 20,), "torch.float32")]) == 2 << 20


def test_a_relay_across_a_network_takes_smaller_buckets_about_32_per_model() -> None:
    # across nodes a hop costs a bucket's wire time: the same 10 MB in 512 KiB buckets
    small = [Entry("a", (5_000_000,), "torch.bfloat16")]
    assert auto_bucket_bytes(small, network=True) == 512 << 10
    assert len(Layout.build(small, auto_bucket_bytes(small, network=True)).buckets) == 20
    # a 1 GB model: 16 MiB buckets (60 of them); the cap stays 32 MiB
    big = [Entry("w", (500_000_000,), "torch.bfloat16")]
    assert auto_bucket_bytes(big, network=True) == 16 << 20
    assert auto_bucket_bytes([Entry("h", (1 << 34,), "torch.float32")], network=True) == 32 << 20
    assert auto_bucket_bytes([Entry("m", (40 << 20,), "torch.float32")], network=True) == 4 << 20
    # the floor: never under 512 KiB
    assert auto_bucket_bytes([Entry("t", (3,), "torch.float32")], network=True) == 512 << 10


def test_targets_that_all_read_the_sources_arena_take_about_4_buckets_per_model() -> None:
    # no hop at all: the source's preparing overlaps the targets' copying, so few buckets
    rl = [Entry("a", (5_000_000,), "torch.float32")]  # 20 MB: four 4 MiB buckets and a rest
    assert auto_bucket_bytes(rl, shared=True) == 4 << 20
    assert len(Layout.build(rl, auto_bucket_bytes(rl, shared=True)).buckets) == 5
    # the same bounds as on one node: at least 2 MiB, at most 32 MiB (a 1 GB model keeps
    # its 32 MiB buckets)
    assert auto_bucket_bytes([Entry("t", (3,), "torch.float32")], shared=True) == 2 << 20
    assert auto_bucket_bytes([Entry("w", (500_000_000,), "torch.bfloat16")], shared=True) == (
        32 << 20
    )
    # a network wins: some target not on the source's node means relay buckets
    assert auto_bucket_bytes(rl, network=True, shared=True) == 512 << 10


def test_a_delta_sync_across_a_network_takes_about_4_buckets_per_model() -> None:
    # after the first push most buckets are small deltas: per-bucket work, not wire time
    small = [Entry("a", (5_000_000,), "torch.bfloat16")]  # 10 MB: four of 2 MiB and a rest
    assert auto_bucket_bytes(small, network=True, delta=True) == 2 << 20
    assert len(Layout.build(small, auto_bucket_bytes(small, network=True, delta=True)).buckets) == 5
    # the bounds: at least 2 MiB, at most 32 MiB (a 1 GB model: 32 MiB, 16 without delta)
    assert auto_bucket_bytes([Entry("t", (3,), "torch.float32")], network=True, delta=True) == (
        2 << 20
    )
    big = [Entry("w", (500_000_000,), "torch.bfloat16")]
    assert auto_bucket_bytes(big, network=True, delta=True) == 32 << 20
    assert auto_bucket_bytes(big, network=True) == 16 << 20
    # on one node a delta base changes nothing
    assert auto_bucket_bytes(small, delta=True) == auto_bucket_bytes(small)
    assert auto_bucket_bytes(small, shared=True, delta=True) == auto_bucket_bytes(
        small, shared=True
    )


def test_buckets_split_large_tensors_keep_dtypes_apart_and_cover_every_value() -> None:
    entries = [
        Entry("a", (3000,), "torch.bfloat16"),  # 6000 bytes: spans two 4 KiB buckets
        Entry("n", (10,), "torch.float32"),
        Entry("b", (100,), "torch.bfloat16"),
        Entry("f", (50,), "torch.bfloat16"),
    ]
    layout = Layout.build(entries, 4096, frozen={"f"})
    assert all(b.nbytes <= 4096 for b in layout.buckets)
    seen: dict[int, int] = {}
    for b in layout.buckets:
        assert len({entries[s.entry].dtype for s in b.segments}) == 1
        assert b.frozen == all(entries[s.entry].key == "f" for s in b.segments)
        assert sum(s.count for s in b.segments) == b.numel
        for s in b.segments:
            seen[s.entry] = seen.get(s.entry, 0) + s.count
    assert seen == {0: 3000, 1: 10, 2: 100, 3: 50}
    assert Layout.build(entries, 4096, {"f"}).digest == layout.digest
    assert Layout.build(entries, 8192, {"f"}).digest != layout.digest
    with pytest.raises(ValueError, match="bucket_bytes"):
        Layout.build(entries, 10)


def test_a_layout_built_again_for_the_same_model_is_the_one_kept() -> None:
    entries = [Entry("a", (3000,), "torch.bfloat16"), Entry("n", (10,), "torch.float32")]
    layout = Layout.build(entries, 4096, frozen={"n"})
    again = Layout.build(tuple(entries), 4096, frozen=["n"])  # any sequence, any iterable
    assert again is layout
    assert Layout.build(entries, 4096) is not layout  # nothing frozen: another cut
    assert [b.frozen for b in layout.buckets] == [False, False, True]
    assert [b.frozen for b in Layout.build(entries, 4096).buckets] == [False, False, False]
    assert Layout.build(entries, 8192, {"n"}).bucket_bytes == 8192
    with pytest.raises(TypeError, match="bucket_bytes"):  # refused before the kept ones
        Layout.build(entries, 4096.0)  # type: ignore[arg-type]
    assert Layout.build(entries, 4096, {"n"}) is layout  # and they are still there


def test_gather_casts_and_scatter_writes_in_place() -> None:
    src = {"w": torch.randn(40, 30), "v": torch.randn(7)}  # fp32 masters
    dst = {
        "w": torch.zeros(40, 30, dtype=torch.bfloat16),
        "v": torch.zeros(7, dtype=torch.bfloat16),
    }
    entries, keys = target_entries(dst, "model")
    layout = Layout.build(entries, 1024)
    own = [dst[k] for k in keys]
    ptr = dst["w"].data_ptr()
    for b in layout.buckets:
        buf = gather(b, [src[k] for k in keys], torch.empty(b.numel, dtype=b.dtype))
        scatter(b, buf, own)
    assert dst["w"].data_ptr() == ptr
    assert torch.equal(dst["w"], src["w"].to(torch.bfloat16))
    assert torch.equal(dst["v"], src["v"].to(torch.bfloat16))


def test_a_delta_applies_in_place_through_a_buckets_pieces() -> None:
    """A bucket spanning tensors: its pieces are views of them, patched and checked in
    place, the same bits and checksum as the gathered bucket, nothing else written."""
    gen = torch.Generator().manual_seed(3)
    old = {
        k: torch.randn(n, generator=gen).to(torch.bfloat16) for k, n in [("a", 1301), ("b", 777)]
    }
    new = {k: v.clone() for k, v in old.items()}
    new["a"][5::17] += 1
    new["b"][::3] = 0.5
    entries, keys = target_entries(old, "model")
    layout = Layout.build(entries, 1024)  # 512 values a bucket: one spans both tensors
    spanning = [b for b in layout.buckets if len({s.entry for s in b.segments}) > 1]
    assert spanning
    own = {k: v.clone() for k, v in old.items()}
    mine = [own[k] for k in keys]
    ptrs = [t.data_ptr() for t in mine]
    for b in layout.buckets:
        parts = pieces(b, mine)
        assert [p.numel() for p in parts] == [s.count for s in b.segments]
        want = gather(b, [new[k] for k in keys], torch.empty(b.numel, dtype=b.dtype))
        base = gather(b, [old[k] for k in keys], torch.empty(b.numel, dtype=b.dtype))
        apply_delta(encode_delta(want, base), parts)
        assert tensor_checksum(parts) == tensor_checksum(want)
    assert [t.data_ptr() for t in mine] == ptrs
    for k in keys:
        assert torch.equal(own[k].view(torch.int16), new[k].view(torch.int16))


def test_tied_tensors_travel_once_and_frozen_parameters_are_named() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(10, 4)
            self.head = torch.nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight
            self.pos = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
            self.register_buffer("count", torch.zeros(2, dtype=torch.int64))

    tensors, frozen = named_tensors(Tied(), "model")
    assert list(tensors) == ["pos", "count", "embed.weight", "head.weight"]
    assert frozen == {"pos"}
    entries, keys = target_entries(tensors, "model")
    assert keys == ["pos", "count", "embed.weight"]  # the head is the embedding
    assert entries[1] == Entry("count", (2,), "torch.int64")


def test_bad_models_are_refused_by_name() -> None:
    with pytest.raises(TypeError, match="model"):
        named_tensors([torch.zeros(2)], "model")
    with pytest.raises(TypeError, match=r"model\['x'\]"):
        named_tensors({"x": 3}, "model")
    with pytest.raises(ValueError, match=r"model\['t'\].*contiguous"):
        target_entries({"t": torch.zeros(4, 4).t()}, "model")


def test_relay_is_a_chain_or_tree_ordered_by_node_then_staleness() -> None:
    targets = [("r:3", 1, 0), ("r:0", 0, 5), ("r:1", 0, 0), ("r:2", 1, 0)]
    chain = build_tree("t:0", targets, 1)
    assert chain.order == ("r:1", "r:0", "r:2", "r:3")
    assert [chain.parent[n] for n in chain.order] == ["t:0", "r:1", "r:0", "r:2"]
    assert chain.ancestors("r:3") == ["r:2", "r:0", "r:1", "t:0"]
    tree = build_tree("t:0", targets, 2)
    assert tree.children("r:1") == ["r:0", "r:2"]
    assert tree.children("r:0") == ["r:3"]
    assert tree.children("t:0") == ["r:1"]  # the source sends every byte once
    with pytest.raises(ValueError, match="fanout"):
        build_tree("t:0", targets, 0)


def test_with_lending_each_node_has_one_relayed_entry_and_the_rest_read_from_it() -> None:
    targets = [("r:3", 1, 0), ("r:0", 0, 5), ("r:1", 0, 0), ("r:2", 1, 0), ("r:4", 2, 0)]
    # the source on node 0: its node's targets are its lent leaves; node 1 and 2 relayed
    tree = build_tree("t:0", targets, 1, lend=True, source_node=0)
    assert tree.order == ("r:1", "r:0", "r:2", "r:3", "r:4")
    assert tree.lent == ("r:1", "r:0", "r:3")
    assert tree.children("t:0") == ["r:1", "r:0", "r:2"]
    assert tree.children("r:2") == ["r:3", "r:4"]  # its lent leaf, then the next node
    assert tree.parent["r:4"] == "r:2"
    # the source elsewhere: node 0's least stale target is the entry the others read from
    tree = build_tree("t:0", targets, 2, lend=True, source_node=9)
    assert tree.lent == ("r:0", "r:3")
    assert tree.children("t:0") == ["r:1"]
    assert tree.children("r:1") == ["r:0", "r:2", "r:4"]  # fanout 2 counts relayed ones
    assert tree.children("r:2") == ["r:3"]
    assert build_tree("t:0", targets, 1, lend=False, source_node=0).lent == ()


def test_messages_travel_as_builtin_tuples_and_a_stray_one_is_a_framing_error() -> None:
    head = m.Header(3, m.DELTA, 123, {"kind": "sparse"}, 40)
    wire = m.to_wire(head)
    assert isinstance(wire, tuple)
    assert wire[0] == "Header"
    assert m.from_wire(wire, (m.Header, m.Abort), "p", "bucket 3") == head
    with pytest.raises(FramingError, match="expected Plan from p"):
        m.from_wire(wire, (m.Plan,), "p", "plan")
    with pytest.raises(FramingError):
        m.from_wire({"not": "a message"}, (m.Header,), "p", "bucket")


def test_weight_sync_error_pickles_with_its_fields() -> None:
    err = WeightSyncError("x failed", version=4, failed={"r:1": "checksum"}, torn=True)
    err.__cause__ = RuntimeError("cause")
    again = pickle.loads(pickle.dumps(err))
    assert (again.version, again.failed, again.torn) == (4, {"r:1": "checksum"}, True)
    assert isinstance(again, RuntimeError)
    assert str(again.__cause__) == "cause"


def test_bucket_buffers_come_back_with_their_slot_and_are_reused() -> None:
    layout = Layout.build([Entry("w", (3000,), "torch.bfloat16")], 2048, set())
    pools = BucketPools(2)
    pool = pools.get(layout)
    assert pools.get(layout) is pool  # kept from one sync to the next
    assert pool.max_bytes == 2 * 2048
    slots = Slots(2, pool)
    first = slots.take(2, None, "bucket 0")  # two users: the applier and one child
    buf = first.buffer(1024, torch.bfloat16)
    assert buf.dtype == torch.bfloat16
    assert buf.numel() == 1024
    buf.fill_(1.5)
    first()
    assert pool.stats()["active_bytes"] == 2048  # one user still holds it
    first()
    assert pool.stats()["active_bytes"] == 0
    assert pool.stats()["cached_bytes"] == 2048
    second = slots.take(1, None, "bucket 1")
    again = second.buffer(1024, torch.bfloat16)
    assert again.data_ptr() == buf.data_ptr()  # the same pages, no new allocation
    assert pool.stats()["hits"] == 1
    # a third buffer is over the pool's budget: a tensor of its own, still usable
    other = slots.take(1, None, "bucket 2")
    a = other.buffer(1024, torch.bfloat16)
    b = other.buffer(1024, torch.float32)
    assert b.dtype == torch.float32
    assert b.numel() == 1024
    assert pool.stats()["active_bytes"] == 4096
    assert a.data_ptr() != again.data_ptr()
    second()
    other()
    assert pool.stats()["active_bytes"] == 0
    # a slot taken by nobody is free at once and lends nothing it could not give back
    idle = slots.take(0, None, "bucket 3")
    idle.buffer(1024, torch.bfloat16)
    assert pool.stats()["active_bytes"] == 0
    # bigger buckets (a new bucket size) get a new pool
    bigger = Layout.build([Entry("w", (3000,), "torch.bfloat16")], 4096, set())
    assert pools.get(bigger) is not pool
    assert pools.get(bigger).max_bytes == 2 * 4096


def test_a_slot_waits_for_a_free_one_until_the_deadline() -> None:
    slots = Slots(1, None)
    held = slots.take(1, None, "bucket 0")
    with pytest.raises(CollectiveTimeoutError, match="bucket 1: no bucket slot freed up"):
        slots.take(1, time.monotonic() + 0.05, "bucket 1")
    held()
    slots.take(1, time.monotonic() + 0.05, "bucket 1")()  # usable after the timeout
