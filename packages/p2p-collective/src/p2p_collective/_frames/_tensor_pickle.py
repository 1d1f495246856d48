"""Pickling objects that hold tensors: each plain CPU tensor as its raw bytes.

An object that is not a tensor container (a dict with a tensor and an int, a tuple
wrapping a dict of tensors, a list of dicts) is pickled whole. Pickle asks torch to
reduce each tensor inside, and torch writes its storage through ``torch.save`` and
reads it back through ``torch.load``: measured here on a quiet machine, 0.38 ms to
pickle a dict of four tensors of 16 to 384 elements inside a tuple and 0.58 ms to
unpickle it, and a view carries the whole storage it views. :func:`dumps` gives pickle
a reducer for plain tensors instead: the tensor's bytes in band (a ``PickleBuffer``,
one copy into the pickle), its dtype as the frame's dtype code and its shape;
:func:`rebuild` makes a tensor over the unpickled ``bytearray`` without a further copy.
The same object then takes 0.046 ms to pickle and 0.040 ms to unpickle (4.5 KB instead
of 5.6 KB); an object without tensors takes about 1 us longer to pickle (a pickler of
our own instead of ``pickle.dumps``).

A plain tensor is an exact ``torch.Tensor`` (no subclass, so no ``nn.Parameter``), on
the CPU, strided, contiguous, not quantized or nested, without ``requires_grad``, lazy
conjugate or negative bits or attributes of its own, of a dtype the frames carry. Every
other tensor is reduced by torch as before. What arrives is a tensor of the same dtype,
shape and values; a contiguous view arrives as a tensor of its own (torch would have
sent, and rebuilt, the whole storage it views). Two tensors of one object that share
memory arrive as two tensors that do not, as with torch's own pickling.

Example:
    >>> import torch
    >>> obj = ("key", 3, {"ids": torch.arange(4), "r": torch.ones(2, dtype=torch.bfloat16)})
    >>> back = pickle.loads(dumps(obj))
    >>> back[0], back[1], back[2]["ids"].tolist(), back[2]["r"].dtype
    ('key', 3, [0, 1, 2, 3], torch.bfloat16)
"""

from __future__ import annotations

import copyreg
import io
import math
import pickle
from collections.abc import Callable
from typing import IO, Any, cast

import torch

from p2p_collective._frames._framing import CODE_TO_DTYPE, DTYPE_TO_CODE

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def _plain(t: torch.Tensor) -> bool:
    """Whether ``t`` travels as its raw bytes (see the module notes)."""
    return (
        t.device.type == "cpu"
        and t.layout == torch.strided
        and not t.requires_grad
        and not t.is_quantized
        and not t.is_nested
        and t.dtype in DTYPE_TO_CODE
        and t.is_contiguous()
        and not t.is_conj()
        and not t.is_neg()
        and not t.__dict__
    )


def rebuild(data: bytes | bytearray, code: int, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor :func:`dumps` pickled: ``data`` (its bytes) as dtype ``code``, ``shape``.

    The tensor owns ``data`` when it is a ``bytearray`` (what unpickling gives it);
    ``bytes`` are copied once, into a writable buffer.

    Raises:
        ValueError: ``code`` is no dtype code, or ``data`` does not hold ``shape``.
    """
    dtype = CODE_TO_DTYPE.get(code)
    if dtype is None:
        raise ValueError(f"a pickled tensor names dtype code {code}, which is none")
    numel = math.prod(shape)
    if len(data) != numel * dtype.itemsize:
        raise ValueError(
            f"a pickled tensor of shape {tuple(shape)} and dtype {dtype} has"
            f" {len(data)} bytes, not {numel * dtype.itemsize}"
        )
    if not numel:
        return torch.empty(shape, dtype=dtype)
    buf = data if isinstance(data, bytearray) else bytearray(data)
    return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)


def _reduce(t: torch.Tensor) -> str | tuple[Any, ...]:
    if not _plain(t):
        reduce_ex = cast("Callable[[int], tuple[Any, ...]]", t.__reduce_ex__)
        return reduce_ex(_PROTOCOL)
    code, shape = DTYPE_TO_CODE[t.dtype], tuple(t.shape)
    if not t.numel():
        return (rebuild, (b"", code, shape))
    raw = pickle.PickleBuffer(t.reshape(-1).view(torch.uint8).numpy().data)
    return (rebuild, (raw, code, shape))


class _Reducers(dict[type, Any]):
    """Our tensor reducer, then ``copyreg``'s table as it is at each lookup.

    The pickler looks a type up here only for objects that are not of a built-in type;
    a miss reads ``copyreg.dispatch_table`` then, so reducers registered after this
    module was imported are used as ``pickle.dumps`` would use them.
    """

    def __missing__(self, cls: type) -> Any:
        return copyreg.dispatch_table[cls]


class _Pickler(pickle.Pickler):
    dispatch_table = _Reducers({torch.Tensor: _reduce})


def dump(obj: object, file: IO[bytes]) -> None:
    """``pickle.dump(obj, file)`` (highest protocol), with plain tensors as their raw bytes.

    Raises:
        Exception: Whatever pickling ``obj`` raises.
    """
    _Pickler(file, _PROTOCOL).dump(obj)


def dumps(obj: object) -> bytes:
    """``pickle.dumps(obj)`` (highest protocol), with plain tensors as their raw bytes.

    Raises:
        Exception: Whatever pickling ``obj`` raises.
    """
    buf = io.BytesIO()
    dump(obj, buf)
    return buf.getvalue()
