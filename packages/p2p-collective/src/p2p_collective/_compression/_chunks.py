"""Chunked frames, sending side: a large frame's tensors compressed and sent chunk by chunk.

A frame whose eligible tensors hold at least twice ``chunk_bytes`` is sent with
``Flag.CHUNKED``: its header goes out at once with every entry raw (codec 0, wire size =
raw size), then each tensor with bytes travels as chunks of ``chunk_bytes`` (the last one
shorter), in order. Each chunk is one 32-byte descriptor message::

    magic    4s  b"P2PC"
    codec    u8  0 raw, else the codec id; bit 0x80 (:data:`SHUFFLED`): the chunk's bytes
                 were byte-shuffled by its tensor's element size before compression
                 (:func:`p2p_compress.shuffle_bytes`), the receiver unshuffles them
    raw_len  u32 the chunk's raw bytes (> 0)
    wire_len u32 its bytes on the wire (raw: = raw_len; compressed: 0 < wire < raw)
    arrive_ns u64 link emulation: when the chunk's last byte reaches the far end, ns of
                 the sender's CLOCK_MONOTONIC (0: not emulated)
    hold_us  u32 link emulation: the same as microseconds after the descriptor was sent

then one message of ``wire_len`` bytes. Chunks of eligible tensors are compressed on the
Collective's compressor threads, a bounded window ahead of the sender (the direction
thread compresses a chunk itself when no compressor has started it); each keeps its
compressed form only when smaller (else raw, with the reason), and a chunk that gets no
pooled buffer within the budget goes raw with ``no_buffer``. Each chunk's buffer goes
back to the pool once its send completed.

Byte shuffle: when a tensor's elements are 2, 4 or 8 bytes wide and lz4 shrinks a
16 KiB sample of it at least 1.25x more after :func:`~p2p_compress.shuffle_bytes`
(:func:`~p2p_compress.internal.shuffle_itemsize`; token ids stored as int64: 3.9x instead of 2.0x),
its lz4 and zstd chunks are shuffled into a pooled buffer before compression (no
buffer within the budget: compressed unshuffled). A chunk that stays raw goes
unshuffled.
"""

from __future__ import annotations

import struct
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Final

import torch

from p2p_collective._compression._adaptive import Choice
from p2p_collective._compression._jobs import Job
from p2p_collective._compression._state import WireCodec
from p2p_collective._frames._framing import Flag, TensorMeta, patch_flags
from p2p_collective._frames._payload import OutFrame
from p2p_compress import plan_compression, shuffle_bytes
from p2p_compress.internal import CODEC_RAW, CODEC_SPARSE, BufferLease, shuffle_itemsize

CHUNK_MAGIC: Final = b"P2PC"
SHUFFLED: Final = 0x80
"""The descriptor's codec bit that says the chunk's bytes were shuffled before compression."""
DESCRIPTOR = struct.Struct("<4sB3xIIQI4x")
"""The chunk descriptor message (32 bytes)."""


@dataclass
class Chunk:
    """One chunk of one tensor, before and after its compression decision."""

    tensor: int  # index among the frame's tensors with bytes
    source: torch.Tensor  # flat uint8 view of the chunk's raw bytes
    eligible: bool
    reason: str = ""  # why it stayed raw ("" when compressed)
    use: int | None = None  # the codec id to try (None: the job's codec)
    codec_id: int = CODEC_RAW
    payload: torch.Tensor | None = None  # what to send (the source when raw)
    lease: BufferLease | None = None
    seconds: float = 0.0
    ready: float = 0.0  # time.monotonic() when it was ready to go
    itemsize: int = 0  # shuffle by this element size before compressing (0: do not)
    shuffled: bool = False  # compressed after a shuffle (the descriptor says so)

    @property
    def wire_len(self) -> int:
        """Bytes of the chunk's data message."""
        assert self.payload is not None
        return int(self.payload.numel())


def compress_chunk(codec: WireCodec, chunk: Chunk) -> Chunk:
    """Compress one eligible chunk into a pooled buffer; keep it only when smaller.

    Raises:
        CompressionError: The codec failed (no lease is kept).
    """
    t0 = time.perf_counter()
    source, scratch = chunk.source, None
    if chunk.itemsize and chunk.use != CODEC_SPARSE:
        n = int(source.numel())
        scratch = codec.pool.acquire(n)
        if scratch is not None:  # else compressed as it is (the budget is spent)
            source = scratch.buffer[:n]
            shuffle_bytes(chunk.source, source, chunk.itemsize)
    try:
        plan = plan_compression(
            [source], codec.chunk_config_for(chunk.use), codec.provider(chunk.use), codec.pool
        )
    finally:
        if scratch is not None:
            scratch.release()
    entry = plan.entries[0]
    chunk.seconds = time.perf_counter() - t0
    chunk.codec_id, chunk.reason = entry.codec_id, entry.reason
    chunk.payload, chunk.lease = entry.payload, entry.lease
    chunk.shuffled = scratch is not None and entry.codec_id != CODEC_RAW
    if entry.codec_id == CODEC_RAW:
        chunk.payload = chunk.source  # raw goes as it is, never shuffled
    chunk.ready = time.monotonic()
    return chunk


@dataclass
class ChunkStream:
    """The chunks of one chunked frame and the jobs compressing them, a window ahead."""

    codec: WireCodec
    chunks: list[Chunk]
    window: int
    jobs: list[Job[Chunk] | None] = field(default_factory=list)
    submitted: int = 0
    abandoned: bool = False

    def start(self, upto: int) -> None:
        """Queue the compression of the chunks before index ``upto`` (not yet queued)."""
        upto = min(upto, len(self.chunks))
        while self.submitted < upto:
            chunk = self.chunks[self.submitted]
            if chunk.eligible:
                job: Job[Chunk] = Job(partial(self._compress, chunk))
                self.jobs.append(job)
                if self.codec.pipeline.overlap:
                    self.codec.compressor.put(job)
            else:
                self.jobs.append(None)
            self.submitted += 1

    def take(self, index: int, deadline: float | None, ready: float) -> Chunk:
        """Chunk ``index`` with its decision made (compressing it here if nobody has)."""
        self.start(index + self.window)
        chunk = self.chunks[index]
        job = self.jobs[index]
        if job is None:
            chunk.payload, chunk.ready = chunk.source, ready
            return chunk
        self.jobs[index] = None
        return job.result(deadline)

    def _compress(self, chunk: Chunk) -> Chunk:
        compress_chunk(self.codec, chunk)
        if self.abandoned and chunk.lease is not None:
            chunk.lease.discard()  # finished after its frame was given up
        return chunk

    def abandon(self) -> None:
        """The frame failed: stop queued jobs; free every buffer still held (not cached)."""
        self.abandoned = True
        for job in self.jobs:
            if job is not None:
                job.cancel()
        for chunk in self.chunks:
            if chunk.lease is not None:
                chunk.lease.discard()

    def reasons(self) -> tuple[list[str], Counter[str]]:
        """Why tensors and chunks stayed raw.

        Returns:
            Per tensor with bytes, "" when any of its chunks was compressed, else its first
            chunk's reason; and the raw chunks' reasons, counted.
        """
        per: dict[int, list[str]] = {}
        for c in self.chunks:
            per.setdefault(c.tensor, []).append(c.reason)
        tensors = ["" if "" in rs else rs[0] for _, rs in sorted(per.items())]
        return tensors, Counter(c.reason for c in self.chunks if c.reason)


def is_chunked(codec: WireCodec, frame: OutFrame) -> bool:
    """Whether ``frame`` is large enough to travel in chunks."""
    size = codec.pipeline.chunk_bytes
    if not size or not frame.payloads:
        return False
    eligible = sum(m.raw_bytes for m in frame.metas if m.raw_bytes and codec.eligible(m))
    return eligible >= 2 * size


def chunk_frame(
    codec: WireCodec,
    frame: OutFrame,
    choice: Choice | None = None,
    itemsizes: dict[int, int] | None = None,
) -> ChunkStream | None:
    """The chunk stream of ``frame`` when it is large enough to be chunked, else None.

    Marks the frame's header ``Flag.CHUNKED`` (its entries stay raw) and queues the
    compression of the first chunks (a window ahead). An adaptive link's ``choice``
    names the codec of the eligible chunks (None: raw, with the reason ``adaptive``),
    for a probe another codec for the first eligible chunk, and while learning the
    codecs that take turns chunk by chunk. ``itemsizes`` holds shuffle element sizes the
    caller already sampled (by index among the tensors with bytes); the others are sampled.
    """
    if not is_chunked(codec, frame):
        return None
    size = codec.pipeline.chunk_bytes
    with_bytes = [m for m in frame.metas if m.raw_bytes]
    main = codec.config.codec_id if choice is None else choice.codec
    probe = None if choice is None else choice.probe
    learn = () if choice is None else choice.learn
    chunks: list[Chunk] = []
    turn = 0
    for i, (payload, meta) in enumerate(zip(frame.payloads, with_bytes, strict=True)):
        ok = codec.eligible(meta)
        step = size if ok else meta.raw_bytes
        if not ok:
            itemsize = 0
        elif itemsizes is not None and i in itemsizes:
            itemsize = itemsizes[i]
        else:
            itemsize = shuffle_itemsize(meta.dtype, payload)
        for off in range(0, meta.raw_bytes, step):
            use = main
            if ok and learn:  # learning: the codecs take turns
                use = learn[turn % len(learn)]
                turn += 1
            if ok and probe is not None:
                use, probe = probe, None  # this one chunk refreshes the probed codec
            try_it = ok and (choice is None or use is not None)
            reason = "" if try_it else "adaptive" if ok else codec.raw_reason(meta)
            chunks.append(
                Chunk(i, payload[off : off + step], try_it, reason, use, itemsize=itemsize)
            )
    patch_flags(frame.view, Flag.CHUNKED)
    stream = ChunkStream(codec, chunks, window=max(2, 2 * codec.compressor_threads))
    stream.start(stream.window)
    return stream


def actual_metas(metas: list[TensorMeta], stream: ChunkStream) -> list[TensorMeta]:
    """The frame's entries as they really went: codec and wire size summed over chunks."""
    wire: dict[int, int] = {}
    codec: dict[int, int] = {}
    for c in stream.chunks:
        wire[c.tensor] = wire.get(c.tensor, 0) + c.wire_len
        if c.codec_id != CODEC_RAW:
            codec[c.tensor] = c.codec_id
    out = []
    j = 0
    for m in metas:
        if m.raw_bytes:
            m = m._replace(codec_id=codec.get(j, CODEC_RAW), wire_bytes=wire[j])
            j += 1
        out.append(m)
    return out


def pack_descriptor(
    codec_id: int, raw_len: int, wire_len: int, arrive_ns: int, hold: int, shuffled: bool = False
) -> bytes:
    """The 32 bytes of one chunk descriptor (``shuffled`` sets :data:`SHUFFLED`)."""
    code = codec_id | SHUFFLED if shuffled else codec_id
    return DESCRIPTOR.pack(CHUNK_MAGIC, code, raw_len, wire_len, arrive_ns, hold)
