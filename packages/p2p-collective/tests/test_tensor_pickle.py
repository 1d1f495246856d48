"""Objects holding tensors are pickled with each plain tensor as its raw bytes."""

from __future__ import annotations

import pickle
import warnings
from typing import Any

import pytest
import torch

from p2p_collective._frames._framing import DTYPE_TO_CODE
from p2p_collective._frames._payload import encode_small
from p2p_collective._frames._plain import load_object
from p2p_collective._frames._tensor_pickle import dumps, rebuild

_TORCH_REBUILD = b"_rebuild_tensor"
_OURS = b"_tensor_pickle"


def _bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _sample(dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """Random bits of ``dtype`` (0 or 1 for bool)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for n in shape:
        numel *= n
    g = torch.Generator().manual_seed(7)
    high = 2 if dtype == torch.bool else 256
    raw = torch.randint(0, high, (numel * itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("dtype", sorted(DTYPE_TO_CODE, key=str), ids=str)
def test_every_frame_dtype_round_trips_bit_for_bit(dtype: torch.dtype) -> None:
    obj = {"step": 3, "x": _sample(dtype, (3, 5)), "scalar": _sample(dtype, ())}
    data = dumps(obj)
    assert _OURS in data
    assert _TORCH_REBUILD not in data
    back = pickle.loads(data)
    assert back["step"] == 3
    for key in ("x", "scalar"):
        assert back[key].dtype == dtype
        assert back[key].shape == obj[key].shape
        assert _bits(back[key]) == _bits(obj[key])


def test_empty_tensors_and_nested_containers_round_trip() -> None:
    obj: list[Any] = [
        ("key", 16, {"ids": torch.arange(16), "logp": torch.rand(16, 16)}),
        {"empty": torch.empty(0, 4), "deep": [torch.ones(2, dtype=torch.bfloat16)]},
    ]
    back = pickle.loads(dumps(obj))
    assert back[0][:2] == ("key", 16)
    assert torch.equal(back[0][2]["ids"], obj[0][2]["ids"])
    assert torch.equal(back[0][2]["logp"], obj[0][2]["logp"])
    assert back[1]["empty"].shape == (0, 4)
    assert torch.equal(back[1]["deep"][0], obj[1]["deep"][0])


def test_the_same_tensor_twice_arrives_as_one_tensor() -> None:
    t = torch.arange(4)
    back = pickle.loads(dumps({"a": t, "b": t}))
    assert back["a"] is back["b"]


def test_a_received_tensor_is_writable_and_owns_its_bytes() -> None:
    src = torch.arange(6, dtype=torch.int32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch.frombuffer warns on read-only buffers
        back = pickle.loads(dumps((src,)))[0]
    back += 1
    assert back.tolist() == [1, 2, 3, 4, 5, 6]
    assert src.tolist() == [0, 1, 2, 3, 4, 5]


def test_a_contiguous_view_arrives_as_a_tensor_of_its_own() -> None:
    base = torch.arange(1000, dtype=torch.float32)
    view = base[10:14]
    data = dumps({"v": view})
    assert len(data) < 200  # the view's 16 bytes, not the base's 4000
    back = pickle.loads(data)["v"]
    assert back.tolist() == [10.0, 11.0, 12.0, 13.0]
    assert back.storage_offset() == 0
    assert back.untyped_storage().nbytes() == 16


@pytest.mark.parametrize(
    ("make", "reducer"),
    [
        (lambda: torch.arange(6.0).reshape(2, 3).t(), _TORCH_REBUILD),  # strides kept
        (lambda: torch.ones(3, requires_grad=True), _TORCH_REBUILD),  # requires_grad kept
        (lambda: torch.nn.Parameter(torch.ones(2)), b"_rebuild_parameter"),  # a subclass
        (lambda: torch.tensor([1 + 2j, 3 - 1j]).conj(), _TORCH_REBUILD),  # lazy conjugate bit
    ],
    ids=["transposed", "requires_grad", "parameter", "conj"],
)
def test_other_tensors_go_through_torchs_own_reducer(make: Any, reducer: bytes) -> None:
    t = make()
    data = dumps({"t": t})
    assert reducer in data
    back = pickle.loads(data)["t"]
    assert type(back) is type(t)
    assert back.requires_grad == t.requires_grad
    assert back.stride() == t.stride()
    assert torch.equal(back.detach().resolve_conj(), t.detach().resolve_conj())


def test_a_tensor_with_attributes_keeps_them() -> None:
    t = torch.ones(2)
    t.note = "kept"  # type: ignore[attr-defined]
    back = pickle.loads(dumps([t]))[0]
    assert back.note == "kept"
    assert torch.equal(back, t)


def test_rebuild_refuses_a_wrong_dtype_code_or_length_by_name() -> None:
    with pytest.raises(ValueError, match="dtype code 250"):
        rebuild(bytearray(4), 250, (1,))
    with pytest.raises(ValueError, match=r"shape \(2, 2\) and dtype torch.float32 has 12 bytes"):
        rebuild(bytearray(12), DTYPE_TO_CODE[torch.float32], (2, 2))
    t = rebuild(b"\x01\x00\x02\x00", DTYPE_TO_CODE[torch.int16], (2,))  # bytes: copied
    assert t.tolist() == [1, 2]


def test_encode_small_uses_it_and_plain_policy_still_refuses_nested_tensors() -> None:
    obj = {"rewards": torch.tensor([0.5, 1.0]), "step": 2}
    small = encode_small(obj)
    assert small is not None
    assert _OURS in small.data
    back = load_object(small.data, "pickle")
    assert isinstance(back, dict)
    assert torch.equal(back["rewards"], obj["rewards"])
    from p2p_collective import ObjectRefusedError

    with pytest.raises(
        ObjectRefusedError, match=r"'p2p_collective\._frames\._tensor_pickle\.rebuild'"
    ):
        load_object(small.data, "plain")


class _Registered:
    def __init__(self, value: int) -> None:
        self.value = value


def _reduce_registered(obj: _Registered) -> tuple[Any, ...]:
    return (_Registered, (obj.value * 10,))


def test_a_copyreg_reducer_registered_after_import_is_used() -> None:
    import copyreg

    copyreg.pickle(_Registered, _reduce_registered)
    try:
        back = pickle.loads(dumps({"r": _Registered(4), "t": torch.ones(1)}))
    finally:
        del copyreg.dispatch_table[_Registered]
    assert back["r"].value == 40  # what pickle.dumps gives too
    assert pickle.loads(pickle.dumps(_Registered(4))).value == 4  # unregistered again
    assert pickle.loads(dumps(_Registered(4))).value == 4
