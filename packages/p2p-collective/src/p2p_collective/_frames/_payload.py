"""Turning a payload into a frame and back: classification, validation, (un)pickling.

Everything here runs before the operation is queued (sending side), so a bad payload is
refused with a ``ValueError`` before a single byte is on the wire and the group stays
usable. Receiving-side rebuilding runs after the whole frame has been taken off the wire.
"""

from __future__ import annotations

import copy
import dataclasses
import io
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from p2p_collective._frames._framing import (
    DTYPE_TO_CODE,
    FIXED,
    HEADER_MAX,
    TFLAG_REQUIRES_GRAD,
    Device,
    Flag,
    Kind,
    TensorMeta,
    pack_entry,
    pack_fixed,
    pack_names,
    pack_small_object,
    patch_seq,
)
from p2p_collective._frames._plain import load_object
from p2p_collective._frames._recvpool import POOL_MIN_BYTES
from p2p_collective._frames._tensor_pickle import dump, dumps

_NO_OBJECT = object()


@dataclass
class OutFrame:
    """An encoded frame, ready for the sending thread to put on the wire."""

    kind: int
    view: memoryview  # fixed header + metadata + pickled object (+ inline tensors)
    buffer: torch.Tensor  # uint8 tensor over ``view``
    ext: bool  # metadata/object travel in a second message
    tensors: list[torch.Tensor]  # the payload's tensors, in frame order
    metas: list[TensorMeta]
    payloads: list[torch.Tensor]  # flat uint8 views of the tensors with bytes, frame order
    obj_len: int
    sent_wire_bytes: int | None = None  # a chunked frame: what really went on the wire

    def header_messages(self) -> list[torch.Tensor]:
        """The header message and, with EXT, the extension message."""
        if self.ext:
            return [self.buffer[: FIXED.size], self.buffer[FIXED.size :]]
        return [self.buffer]

    @property
    def payload_bytes(self) -> int:
        """Raw tensor bytes plus pickled object bytes."""
        return sum(m.raw_bytes for m in self.metas) + self.obj_len

    @property
    def wire_bytes(self) -> int:
        """Every byte this frame puts on the wire, header included."""
        if self.sent_wire_bytes is not None:
            return self.sent_wire_bytes
        return int(self.buffer.numel()) + sum(int(p.numel()) for p in self.payloads)


class SmallObject:
    """A plain (tensor-free) object whose whole frame fits the header message.

    It is pickled when the call is made, like every payload; the frame itself is written
    into the direction's send buffer only when its turn comes, so a small object costs
    one pickling, one copy and one gloo message.
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def pack_into(self, view: memoryview, seq: int) -> int:
        """Write the frame (fixed header with ``seq``, then the object) into ``view``.

        Returns:
            The frame's length in bytes.
        """
        return pack_small_object(view, seq, self.data)


SMALL_OBJECT_MAX = HEADER_MAX - FIXED.size
"""Pickled objects up to this many bytes travel as a :class:`SmallObject`."""


class SmallTensor:
    """A single tensor whose whole frame fits the header message, copied at the call.

    The frame is byte for byte what :func:`encode` makes of the tensor (kind TENSOR, one
    entry, bytes inline), so the receiver reads it like any other; only the sender skips
    the generic encoder. Like :class:`SmallObject` it is written into the direction's
    send buffer when its turn comes.
    """

    __slots__ = ("data", "entry", "meta")

    def __init__(self, meta: TensorMeta, entry: bytes, data: bytes) -> None:
        self.meta = meta
        self.entry = entry
        self.data = data

    def pack_into(self, view: memoryview, seq: int) -> int:
        """Write the frame (fixed header with ``seq``, entry, bytes) into ``view``.

        Returns:
            The frame's length in bytes.
        """
        meta_end = FIXED.size + len(self.entry)
        end = meta_end + len(self.data)
        pack_fixed(
            view,
            kind=Kind.TENSOR,
            flags=Flag.INLINE,
            n_tensors=1,
            meta_len=len(self.entry),
            obj_len=0,
            wire_total=len(self.data),
        )
        patch_seq(view, seq)
        view[FIXED.size : meta_end] = self.entry
        view[meta_end:end] = self.data
        return end


def encode_small_tensor(
    t: torch.Tensor, op: str = "send(obj)", inline_max: int = HEADER_MAX
) -> SmallTensor | None:
    """A :class:`SmallTensor` of ``t`` when its frame fits ``inline_max`` bytes, else None.

    Raises:
        ValueError: ``t`` cannot be sent (as :func:`encode` would raise it).
    """
    if t.numel() * t.element_size() > inline_max:
        return None
    meta = _checked_meta(t, "payload", op)
    entry = pack_entry(meta)
    if FIXED.size + len(entry) + meta.raw_bytes > inline_max:
        return None
    data = flat_bytes(t).numpy().tobytes() if meta.raw_bytes else b""
    return SmallTensor(meta, entry, data)


def encode_small(obj: Any, op: str = "send(obj)") -> SmallObject | None:
    """Pickle ``obj`` if it is a plain object (no tensor container); else return None.

    Tensors inside it are pickled as their raw bytes where they are plain
    (:mod:`p2p_collective._frames._tensor_pickle`), not through ``torch.save``.

    None means ``obj`` is a tensor, a list/tuple/dict of tensors or a dataclass with
    tensor fields: :func:`encode` handles it. The caller checks the size: a
    :class:`SmallObject` longer than :data:`SMALL_OBJECT_MAX` goes through
    :func:`encode` with ``pickled=small.data`` (pickled once either way).

    Raises:
        ValueError: The object cannot be pickled.
    """
    if _kind(obj) != Kind.OBJECT:
        return None
    try:
        return SmallObject(dumps(obj))
    except Exception as exc:
        raise ValueError(
            f"{op}: the payload (type {type(obj).__name__}) cannot be pickled: {exc}"
        ) from exc


_SEQUENCES = (list, tuple)
_MAPPINGS = (dict, OrderedDict)


def _tensor_fields(obj: Any) -> list[str]:
    """Names of a dataclass instance's fields that hold tensors."""
    return [
        f.name
        for f in dataclasses.fields(obj)
        if isinstance(getattr(obj, f.name, None), torch.Tensor)
    ]


def _kind(obj: Any) -> int:
    """The payload kind of ``obj``: the rules :func:`_classify` builds its answer on."""
    if isinstance(obj, torch.Tensor):
        return Kind.TENSOR
    tp = type(obj)
    if tp in _SEQUENCES:
        if obj and all(isinstance(x, torch.Tensor) for x in obj):
            return Kind.LIST if tp is list else Kind.TUPLE
    elif tp in _MAPPINGS:
        if obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
            return Kind.DICT
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type) and _tensor_fields(obj):
        return Kind.DATACLASS
    return Kind.OBJECT


def check_tensor(t: torch.Tensor, where: str, op: str) -> None:
    """Refuse tensors that cannot travel as raw bytes on the CPU transport.

    Raises:
        ValueError: ``t`` is not a dense, contiguous CPU tensor of a supported dtype.
    """
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        raise ValueError(
            f"{op}: {where} has layout {t.layout} (quantized={t.is_quantized}); only dense"
            " strided tensors can be sent"
        )
    if t.device.type != "cpu":
        raise ValueError(
            f"{op}: {where} is on device {t.device}; this version moves CPU tensors only"
            " (the accelerator transport is not available yet); move it with .cpu()"
        )
    if not t.is_contiguous():
        raise ValueError(
            f"{op}: {where} is not contiguous (shape {tuple(t.shape)}, stride"
            f" {tuple(t.stride())}); call .contiguous() on it before sending"
        )
    if t.dtype not in DTYPE_TO_CODE:
        raise ValueError(f"{op}: {where} has dtype {t.dtype}, which cannot be sent")


def flat_bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor's bytes (no copy unless conj/neg bits)."""
    if t.requires_grad:
        t = t.detach()
    if t.is_conj() or t.is_neg():  # lazily conjugated/negated views: materialize
        t = t.resolve_conj().resolve_neg()
    if t.dim() != 1:
        t = t.view(-1)
    return t.view(torch.uint8)


def _classify(obj: Any) -> tuple[int, int, list[Any], list[str], list[str] | None, Any]:
    """Return kind, flags, tensors, their position names, names section, object part."""
    kind = _kind(obj)
    if kind == Kind.TENSOR:
        return Kind.TENSOR, 0, [obj], ["payload"], None, _NO_OBJECT
    if kind in (Kind.LIST, Kind.TUPLE):
        return kind, 0, list(obj), [f"payload[{i}]" for i in range(len(obj))], None, _NO_OBJECT
    if kind == Kind.DICT:
        flags = Flag.ORDERED if type(obj) is OrderedDict else 0
        keys = list(obj.keys())
        where = [f"payload[{k!r}]" for k in keys]
        if all(type(k) is str for k in keys):
            return Kind.DICT, flags | Flag.NAMES, list(obj.values()), where, keys, _NO_OBJECT
        return Kind.DICT, flags, list(obj.values()), where, None, keys
    if kind == Kind.DATACLASS:
        names = _tensor_fields(obj)
        skeleton = copy.copy(obj)
        for name in names:
            object.__setattr__(skeleton, name, None)
        tensors = [getattr(obj, n) for n in names]
        return (
            Kind.DATACLASS,
            Flag.NAMES,
            tensors,
            [f"payload.{n}" for n in names],
            names,
            skeleton,
        )
    return Kind.OBJECT, 0, [], [], None, obj


def _checked_meta(t: torch.Tensor, where: str, op: str) -> TensorMeta:
    """The raw (uncompressed) entry of a tensor that :func:`check_tensor` accepts."""
    check_tensor(t, where, op)
    nbytes = t.numel() * t.element_size()
    tflags = TFLAG_REQUIRES_GRAD if t.requires_grad else 0
    return TensorMeta(t.dtype, tuple(t.shape), Device.CPU, 0, tflags, nbytes, nbytes)


def encode(
    obj: Any,
    op: str = "send(obj)",
    pickled: bytes | None = None,
    inline_max: int = HEADER_MAX,
) -> OutFrame:
    """Classify, check and encode ``obj``; nothing is sent.

    ``pickled`` is ``obj`` already pickled (by :func:`encode_small`), for plain objects.
    The tensors ride inside the header message when the whole frame fits ``inline_max``
    (at most :data:`HEADER_MAX`) bytes.

    Raises:
        ValueError: A tensor is not contiguous / not on CPU / of an unsupported kind (the
            message names its position, e.g. ``payload['x']``), or the object part cannot
            be pickled.
    """
    kind, flags, tensors, where, names, objpart = _classify(obj)
    metas: list[TensorMeta] = []
    payloads: list[torch.Tensor] = []
    for t, pos in zip(tensors, where, strict=True):
        metas.append(_checked_meta(t, pos, op))
        if metas[-1].raw_bytes:
            payloads.append(flat_bytes(t))
    meta = b"".join(pack_entry(m) for m in metas)
    if names is not None:
        meta += pack_names(names)
    bio = io.BytesIO()
    bio.write(bytes(FIXED.size))
    bio.write(meta)
    if pickled is not None and kind == Kind.OBJECT:
        bio.write(pickled)
    elif objpart is not _NO_OBJECT:
        try:
            dump(objpart, bio)
        except Exception as exc:
            raise ValueError(
                f"{op}: the payload (type {type(obj).__name__}) cannot be pickled: {exc}"
            ) from exc
    obj_len = bio.tell() - FIXED.size - len(meta)
    if bio.tell() + sum(p.numel() for p in payloads) <= min(inline_max, HEADER_MAX):
        for p in payloads:  # small tensors ride inside the header message
            bio.write(p.numpy().data)
        payloads = []
        flags |= Flag.INLINE
    view = bio.getbuffer()
    ext = len(view) > HEADER_MAX
    if ext:
        flags |= Flag.EXT
    pack_fixed(
        view,
        kind=kind,
        flags=flags,
        n_tensors=len(metas),
        meta_len=len(meta),
        obj_len=obj_len,
        wire_total=sum(m.wire_bytes for m in metas),
    )
    buffer = torch.frombuffer(view, dtype=torch.uint8)
    return OutFrame(kind, view, buffer, ext, tensors, metas, payloads, obj_len)


def allocate(meta: TensorMeta, take: Callable[[int], torch.Tensor]) -> torch.Tensor:
    """A fresh CPU tensor for a received tensor entry; ``take(nbytes)`` gives raw bytes."""
    if meta.raw_bytes < POOL_MIN_BYTES:
        return torch.empty(meta.shape, dtype=meta.dtype)
    return take(meta.raw_bytes).view(meta.dtype).reshape(meta.shape)


def rebuild(
    kind: int,
    flags: int,
    metas: list[TensorMeta],
    names: list[str] | None,
    obj_bytes: memoryview | None,
    tensors: list[torch.Tensor],
    *,
    object_policy: str = "pickle",
    object_allowlist: tuple[str, ...] = (),
) -> object:
    """Rebuild the sent object from a fully received frame.

    The object part (if any) is unpickled under ``object_policy`` (see
    :func:`~p2p_collective._frames._plain.load_object`).

    Raises:
        ObjectRefusedError: ``object_policy`` is ``"plain"`` and the object part holds
            a global it does not accept.
        Exception: Whatever unpickling the object part raises (the caller wraps it).
    """
    for t, m in zip(tensors, metas, strict=True):
        if m.tflags & TFLAG_REQUIRES_GRAD and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)
    if kind == Kind.TENSOR:
        return tensors[0]
    if kind == Kind.LIST:
        return tensors
    if kind == Kind.TUPLE:
        return tuple(tensors)
    obj = (
        load_object(obj_bytes, object_policy, object_allowlist)
        if obj_bytes is not None and len(obj_bytes)
        else None
    )
    if kind == Kind.DICT:
        # the object part of a dict with other keys is the pickled list of its keys
        keys: Sequence[object] = (
            names if names is not None else list(cast("list[object]", obj or ()))
        )
        pairs = zip(keys, tensors, strict=True)
        return OrderedDict(pairs) if flags & Flag.ORDERED else dict(pairs)
    if kind == Kind.DATACLASS:
        for name, t in zip(names or [], tensors, strict=True):
            object.__setattr__(obj, name, t)
        return obj
    return obj
