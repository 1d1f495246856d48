from __future__ import annotations

import pickle

import lz4.block
import pytest
import torch

from p2p_worker.bench._baselines import owned
from p2p_worker.bench._payloads import (
    DATA_DESCRIPTION,
    VOCAB,
    RolloutBatch,
    make_payload,
    payload_nbytes,
    payload_tensors,
    payloads_equal,
)
from p2p_worker.bench._spec import KINDS, TENSOR_KINDS
from p2p_worker.bench._timing import (
    WARMUP,
    PayloadCache,
    PayloadMismatchError,
    receiver_loop,
    sender_loop,
)

SIZE = 256 * 1024


def test_every_kind_is_described_and_built() -> None:
    assert set(DATA_DESCRIPTION) == set(KINDS)
    for kind in TENSOR_KINDS:
        p = make_payload(kind, SIZE)
        assert payload_nbytes(p) == SIZE, kind
        assert all(t.is_contiguous() for t in payload_tensors(p))
    obj = make_payload("object", SIZE)
    assert payload_tensors(obj) == []
    assert 300 < payload_nbytes(obj) == len(pickle.dumps(obj, protocol=5)) < 2000


def test_payload_structure_per_kind() -> None:
    assert isinstance(make_payload("tensor", SIZE), torch.Tensor)
    lst = make_payload("tensor_list", SIZE)
    assert isinstance(lst, list)
    assert [t.dtype for t in lst] == [torch.bfloat16] * 4
    d = make_payload("tensor_dict", SIZE)
    assert list(d) == ["input_ids", "attention_mask", "rewards"]
    assert [t.dtype for t in d.values()] == [torch.int64, torch.int64, torch.float32]
    dc = make_payload("dataclass", SIZE, seed=3)
    assert isinstance(dc, RolloutBatch)
    assert dc.step == 3
    with pytest.raises(ValueError, match="kind: got 'blob'"):
        make_payload("blob", SIZE)


def test_data_is_realistic() -> None:
    ids = make_payload("tensor", 1 << 20)
    assert ids.dtype == torch.int64
    assert ids.shape == (128, 1024)
    assert int(ids.min()) >= 0
    assert int(ids.max()) < VOCAB
    # Zipf-like: small ids are far more frequent than large ones
    assert (ids < 100).float().mean() > 10 * (ids >= VOCAB - 100).float().mean()
    rewards = make_payload("tensor_dict", 1 << 20)["rewards"]
    zeros = float((rewards == 0).float().mean())
    assert 0.85 < zeros < 0.95
    w = make_payload("tensor_list", 1 << 20)[0].float()
    assert 0.015 < float(w.std()) < 0.025


def _lz4_ratio(t: torch.Tensor) -> float:
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return len(raw) / len(lz4.block.compress(raw, store_size=False))


def test_compressibility_spans_easy_to_hard() -> None:
    assert _lz4_ratio(make_payload("tensor", 1 << 20)) > 1.8  # token ids
    assert _lz4_ratio(make_payload("tensor_dict", 1 << 20)["rewards"]) > 3  # sparse f32
    assert _lz4_ratio(make_payload("tensor_list", 1 << 20)[0]) < 1.1  # bf16 weights


def test_payloads_are_deterministic_and_compare_exactly() -> None:
    for kind in KINDS:
        a, b = make_payload(kind, SIZE, seed=1), make_payload(kind, SIZE, seed=1)
        assert payloads_equal(a, b), kind
        assert not payloads_equal(a, make_payload(kind, SIZE, seed=2)), kind
    d = make_payload("tensor_dict", SIZE)
    flipped = {k: v.clone() for k, v in d.items()}
    flipped["rewards"].view(-1)[7] += 1
    assert not payloads_equal(d, flipped)
    assert not payloads_equal(d, dict(reversed(list(d.items()))))
    t = make_payload("tensor", SIZE)
    assert not payloads_equal(t, t.view(-1))  # same bytes, other shape
    assert not payloads_equal(t, t.to(torch.int32))


def test_owned_clones_only_tensors_without_own_storage() -> None:
    import numpy as np

    arr = np.arange(8, dtype=np.int64)
    view = torch.from_numpy(arr)  # storage not resizable, like a zero-copy object-store view
    mine = torch.arange(8)
    assert owned(mine) is mine
    got = owned([view, mine])
    assert got[1] is mine
    assert got[0] is not view
    assert torch.equal(got[0], view)
    assert got[0].untyped_storage().resizable()
    batch = owned(RolloutBatch(view, mine, mine, step=4))
    assert batch.step == 4
    assert batch.tokens is not view
    assert batch.logprobs is mine
    assert owned({"a": view})["a"] is not view
    assert owned("obj") == "obj"


def test_payload_cache_keeps_the_last_one() -> None:
    cache = PayloadCache()
    a = cache.get("tensor", 4096)
    assert cache.get("tensor", 4096) is a
    b = cache.get("tensor", 8192)
    assert b is not a
    assert payload_nbytes(b) == 8192


def test_sender_loop_drops_the_warmup_and_times_each_round_trip() -> None:
    calls: list[str] = []
    times = sender_loop(lambda: calls.append("s"), lambda: calls.append("a"), reps=3)
    assert len(times) == 3
    assert all(t > 0 for t in times)
    assert calls == ["s", "a"] * (3 + WARMUP)


def test_receiver_loop_checks_the_first_payload() -> None:
    expected = make_payload("tensor", 4096)
    acks: list[int] = []
    receiver_loop(lambda: expected.clone(), lambda: acks.append(1), 2, expected, "x")
    assert len(acks) == 2 + WARMUP
    wrong = expected.clone()
    wrong.view(-1)[0] += 1
    with pytest.raises(PayloadMismatchError, match="x: the received payload differs"):
        receiver_loop(lambda: wrong, lambda: None, 2, expected, "x")


def test_interface_of_finds_loopback_and_nothing_for_foreign_addresses() -> None:
    from p2p_worker.bench._baselines import interface_of

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("192.0.2.123") is None  # TEST-NET-1, never configured here
