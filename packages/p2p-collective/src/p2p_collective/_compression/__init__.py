"""Tensor compression on the wire (seed 000, "Tensor 压缩"): sender, receiver, shared state.

Scope: the CPU tensors of a generic ``send`` frame (a tensor, a list/tuple, an all-tensor
dict, a dataclass's tensor fields). One rule decides, whatever the frame's size: a tensor
with at least ``min_bytes`` bytes and a dtype not in ``excluded_dtypes`` is compressed
when that makes it smaller. A frame whose header part and (compressed) bytes fit the
header message travels as one message with the bytes inline; larger ones send each
tensor as a payload message of its own. Pickled objects, ``send_tensor`` /
``recv_tensor`` and accelerator tensors are never compressed.

Per :class:`~p2p_collective.Collective` (one per process): one
:class:`~p2p_compress.TensorBufferPool`, created empty with the Collective, and one
:class:`~p2p_compress.TensorCodecProvider`, created at the first eligible tensor; both
shared by every group, with compressor and decoder threads (started on first need; how
many is ``cluster.collective.compression_pipeline``) that let codec work overlap the wire:

* sender: a synchronous ``send`` compresses in the calling thread; an asynchronous one
  hands its frame to the compressor thread and returns at once, so the frames queued
  behind the one on the wire are compressed while it is sent. The direction thread takes
  a job over itself when the compressor has not started it yet, so it never waits on
  another group's work. Each compressed payload's buffer lease is returned to the pool
  as soon as that payload's send completed.
* receiver: a compressed payload is received into a pooled buffer of exactly its
  validated wire size; the decoder thread decompresses it straight into the allocated
  target (acquiring the codec only then, releasing it at once) while the direction
  thread already receives the frame's next payload.

Modules, one concept each: ``_settings`` (the ``compression_pipeline`` section),
``_state`` (:class:`WireCodec`), ``_handshake`` (the wire-config fingerprint both ends
compare), ``_stats`` (:class:`WireStats`), ``_pack`` (the per-frame decision),
``_schedule`` (when a frame is compressed), ``_transmit`` (putting it on the wire) and
``_decode`` (the receiving side).
"""

from p2p_collective._compression._decode import FrameDecoder, check_entries
from p2p_collective._compression._handshake import (
    check_peer_wire_config,
    publish_wire_config,
    wire_fingerprint,
)
from p2p_collective._compression._pack import Packed, compress_frame
from p2p_collective._compression._schedule import Outgoing
from p2p_collective._compression._settings import (
    CompressionPipelineConfig,
    parse_compression_pipeline,
)
from p2p_collective._compression._state import WireCodec
from p2p_collective._compression._stats import WireStats
from p2p_collective._compression._transmit import transmit

__all__ = [
    "CompressionPipelineConfig",
    "FrameDecoder",
    "Outgoing",
    "Packed",
    "WireCodec",
    "WireStats",
    "check_entries",
    "check_peer_wire_config",
    "compress_frame",
    "parse_compression_pipeline",
    "publish_wire_config",
    "transmit",
    "wire_fingerprint",
]
