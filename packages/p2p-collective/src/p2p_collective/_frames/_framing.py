"""The binary frame of one ``send``: fixed header, tensor metadata, inline object.

Wire layout of one frame (all integers little-endian)::

    header message (<= HEADER_MAX bytes, the receiver always posts HEADER_MAX):
      fixed part, 56 bytes  struct "<4sBBHQIIQQQII"
        magic      4s  b"P2PF"
        version    u8  FRAME_VERSION
        kind       u8  payload kind (Kind)
        flags      u16 Flag bits
        seq        u64 per-direction sequence number, starts at 0
        n_tensors  u32 number of tensor entries in the metadata
        meta_len   u32 bytes of tensor metadata (+ names section)
        obj_len    u64 bytes of the pickled object part (may be 0)
        wire_total u64 sum of the tensors' wire bytes (cross-check)
        arrive_ns  u64 link emulation: when the header message reaches the far end of the
                       emulated link, in ns of the sender's CLOCK_MONOTONIC (0: not emulated)
        hold_us    u32 link emulation: the same as microseconds after the header was sent
        byte_ps    u32 link emulation: picoseconds per byte of that link (0: unlimited)
      then, unless Flag.EXT: metadata (meta_len bytes), then object (obj_len bytes)
      then, with Flag.INLINE: every tensor's wire bytes, in metadata order
    extension message (only with Flag.EXT): metadata + object, meta_len + obj_len bytes
    unless Flag.INLINE: one payload message per tensor whose wire_bytes > 0, in order;
      with Flag.CHUNKED instead, per such tensor its chunks, each a 32-byte chunk
      descriptor message (codec, raw and wire size, emulated arrival) then, unless
      empty, the chunk's wire bytes; entries then read raw (codec 0, wire = raw bytes)

A frame whose parts all fit in HEADER_MAX bytes is therefore one gloo message.

Tensor entry in the metadata, 24 bytes ``"<BBBBB3xQQ"`` followed by ``ndim`` int64 dims:
dtype code, ndim, device kind, codec id (0 = raw, 1 = lz4, 2 = zstd), tensor flags (bit 0:
requires_grad), raw bytes, wire bytes (the compressed size when the codec id is not 0).
With ``Flag.NAMES`` a names section follows the entries: u32 count, then per name u32
length + UTF-8 bytes (string dict keys, dataclass field names).

The receiver never posts a receive whose size it has not read from a frame it validated:
a longer message than the posted receive aborts the receiving process inside gloo.
"""

from __future__ import annotations

import math
import struct
from typing import NamedTuple

import torch

from p2p_collective._errors import FramingError

MAGIC = b"P2PF"
NO_MAGIC = bytes(4)
"""Written over a receive buffer's magic before it is posted: a short stray message
must not leave an old header there."""
FRAME_VERSION = 8
"""8: the receiving side writes decode records (40 bytes, tag ``D``) back on the direction's
liveness connection (:mod:`p2p_collective._compression._decode_rates`); a version-7 sender
scans that connection for the ``BYE`` byte anywhere, so a record holding that byte would
make a later death look like a goodbye. 7: a chunk descriptor's codec byte may carry bit
0x80 (the chunk was byte-shuffled by its element size before compression), so a receiver
that would decode such a chunk without unshuffling it is refused at connect. 6: a chunk or
tensor may carry codec id 3 (``sparse``, which the adaptive mode can pick), so a receiver
that knows only lz4 and zstd is refused at connect. 5: chunked frames (``Flag.CHUNKED``:
each tensor's bytes travel as chunks, each after a 32-byte chunk descriptor; see
``p2p_collective._compression._chunks``). 4: header messages travel under their own gloo tag
and may be 128 KiB (3: one tag, 64 KiB)."""
HEADER_MAX = 1 << 17
"""Bytes the receiver posts for every header message; a header message never exceeds it.

128 KiB: a frame this small travels as one message (its tensors inline), which on
loopback gloo moves a 64 KiB tensor at 0.6-0.9x a raw gloo message's rate, where a
header plus a payload message (and the "ready" notification the payload waits for)
reached 0.3-0.6x."""

FIXED = struct.Struct("<4sBBHQIIQQQII")
SEQ_OFFSET = 8  # byte offset of ``seq`` inside FIXED, patched just before sending
_SEQ = struct.Struct("<Q")
_ENTRY = struct.Struct("<BBBBB3xQQ")
_U32 = struct.Struct("<I")
_ARRIVAL = struct.Struct("<QII")
_ARRIVAL_OFFSET = struct.calcsize("<4sBBHQIIQQ")  # offset of arrive_ns inside FIXED
U32_MAX = (1 << 32) - 1

MAX_TENSORS = 1 << 20
MAX_NDIM = 64
MAX_META = 1 << 30
MAX_BYTES = 1 << 40
"""Largest pickled object or tensor (1 TiB) a frame may announce; larger is a FramingError."""


class Kind:
    """Payload kinds carried in the fixed header (wire values; plain ints for speed)."""

    TENSOR = 1
    LIST = 2
    TUPLE = 3
    DICT = 4
    DATACLASS = 5
    OBJECT = 6
    RAW = 7  # send_tensor: wire_total is the tensor's byte count, no metadata


KIND_NAMES = {
    1: "tensor",
    2: "list",
    3: "tuple",
    4: "dict",
    5: "dataclass",
    6: "object",
    7: "send_tensor",
}


class Flag:
    """Bits of the fixed header's ``flags``."""

    EXT = 0x1  # metadata and object travel in a second message
    NAMES = 0x2  # a names section follows the tensor entries
    ORDERED = 0x4  # the dict is a collections.OrderedDict
    INLINE = 0x8  # the tensors' bytes follow the object inside the header message
    CHUNKED = 0x10  # each tensor's bytes travel as chunks, each after a chunk descriptor


_KNOWN_FLAGS = Flag.EXT | Flag.NAMES | Flag.ORDERED | Flag.INLINE | Flag.CHUNKED


class Device:
    """Device kind of a tensor entry; the receiver picks its own device index."""

    CPU = 0
    CUDA = 1


TFLAG_REQUIRES_GRAD = 0x1

_DTYPE_NAMES = (
    # Codes are part of the wire format: append only, never renumber.
    (1, "float32"),
    (2, "float64"),
    (3, "float16"),
    (4, "bfloat16"),
    (5, "uint8"),
    (6, "int8"),
    (7, "int16"),
    (8, "int32"),
    (9, "int64"),
    (10, "bool"),
    (11, "complex64"),
    (12, "complex128"),
    (13, "complex32"),
    (14, "uint16"),
    (15, "uint32"),
    (16, "uint64"),
    (17, "float8_e4m3fn"),
    (18, "float8_e5m2"),
    (19, "float8_e4m3fnuz"),
    (20, "float8_e5m2fnuz"),
    (21, "float8_e8m0fnu"),
)
DTYPE_TO_CODE: dict[torch.dtype, int] = {}
CODE_TO_DTYPE: dict[int, torch.dtype] = {}
for _code, _name in _DTYPE_NAMES:
    _dt = getattr(torch, _name, None)
    if isinstance(_dt, torch.dtype):
        DTYPE_TO_CODE[_dt] = _code
        CODE_TO_DTYPE[_code] = _dt


class TensorMeta(NamedTuple):
    """Metadata of one tensor of a frame."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    device: int
    codec_id: int
    tflags: int
    raw_bytes: int
    wire_bytes: int


class FixedHeader(NamedTuple):
    """The validated fixed part of a frame's header message."""

    kind: int
    flags: int
    seq: int
    n_tensors: int
    meta_len: int
    obj_len: int
    wire_total: int
    arrive_ns: int = 0
    hold_us: int = 0
    byte_ps: int = 0

    @property
    def inline_len(self) -> int:
        """Bytes of the header message (fixed part, metadata, object, inline tensors)."""
        if self.flags & Flag.EXT:
            return FIXED.size
        inline = self.wire_total if self.flags & Flag.INLINE else 0
        return FIXED.size + self.meta_len + self.obj_len + inline


def pack_entry(meta: TensorMeta) -> bytes:
    """Encode one tensor entry (24 bytes plus 8 per dimension)."""
    head = _ENTRY.pack(
        DTYPE_TO_CODE[meta.dtype],
        len(meta.shape),
        meta.device,
        meta.codec_id,
        meta.tflags,
        meta.raw_bytes,
        meta.wire_bytes,
    )
    return head + struct.pack(f"<{len(meta.shape)}q", *meta.shape)


def pack_names(names: list[str]) -> bytes:
    """Encode the names section."""
    parts = [_U32.pack(len(names))]
    for name in names:
        raw = name.encode("utf-8")
        parts.append(_U32.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


def pack_fixed(
    buf: memoryview,
    *,
    kind: int,
    flags: int,
    n_tensors: int,
    meta_len: int,
    obj_len: int,
    wire_total: int,
) -> None:
    """Write the fixed header into the first 40 bytes of ``buf`` (sequence number 0)."""
    FIXED.pack_into(
        buf,
        0,
        MAGIC,
        FRAME_VERSION,
        kind,
        flags,
        0,
        n_tensors,
        meta_len,
        obj_len,
        wire_total,
        0,
        0,
        0,
    )


def pack_small_object(buf: memoryview, seq: int, data: bytes) -> int:
    """Write a whole object frame (no tensors, inline) into ``buf``; return its length."""
    end = FIXED.size + len(data)
    FIXED.pack_into(buf, 0, MAGIC, FRAME_VERSION, Kind.OBJECT, 0, seq, 0, 0, len(data), 0, 0, 0, 0)
    buf[FIXED.size : end] = data
    return end


def pack_raw_header(buf: memoryview, seq: int, nbytes: int, inline: bool) -> int:
    """Write a ``send_tensor`` header (``nbytes`` payload bytes) into ``buf``.

    With ``inline`` the caller copies the payload right after the header (same message).

    Returns:
        The header's length in bytes.
    """
    flags = Flag.INLINE if inline else 0
    FIXED.pack_into(buf, 0, MAGIC, FRAME_VERSION, Kind.RAW, flags, seq, 0, 0, 0, nbytes, 0, 0, 0)
    return FIXED.size


def patch_seq(buf: memoryview, seq: int) -> None:
    """Write the sequence number into a packed fixed header."""
    _SEQ.pack_into(buf, SEQ_OFFSET, seq)


def patch_arrival(buf: memoryview, arrive_ns: int, hold_us: int, byte_ps: int) -> None:
    """Write the link-emulation fields (see the module docstring) into a packed header."""
    _ARRIVAL.pack_into(
        buf, _ARRIVAL_OFFSET, arrive_ns, min(hold_us, U32_MAX), min(byte_ps, U32_MAX)
    )


_ENTRY_CODEC = struct.calcsize("<BBB")  # offset of the codec id inside a tensor entry
_ENTRY_WIRE = struct.calcsize("<BBBBB3xQ")  # offset of the wire size inside a tensor entry
_WIRE_TOTAL = struct.calcsize("<4sBBHQIIQ")  # offset of wire_total inside FIXED


def entry_size(ndim: int) -> int:
    """Bytes of one tensor entry of ``ndim`` dimensions in the metadata."""
    return _ENTRY.size + 8 * ndim


def patch_entry_codec(buf: memoryview, offset: int, codec_id: int, wire_bytes: int) -> None:
    """Rewrite codec id and wire size of the tensor entry at ``offset`` of a packed frame.

    Used when a tensor is compressed after encoding: the entry keeps its size.
    """
    buf[offset + _ENTRY_CODEC] = codec_id
    _SEQ.pack_into(buf, offset + _ENTRY_WIRE, wire_bytes)


def patch_wire_total(buf: memoryview, total: int) -> None:
    """Rewrite ``wire_total`` in a packed fixed header."""
    _SEQ.pack_into(buf, _WIRE_TOTAL, total)


_FLAGS = struct.Struct("<H")
_FLAGS_OFFSET = struct.calcsize("<4sBB")  # offset of flags inside FIXED


def patch_flags(buf: memoryview, set_bits: int) -> None:
    """Set ``set_bits`` in the ``flags`` of a packed fixed header (others are kept)."""
    (flags,) = _FLAGS.unpack_from(buf, _FLAGS_OFFSET)
    _FLAGS.pack_into(buf, _FLAGS_OFFSET, flags | set_bits)


def looks_like_header(buf: memoryview, expected_seq: int) -> bool:
    """Whether ``buf`` starts with a frame header for ``expected_seq`` (desync probe)."""
    if len(buf) < FIXED.size or bytes(buf[:4]) != MAGIC:
        return False
    return buf[4] == FRAME_VERSION and _SEQ.unpack_from(buf, SEQ_OFFSET)[0] == expected_seq


def parse_fixed(buf: memoryview, expected_seq: int, peer: str) -> FixedHeader:
    """Validate and decode the fixed header at the start of ``buf``.

    Raises:
        FramingError: Wrong magic, version, sequence number, kind or out-of-range sizes.
    """
    (
        magic,
        version,
        kind,
        flags,
        seq,
        n_tensors,
        meta_len,
        obj_len,
        wire_total,
        *arrival,
    ) = FIXED.unpack_from(buf, 0)
    if magic != MAGIC:
        raise FramingError(
            f"expected a frame header from {peer!r} (sequence {expected_seq}) but got bytes"
            f" starting {bytes(buf[:8]).hex()}; the peer probably called send_tensor() where"
            " this side called recv()"
        )
    if version != FRAME_VERSION:
        raise FramingError(
            f"frame from {peer!r} has version {version}, this side speaks {FRAME_VERSION}"
        )
    if seq != expected_seq:
        raise FramingError(
            f"frame from {peer!r} has sequence number {seq}, expected {expected_seq}; the two"
            " sides paired send/recv and send_tensor/recv_tensor calls differently"
        )
    if kind not in KIND_NAMES:
        raise FramingError(f"frame from {peer!r} has unknown payload kind {kind}")
    if flags & ~_KNOWN_FLAGS or (flags & Flag.INLINE and flags & (Flag.EXT | Flag.CHUNKED)):
        raise FramingError(f"frame from {peer!r} has unknown or conflicting flags {flags:#x}")
    if n_tensors > MAX_TENSORS or meta_len > MAX_META or obj_len > MAX_BYTES:
        raise FramingError(
            f"frame from {peer!r} announces {n_tensors} tensors / {meta_len} metadata bytes /"
            f" a {obj_len}-byte object, over the limits {MAX_TENSORS} / {MAX_META} / {MAX_BYTES}"
        )
    hdr = FixedHeader(kind, flags, seq, n_tensors, meta_len, obj_len, wire_total, *arrival)
    if not hdr.flags & Flag.EXT and hdr.inline_len > HEADER_MAX:
        raise FramingError(
            f"frame from {peer!r} claims an inline header of {hdr.inline_len} bytes,"
            f" more than {HEADER_MAX}"
        )
    return hdr


def parse_meta(
    buf: memoryview, hdr: FixedHeader, peer: str
) -> tuple[list[TensorMeta], list[str] | None]:
    """Decode the tensor entries (and names section) of a validated header.

    Raises:
        FramingError: The metadata is truncated or inconsistent with the fixed header.
    """
    try:
        return _parse_meta(buf, hdr, peer)
    except (struct.error, UnicodeDecodeError, OverflowError) as exc:
        raise FramingError(f"frame from {peer!r} has malformed tensor metadata: {exc}") from exc


def _parse_meta(
    buf: memoryview, hdr: FixedHeader, peer: str
) -> tuple[list[TensorMeta], list[str] | None]:
    metas: list[TensorMeta] = []
    off = 0
    wire_total = 0
    for i in range(hdr.n_tensors):
        code, ndim, device, codec_id, tflags, raw_bytes, wire_bytes = _ENTRY.unpack_from(buf, off)
        off += _ENTRY.size
        dtype = CODE_TO_DTYPE.get(code)
        if dtype is None or ndim > MAX_NDIM:
            raise FramingError(
                f"frame from {peer!r}: tensor {i} has unknown dtype code {code} or ndim {ndim}"
            )
        shape = struct.unpack_from(f"<{ndim}q", buf, off)
        off += 8 * ndim
        numel = math.prod(shape)
        if raw_bytes > MAX_BYTES or wire_bytes > MAX_BYTES:
            raise FramingError(
                f"frame from {peer!r}: tensor {i} announces {raw_bytes} raw / {wire_bytes} wire"
                f" bytes, over the limit {MAX_BYTES}"
            )
        if min(shape, default=0) < 0 or numel * dtype.itemsize != raw_bytes:
            raise FramingError(
                f"frame from {peer!r}: tensor {i} of shape {shape} and dtype {dtype} does"
                f" not hold {raw_bytes} bytes"
            )
        if codec_id == 0 and wire_bytes != raw_bytes:
            raise FramingError(
                f"frame from {peer!r}: raw tensor {i} has {wire_bytes} wire bytes for"
                f" {raw_bytes} raw bytes"
            )
        wire_total += wire_bytes
        metas.append(
            TensorMeta(dtype, tuple(shape), device, codec_id, tflags, raw_bytes, wire_bytes)
        )
    if wire_total != hdr.wire_total:
        raise FramingError(
            f"frame from {peer!r}: tensor entries sum to {wire_total} wire bytes, the header"
            f" says {hdr.wire_total}"
        )
    names: list[str] | None = None
    if hdr.flags & Flag.NAMES:
        (count,) = _U32.unpack_from(buf, off)
        off += 4
        names = []
        for _ in range(count):
            (length,) = _U32.unpack_from(buf, off)
            off += 4
            if off + length > hdr.meta_len:
                raise FramingError(f"frame from {peer!r}: names section overruns the metadata")
            names.append(bytes(buf[off : off + length]).decode("utf-8"))
            off += length
    if off != hdr.meta_len:
        raise FramingError(
            f"frame from {peer!r}: metadata is {hdr.meta_len} bytes but its entries use {off}"
        )
    return metas, names
