"""Helpers of N-member groups: inputs, reduce ops, object encoding, gloo group, liveness mesh.

Everything here is package-internal; :mod:`p2p_collective._multi` builds the group on it.
"""

from __future__ import annotations

import pickle
import socket
import struct
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from p2p_collective._deadline import to_timedelta
from p2p_collective._errors import FramingError
from p2p_collective._framing import FRAME_VERSION, MAGIC
from p2p_collective._liveness import open_watch_socket
from p2p_collective._payload import check_tensor, flat_bytes
from p2p_collective._plain import load_object_lenient
from p2p_collective._torch_gloo import new_gloo_group as _gloo_group
from p2p_collective._transport import StoreLike

_REDUCE_OP: Any = dist.ReduceOp

OBJ_HEADER = 1024
"""Bytes of the first message of an object broadcast (frame head + inline metadata)."""
_OBJ_HEAD = struct.Struct("<4sB3xQq")  # magic, frame version, pad, sequence, metadata bytes

REDUCE_OPS = ("sum", "product", "min", "max")
_GLOO_DTYPES = frozenset(
    {
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int32,
        torch.int64,
    }
)

# Kinds of a broadcast object.
K_TENSOR, K_LIST, K_TUPLE, K_DICT, K_ODICT, K_OBJECT = range(6)


def reduce_op(op: object, arg: str = "op") -> Any:
    """Map a reduction name (``"sum"``, ``"product"``, ``"min"``, ``"max"``) to a ReduceOp.

    Any case is accepted, as are enums with such a ``name`` and torch ReduceOps.

    Raises:
        ValueError: ``op`` is none of these.
    """
    if isinstance(op, (_REDUCE_OP.RedOpType, _REDUCE_OP)):
        return op
    text = op if isinstance(op, str) else getattr(op, "name", None)
    if isinstance(text, str):
        key = text.lower()
        if key in ("prod", "product"):
            return _REDUCE_OP.PRODUCT
        if key in ("sum", "min", "max"):
            return getattr(_REDUCE_OP, key.upper())
    raise ValueError(f"{arg}: got {op!r}; allowed: one of {', '.join(REDUCE_OPS)}")


def as_tensor(value: object, where: str, op: str, *, writable: bool = False) -> torch.Tensor:
    """A torch view of ``value`` (a tensor, or a numpy array viewed without a copy).

    Raises:
        TypeError: ``value`` is neither a torch tensor nor a numpy array.
        ValueError: It is not dense, contiguous, on CPU, of a reducible dtype, or (with
            ``writable``) a read-only numpy array. Accelerator tensors are refused: the
            NCCL transport of N-member groups is not available yet.
    """
    if isinstance(value, np.ndarray):
        if not value.flags.c_contiguous:
            raise ValueError(
                f"{op}: {where} is a non-contiguous numpy array; use np.ascontiguousarray"
            )
        if writable and not value.flags.writeable:
            raise ValueError(
                f"{op}: {where} is a read-only numpy array; the result is written in place"
            )
        try:
            tensor = torch.from_numpy(value)
        except TypeError as exc:
            raise ValueError(f"{op}: {where} has numpy dtype {value.dtype}: {exc}") from exc
    elif isinstance(value, torch.Tensor):
        tensor = value
    else:
        raise TypeError(
            f"{op}: {where} must be a torch.Tensor or a numpy.ndarray, got {type(value).__name__}"
        )
    if tensor.device.type != "cpu":
        raise ValueError(
            f"{op}: {where} is on {tensor.device}; collectives over N-member groups run on CPU"
            " (gloo) only in this version -- the NCCL transport is not available yet; use .cpu()"
        )
    check_tensor(tensor, where, op)
    return tensor


def check_reducible(tensor: torch.Tensor, where: str, op: str) -> None:
    """Raises ValueError when gloo cannot reduce ``tensor``'s dtype."""
    if tensor.dtype not in _GLOO_DTYPES:
        allowed = ", ".join(sorted(str(d) for d in _GLOO_DTYPES))
        raise ValueError(f"{op}: {where} has dtype {tensor.dtype}; allowed: {allowed}")


def like(template: object, tensor: torch.Tensor) -> object:
    """``tensor`` as the same kind of object as ``template`` (numpy array or tensor)."""
    return tensor.numpy() if isinstance(template, np.ndarray) else tensor


# -- object broadcast --------------------------------------------------------------------


def encode_object(obj: Any, op: str) -> tuple[bytes, list[torch.Tensor]]:
    """Metadata bytes and the tensors to broadcast for ``obj`` (checked, not copied).

    Raises:
        ValueError: A tensor is unusable, or the object cannot be pickled.
    """
    tensors: list[torch.Tensor]
    keys: list[Any] | None = None
    rest: Any = None
    tp = type(obj)
    if isinstance(obj, torch.Tensor):
        kind, tensors = K_TENSOR, [obj]
    elif tp in (list, tuple) and obj and all(isinstance(x, torch.Tensor) for x in obj):
        kind, tensors = (K_LIST if tp is list else K_TUPLE), list(obj)
    elif (
        tp in (dict, OrderedDict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values())
    ):
        kind, keys, tensors = (
            (K_ODICT if tp is OrderedDict else K_DICT),
            list(obj),
            list(obj.values()),
        )
    else:
        kind, tensors, rest = K_OBJECT, [], obj
    specs = []
    for i, t in enumerate(tensors):
        where = (
            "payload" if kind == K_TENSOR else f"payload[{keys[i]!r}]" if keys else f"payload[{i}]"
        )
        check_tensor(t, where, op)
        specs.append((t.dtype, tuple(t.shape), bool(t.requires_grad)))
    try:
        meta = pickle.dumps((kind, keys, specs, rest), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise ValueError(f"{op}: the payload ({tp.__name__}) cannot be pickled: {exc}") from exc
    return meta, [flat_bytes(t) for t in tensors if t.numel()]


def header_for(meta: bytes, seq: int) -> torch.Tensor:
    """The first message of an object broadcast: a frame head, then the metadata if it fits.

    The head carries the package's frame magic and version, the group's object
    broadcast sequence number and the metadata length, so a member whose calls are out
    of step gets a :class:`FramingError` instead of garbage (as pair frames do).
    """
    buf = bytearray(OBJ_HEADER)
    _OBJ_HEAD.pack_into(buf, 0, MAGIC, FRAME_VERSION, seq, len(meta))
    if _OBJ_HEAD.size + len(meta) <= OBJ_HEADER:
        buf[_OBJ_HEAD.size : _OBJ_HEAD.size + len(meta)] = meta
    return torch.frombuffer(buf, dtype=torch.uint8)


def meta_length(header: torch.Tensor, expected_seq: int, what: str) -> int:
    """Check an object broadcast's head; return the metadata length it announces.

    Raises:
        FramingError: Wrong magic or version (the message is not an object broadcast
            head), or another sequence number than ``expected_seq``.
    """
    magic, version, seq, length = _OBJ_HEAD.unpack_from(header.numpy().tobytes(), 0)
    if magic != MAGIC or version != FRAME_VERSION:
        raise FramingError(
            f"{what}: the first message is not an object broadcast head (magic {magic!r},"
            f" version {version}; expected {MAGIC!r}, {FRAME_VERSION}); the members' calls"
            " are not paired (broadcast(obj) against another collective?)"
        )
    if seq != expected_seq or length < 0:
        raise FramingError(
            f"{what}: object broadcast number {seq} ({length} bytes of metadata) arrived"
            f" where number {expected_seq} was expected; the members' calls are out of step"
        )
    return int(length)


def inline_meta(header: torch.Tensor, length: int) -> bytes | None:
    """The metadata carried inside the head message, or None when it travels separately."""
    if _OBJ_HEAD.size + length > OBJ_HEADER:
        return None
    return header.numpy().tobytes()[_OBJ_HEAD.size : _OBJ_HEAD.size + length]


def allocate_from(
    meta: bytes, object_policy: str = "pickle", object_allowlist: tuple[str, ...] = ()
) -> tuple[tuple[Any, ...], list[torch.Tensor], list[torch.Tensor], list[str]]:
    """Decode metadata; return it, the tensors to fill, their byte views, refused globals.

    The metadata is decoded under ``object_policy`` to its end even when it holds refused
    globals (they become inert stand-ins), so the caller can still take the tensors that
    follow off the wire and keep the group in step before it raises ``ObjectRefusedError``.
    """
    decoded, refused = load_object_lenient(meta, object_policy, object_allowlist)
    tensors = [torch.empty(shape, dtype=dtype) for dtype, shape, _ in decoded[2]]
    views = [t.view(-1).view(torch.uint8) for t in tensors if t.numel()]
    return decoded, tensors, views, refused


def rebuild(decoded: tuple[Any, ...], tensors: list[torch.Tensor]) -> Any:
    """The broadcast object from its decoded metadata and received tensors."""
    kind, keys, specs, rest = decoded
    for t, (_, _, grad) in zip(tensors, specs, strict=True):
        if grad:
            t.requires_grad_(True)
    if kind == K_TENSOR:
        return tensors[0]
    if kind == K_LIST:
        return tensors
    if kind == K_TUPLE:
        return tuple(tensors)
    if kind in (K_DICT, K_ODICT):
        pairs = zip(keys, tensors, strict=True)
        return OrderedDict(pairs) if kind == K_ODICT else dict(pairs)
    return rest


# -- transport ---------------------------------------------------------------------------


def new_gloo_group(
    store: StoreLike, prefix: str, rank: int, size: int, device: Any, timeout: float | None
) -> Any:
    """A standalone gloo process group of ``size`` ranks under ``prefix`` (bound to ``device``)."""
    return _gloo_group(store, prefix, rank, size, device, to_timedelta(timeout), 2)


def liveness_mesh(
    store: StoreLike,
    prefix: str,
    rank: int,
    names: Sequence[str],
    host: str,
    timeout: float | None,
    wait_key: Callable[[str, float | None], bool],
) -> dict[int, socket.socket]:
    """One idle TCP connection to every other member (the lower rank listens).

    Pairs are connected in a fixed order (by the lower rank, then the higher), so no two
    members ever wait on each other.

    Raises:
        CollectiveTimeoutError: A member did not connect in time.
        CollectiveError: A connection failed.
    """
    socks: dict[int, socket.socket] = {}
    try:
        for peer in range(len(names)):
            if peer == rank:
                continue
            low, high = min(rank, peer), max(rank, peer)
            socks[peer] = open_watch_socket(
                store,
                f"{prefix}/live/{low}-{high}",
                rank == low,
                host,
                names[peer],
                timeout,
                wait_key,
            )
    except BaseException:
        for sock in socks.values():
            sock.close()
        raise
    return socks
