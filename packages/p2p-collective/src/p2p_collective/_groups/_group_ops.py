"""The operations of a :class:`CollectiveGroup` that its directions run (a mixin).

:class:`GroupOps` holds what
:class:`~p2p_collective._groups._group.CollectiveGroup` runs inside a direction, one
operation at a time and in order, once a call was checked and queued: each puts one frame
on the direction's link or takes one off (``send``, a small object or tensor in one
message, ``send_tensor``; ``recv``, ``recv_nowait``, ``recv_tensor``), rebuilds what
arrived and counts it in the direction's statistics. The calls themselves, their checks
and the group's life are in ``_group.py``; :class:`Unready` is here, beside the
``recv_nowait`` operation that returns it.
"""

from __future__ import annotations

import enum
import time

import torch

from p2p_collective._compression import Outgoing, WireCodec, transmit
from p2p_collective._config import CollectiveConfig
from p2p_collective._errors import (
    CleanFailure,
    CollectiveError,
    CollectiveTimeoutError,
    FramingError,
    ObjectRefusedError,
)
from p2p_collective._frames._framing import (
    FIXED,
    KIND_NAMES,
    Flag,
    Kind,
    looks_like_header,
    pack_raw_header,
    parse_fixed,
)
from p2p_collective._frames._payload import SmallObject, SmallTensor, rebuild
from p2p_collective._groups._side import Side
from p2p_collective._links._emulation import LinkPacer
from p2p_collective._links._link import Link
from p2p_collective._links._transport import LinkFactory
from p2p_collective._wire._frame_io import HEADER_MAX_TENSOR, patch_frame_seq, read_frame
from p2p_compress import CompressionError


class Unready(enum.Enum):
    """What :meth:`CollectiveGroup.recv_nowait` returns when it has no object to give."""

    EMPTY = "nothing whole has arrived yet"
    LARGE = "the next frame spans several messages: receive it with recv()"


class GroupOps:
    """The direction-run operations of a :class:`CollectiveGroup`.

    A mixin without state of its own: :class:`CollectiveGroup`'s ``__init__`` sets every
    attribute declared here.
    """

    name: str
    peer_name: str
    config: CollectiveConfig
    links: LinkFactory
    _send: Side
    _recv: Side
    _wire: WireCodec | None
    _pacer: LinkPacer | None

    # -- operations (run by the direction, one at a time, in order) -----------------------

    def _do_recv_nowait(self, deadline: float | None) -> object:
        side = self._recv
        link = side.link
        assert link is not None  # recv_nowait checked the link and made the buffer
        assert side.nowait is not None
        buf, view = side.nowait
        n = link.peek_message(view)
        if n == -1:
            return Unready.EMPTY
        if n < FIXED.size or not looks_like_header(view, side.seq):
            return Unready.LARGE  # not a frame header in step: recv() tells what it is
        hdr = parse_fixed(view, side.seq, self.peer_name)
        plain = hdr.kind == Kind.OBJECT and not (
            hdr.n_tensors or hdr.meta_len or hdr.wire_total or hdr.flags or hdr.arrive_ns
        )
        if not plain or n != hdr.inline_len:
            return Unready.LARGE
        link.drop_message(view, n)
        expected = side.seq
        side.seq += 1
        return self._rebuild_frame(link, buf, view, expected, deadline)

    def _do_send(self, out: Outgoing, deadline: float | None) -> None:
        side = self._send
        link = side.ensure_link(deadline)
        try:
            packed = out.resolve(deadline)  # compressed here unless the compressor did it
        except (CompressionError, CollectiveTimeoutError) as exc:
            err = CollectiveError(f"p2p[{self.name}]: compressing the payload failed: {exc}")
            err.__cause__ = exc
            raise CleanFailure(err) from exc  # nothing is on the wire yet
        frame = packed.frame
        seq = side.seq
        patch_frame_seq(frame, seq)
        side.seq += 1
        sent = transmit(
            link.send, packed, self._pacer, side.wire_stats, deadline, link.transport, seq
        )
        st = side.direction.stats
        st.messages += 1
        st.transport_messages += sent
        st.payload_bytes += frame.payload_bytes
        st.wire_bytes += frame.wire_bytes

    def _do_send_small(self, small: SmallObject | SmallTensor, deadline: float | None) -> None:
        side = self._send
        link = side.ensure_link(deadline)
        n = small.pack_into(side.out_view, side.seq)
        side.seq += 1
        link.send(side.out_msg(n), deadline, header=True)
        st = side.direction.stats
        st.messages += 1
        st.transport_messages += 1
        st.wire_bytes += n
        if isinstance(small, SmallTensor):  # counted as encode() + transmit() count it
            st.payload_bytes += small.meta.raw_bytes
            reason = "disabled" if self._wire is None else self._wire.raw_reason(small.meta)
            side.wire_stats.count([small.meta], reason)
        else:
            st.payload_bytes += n - FIXED.size

    def _do_recv(self, deadline: float | None) -> object:
        side = self._recv
        link = side.ensure_link(deadline)
        expected = side.seq
        side.seq += 1
        buf, view = side.headers.receive(link, deadline)
        return self._rebuild_frame(link, buf, view, expected, deadline)

    def _rebuild_frame(
        self, link: Link, buf: torch.Tensor, view: memoryview, expected: int, deadline: float | None
    ) -> object:
        """The rest of a frame whose header message is in ``buf``: receive, rebuild."""
        side = self._recv
        got = read_frame(
            link,
            buf,
            view,
            expected,
            deadline,
            self.links.recv_pool,
            self._wire,
            side.wire_stats,
            header_received=True,
            gate=side.gate,
        )
        st = side.direction.stats
        st.messages += 1
        st.transport_messages += got.transport_messages
        st.payload_bytes += got.payload_bytes
        st.wire_bytes += got.wire_bytes
        try:
            return rebuild(
                got.kind,
                got.flags,
                got.metas,
                got.names,
                got.obj,
                got.tensors,
                object_policy=self.config.object_policy,
                object_allowlist=self.config.object_allowlist,
            )
        except ObjectRefusedError as exc:  # the frame is off the wire: the direction is fine
            refused = ObjectRefusedError(
                f"p2p[{self.name}]: refused a {KIND_NAMES[got.kind]} payload from"
                f" {self.peer_name!r}: {exc}"
            )
            refused.__cause__ = exc
            raise CleanFailure(refused) from exc
        except Exception as exc:
            err = CollectiveError(
                f"p2p[{self.name}]: received a {KIND_NAMES[got.kind]} payload from"
                f" {self.peer_name!r} but could not rebuild it: {exc}"
            )
            err.__cause__ = exc
            raise CleanFailure(err) from exc

    def _do_send_tensor(self, payload: torch.Tensor, ready: float, deadline: float | None) -> None:
        side = self._send
        link = side.ensure_link(deadline)
        n = payload.numel()
        inline = n <= HEADER_MAX_TENSOR
        head = pack_raw_header(side.out_view, side.seq, n, inline)
        side.seq += 1
        if self._pacer is not None:
            sizes = [head + n] if inline else [head, n]
            paced = self._pacer.release(sizes, ready, deadline, side.out_view)
            side.wire_stats.add_seconds(emulated=paced)
        if inline:  # one message: header and bytes
            side.out[head : head + n].copy_(payload)
            link.send(side.out_msg(head + n), deadline, header=True)
        else:  # a header the receiver checks, then the bytes straight into its tensor
            link.send_pair(side.out_msg(head), payload, deadline)
        st = side.direction.stats
        st.messages += 1
        st.transport_messages += 1 if inline else 2
        st.payload_bytes += n
        st.wire_bytes += head + n

    def _do_recv_tensor(
        self, tensor: torch.Tensor, flat: torch.Tensor, deadline: float | None
    ) -> torch.Tensor:
        side = self._recv
        link = side.ensure_link(deadline)
        expected = side.seq
        side.seq += 1
        n = flat.numel()
        buf, view = side.headers.receive(link, deadline)
        received_at = time.monotonic()
        hdr = parse_fixed(view, expected, self.peer_name)
        if hdr.kind != Kind.RAW:
            raise FramingError(
                f"p2p[{self.name}]: recv_tensor() got a {KIND_NAMES[hdr.kind]} frame from"
                f" {self.peer_name!r}; the peer called send() instead of send_tensor()"
            )
        if hdr.wire_total != n:
            raise FramingError(
                f"p2p[{self.name}]: recv_tensor() was given a tensor of {n} bytes but"
                f" {self.peer_name!r} sent {hdr.wire_total} bytes with send_tensor()"
            )
        inline = bool(hdr.flags & Flag.INLINE)
        if inline != (n <= HEADER_MAX_TENSOR):
            raise FramingError(
                f"p2p[{self.name}]: send_tensor() header from {self.peer_name!r} has flags"
                f" {hdr.flags:#x}, inconsistent with its {n} bytes"
            )
        if inline:
            flat.copy_(buf[FIXED.size : FIXED.size + n])
        else:
            link.recv(flat, deadline)
        arrival = side.gate.arrival(hdr.arrive_ns, hdr.hold_us, received_at)
        if arrival is not None:  # emulated link: the last byte arrives n byte times later
            after = 0 if inline else n
            held = side.gate.hold(arrival, after, hdr.byte_ps, deadline)
            side.wire_stats.add_seconds(emulated=held)
        st = side.direction.stats
        st.messages += 1
        st.transport_messages += 1 if inline else 2
        st.payload_bytes += n
        st.wire_bytes += FIXED.size + n
        return tensor
