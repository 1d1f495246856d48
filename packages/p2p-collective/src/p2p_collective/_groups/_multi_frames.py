"""Object broadcasts of N-member groups: the pair stack's frame, cut into broadcasts.

``MultiCollectiveGroup.broadcast(obj)`` encodes ``obj`` with the same classifier and
encoder as a pair ``send`` (:func:`p2p_collective._frames._payload.encode`: magic, version,
sequence number, tensor entries, names, pickled object part) and broadcasts it as:

1. a head message of :data:`OBJ_HEADER` bytes: the frame's first bytes, zero-padded;
2. only when the frame is longer: the rest of the frame (its length is in the head);
3. one message per tensor with bytes, raw (N-member groups never compress).

Every member knows the sizes before it receives, so no receive is ever posted for a
size not read from a validated head. The sequence number counts the group's object
broadcasts, so a member whose calls are out of step gets a :class:`FramingError`.
"""

from __future__ import annotations

import torch

from p2p_collective._errors import FramingError
from p2p_collective._frames._framing import (
    FIXED,
    FRAME_VERSION,
    MAGIC,
    SEQ_OFFSET,
    FixedHeader,
    TensorMeta,
    parse_fixed,
    parse_meta,
    patch_seq,
)
from p2p_collective._frames._payload import encode, rebuild

OBJ_HEADER = 1024
"""Bytes of the first message of an object broadcast (frame head + what fits of the rest)."""


class Encoded:
    """What the broadcasting member sends: head, rest of the frame, tensor payloads."""

    __slots__ = ("head", "payloads", "rest", "view")

    def __init__(self, view: memoryview, payloads: list[torch.Tensor]) -> None:
        self.view = view
        self.payloads = payloads
        buf = bytearray(OBJ_HEADER)
        n = min(len(view), OBJ_HEADER)
        buf[:n] = view[:n]
        self.head = torch.frombuffer(buf, dtype=torch.uint8)
        self.rest: torch.Tensor | None = None
        if len(view) > OBJ_HEADER:
            self.rest = torch.frombuffer(bytearray(view[OBJ_HEADER:]), dtype=torch.uint8)

    def messages(self, seq: int) -> list[torch.Tensor]:
        """Every message of the broadcast, its head stamped with sequence number ``seq``."""
        patch_seq(self.head.numpy().data, seq)
        msgs = [self.head]
        if self.rest is not None:
            msgs.append(self.rest)
        return msgs + self.payloads


def encode_object(obj: object, op: str) -> Encoded:
    """Classify, check and encode ``obj`` (nothing is sent; tensors are not copied).

    Raises:
        ValueError: A tensor is unusable (named by position), or the object part cannot
            be pickled.
    """
    frame = encode(obj, op, inline_max=0)  # never inline: payloads travel as broadcasts
    return Encoded(frame.view, frame.payloads)


def read_head(head: torch.Tensor, expected_seq: int, what: str) -> tuple[FixedHeader, int]:
    """Validate an object broadcast's head; return its fixed header and the rest's length.

    Raises:
        FramingError: Not a frame head (another collective's message), another frame
            version, another sequence number than ``expected_seq``, or malformed.
    """
    buf = head.numpy().data
    magic, version = bytes(buf[:4]), buf[4]
    if magic != MAGIC or version != FRAME_VERSION:
        raise FramingError(
            f"{what}: the first message is not an object broadcast head (magic {magic!r},"
            f" version {version}; expected {MAGIC!r}, {FRAME_VERSION}); the members' calls"
            " are not paired (broadcast(obj) against another collective?)"
        )
    seq = int.from_bytes(buf[SEQ_OFFSET : SEQ_OFFSET + 8], "little")
    if seq != expected_seq:
        raise FramingError(
            f"{what}: object broadcast number {seq} arrived where number {expected_seq} was"
            " expected; the members' calls are out of step"
        )
    hdr = parse_fixed(buf, expected_seq, what)
    total = FIXED.size + hdr.meta_len + hdr.obj_len
    return hdr, max(0, total - OBJ_HEADER)


class Incoming:
    """A received head (and rest): the tensors to fill, then :meth:`rebuild`."""

    def __init__(
        self, hdr: FixedHeader, head: torch.Tensor, rest: torch.Tensor | None, what: str
    ) -> None:
        body = head.numpy().tobytes()
        if rest is not None:
            body += rest.numpy().tobytes()
        meta_end = FIXED.size + hdr.meta_len
        self.hdr = hdr
        metas, self.names = parse_meta(memoryview(body)[FIXED.size : meta_end], hdr, what)
        for i, m in enumerate(metas):
            if m.codec_id != 0:
                raise FramingError(f"{what}: tensor {i} is compressed (codec {m.codec_id})")
        self.metas: list[TensorMeta] = metas
        self.obj_bytes = memoryview(body)[meta_end : meta_end + hdr.obj_len]
        self.tensors = [torch.empty(m.shape, dtype=m.dtype) for m in metas]
        self.views = [t.view(-1).view(torch.uint8) for t in self.tensors if t.numel()]

    def rebuild(self, object_policy: str, object_allowlist: tuple[str, ...]) -> object:
        """The broadcast object (raises ``ObjectRefusedError`` as a pair ``recv`` does)."""
        return rebuild(
            self.hdr.kind,
            self.hdr.flags,
            self.metas,
            self.names,
            self.obj_bytes,
            self.tensors,
            object_policy=object_policy,
            object_allowlist=object_allowlist,
        )
