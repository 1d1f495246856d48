"""CollectiveGroup: the ordered, framed, asynchronous two-party channel."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Literal, TypeVar, overload

import torch

from p2p_asyncwork import AsyncResultWork
from p2p_asyncwork.internal import CONFIGURED, check_timeout
from p2p_collective._compression import (
    Outgoing,
    WireCodec,
    wire_fingerprint,
)
from p2p_collective._config import CollectiveConfig
from p2p_collective._deadline import deadline_after
from p2p_collective._errors import (
    CollectiveError,
)
from p2p_collective._frames._framing import (
    HEADER_MAX,
    KIND_NAMES,
)
from p2p_collective._frames._payload import (
    SMALL_OBJECT_MAX,
    check_tensor,
    encode,
    encode_small,
    encode_small_tensor,
    flat_bytes,
)
from p2p_collective._groups._group_ops import GroupOps, Unready
from p2p_collective._groups._group_peer import GroupPeer
from p2p_collective._groups._side import Side
from p2p_collective._links._emulation import LinkPacer
from p2p_collective._links._transport import LinkFactory, StoreLike
from p2p_collective._peers._auth import JobAuth
from p2p_collective._peers._peer import Life, Peer, dead_error, new_instance
from p2p_compress import CompressionError

T = TypeVar("T")

_BUFFERED_TRANSPORTS = frozenset({"shm"})
"""Links whose small send completes without the peer (``send(eager=True)`` runs inline)."""


class CollectiveGroup(GroupPeer, GroupOps):
    """Ordered, asynchronous point-to-point channel between this process and one peer.

    Create it with :meth:`Collective.create_collective_group`. Each direction (this side
    sending, this side receiving) has its own gloo process group, FIFO queue and thread,
    so messages of one direction never interleave and always arrive in order. Process
    groups are created lazily, at the first operation of each direction; that operation
    waits up to ``init_timeout`` for the peer's first matching operation.

    Timeouts: every call takes ``timeout`` (seconds, from the call to completion,
    queueing included); ``None`` means the configured default ``op_timeout`` (1800 s
    unless configured). A sending call refuses bad input with ``ValueError`` before
    anything is queued; all other failures complete the operation's handle with a
    :class:`CollectiveError`, and failures that may have left bytes on the wire break
    that direction (later operations raise :class:`GroupBrokenError`).

    Pairing: ``send``/``recv`` and ``send_tensor``/``recv_tensor`` must be paired in the
    same order on both sides, ``recv_tensor`` with a tensor of the sent size. A mismatch
    is reported as :class:`FramingError` (every operation starts with a header message
    of at most ``HEADER_MAX`` bytes that names its kind, sequence number and, for
    ``send_tensor``, its size).

    Attributes:
        name: The group's key (its sorted member names, or the group name given).
        rank: This side's rank, 0 or 1 (index of its name among the sorted names).
        peer_name: The other member's name.
    """

    CPU = "cpu"
    """RLinf's name for the host device kind (``device=`` of its channel operations)."""
    ACCEL = "cuda"
    """RLinf's name for the accelerator device kind (p2p supports CUDA)."""

    def __init__(
        self,
        *,
        name: str,
        rank: int,
        self_name: str,
        peer_name: str,
        store: StoreLike,
        links: LinkFactory,
        config: CollectiveConfig,
        init_timeout: float | None,
        owner: object = None,
        on_close: Callable[[CollectiveGroup], None] | None = None,
        wire: WireCodec | None = None,
        auth: JobAuth | None = None,
        peer: Peer | None = None,
        instance: str | None = None,
    ) -> None:
        self.auth = auth  # the job token check at each direction's rendezvous (None: none)
        self._owner = owner  # keeps the Collective (and its finalizer) alive while in use
        self._on_close = on_close
        self.name = name
        self.rank = rank
        self.self_name = self_name
        self.peer_name = peer_name
        self.store = store
        self.links = links
        self.config = config
        self.init_timeout = init_timeout
        self.world_size = 2
        self._closed = False
        self._close_lock = threading.Lock()
        self._incarnation: int | None = None
        # The peer's fate: this group is bound to one life of it (see _peers/_peer.py).
        self.peer = peer if peer is not None else Peer(peer_name)
        self.instance = instance if instance is not None else new_instance()
        self._life: Life | None = None
        self._life_token = 0
        self._send = Side(self, "send")
        self._recv = Side(self, "recv")
        if wire is None and config.compression is not None:
            wire = WireCodec(config.compression, config.buffer_pool, config.compression_pipeline)
        self._wire = wire  # shared by the Collective's groups: pool, codec provider, threads
        self.decoder_threads = 0 if wire is None else wire.decoder_threads  # 0: no decoding
        # Frames up to this size travel inline (one message); eligible tensors are
        # compressed inside them too (min_bytes is the only size rule).
        self._inline_max = HEADER_MAX
        self.wire_fingerprint = wire_fingerprint(config.compression)
        # Link emulation paces this side's sends: the directed link self -> peer.
        self._pacer = LinkPacer.create(config.net_emulation, self_name, peer_name)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<CollectiveGroup {self.name!r} rank={self.rank} peer={self.peer_name!r} {state}>"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    # -- the peer's fate: see GroupPeer --------------------------------------------------

    def _submit(
        self,
        side: Side,
        run: Callable[[float | None], T],
        label: str,
        deadline: float | None,
        async_op: bool,
        eager: bool = False,
    ) -> T | AsyncResultWork[T]:
        life = self._life
        gone = None if life is None else life.gone
        if gone is not None:  # the peer is gone: fail at once, never queue
            err = dead_error(self.peer_name, f"p2p[{self.name}]: {label}", gone)
            if not async_op:
                raise err
            work: AsyncResultWork[T] = AsyncResultWork()
            work.set_exception(err)
            return work
        return side.direction.submit(
            run, label=label, deadline=deadline, async_op=async_op, eager=eager
        )

    def _deadline(self, timeout: float | None) -> float | None:
        seconds = check_timeout(timeout, none=CONFIGURED)
        return deadline_after(self.config.op_timeout if seconds is None else seconds)

    # -- send / recv of any payload -----------------------------------------------------

    @overload
    def send(
        self,
        obj: object,
        async_op: Literal[False] = ...,
        *,
        timeout: float | None = ...,
        eager: bool = ...,
    ) -> None: ...
    @overload
    def send(
        self,
        obj: object,
        async_op: Literal[True],
        *,
        timeout: float | None = ...,
        eager: bool = ...,
    ) -> AsyncResultWork[None]: ...
    @overload
    def send(
        self, obj: object, async_op: bool, *, timeout: float | None = ..., eager: bool = ...
    ) -> AsyncResultWork[None] | None: ...

    def send(
        self,
        obj: object,
        async_op: bool = False,
        *,
        timeout: float | None = None,
        eager: bool = False,
    ) -> AsyncResultWork[None] | None:
        """Send ``obj`` to the peer, in order after everything sent before.

        ``obj`` is a tensor, a list/tuple of tensors, a dict whose values are all tensors,
        a dataclass with tensor fields, or any other picklable object. The payload is
        checked and encoded at once, in the calling thread (so later changes to ``obj``
        do not affect it; tensors are not copied, so do not modify them before the send
        completes). A small header names the kind; tensor metadata travels in compact
        binary form; a small pickled object travels inline, so it costs one gloo
        message; each tensor with bytes is one more message.

        Args:
            obj: The payload. Tensors must be dense, contiguous CPU tensors.
            async_op: Return an :class:`~p2p_asyncwork.AsyncWork` at once instead of
                waiting.
            timeout: Seconds from now until the send must have completed (None: the
                configured ``op_timeout``).
            eager: With ``async_op``, send a small object (one that travels in a single
                message) at once in the calling thread when nothing else is queued in
                this direction and the link buffers small messages (the same-node
                shared-memory link: its send never waits for the peer to post a
                receive), instead of handing it to the direction's thread; the returned
                handle is then already complete (a failure is stored in it). Larger
                payloads, a busy direction and other links are queued as usual.

        Returns:
            None, or an AsyncWork whose result is None when ``async_op`` is True.

        Raises:
            ValueError: A tensor is non-contiguous, not on CPU or of an unsupported kind
                (the message names its position, e.g. ``payload['x']``), or the object
                cannot be pickled. Nothing was sent; the group stays usable.
            CollectiveTimeoutError: The peer did not join or the send did not finish in
                time.
            PeerError: The connection to the peer failed (for instance it died).
            GroupBrokenError: An earlier failure broke this direction.
            GroupClosedError: The group is closed.

        Example:
            >>> group.send({"step": 3, "loss": 0.25})  # doctest: +SKIP
            >>> work = group.send([torch.ones(4)], async_op=True)  # doctest: +SKIP
            >>> work.wait()  # doctest: +SKIP
        """
        deadline = self._deadline(timeout)
        if eager:  # only where a small send never waits for the peer to post a receive
            link = self._send.link
            eager = link is not None and link.transport in _BUFFERED_TRANSPORTS
        small = encode_small(obj)
        if small is not None and len(small.data) <= SMALL_OBJECT_MAX and self._pacer is None:
            # The lean path: one pickling, one copy into the send buffer, one message.
            return self._submit(
                self._send,
                lambda dl: self._do_send_small(small, dl),
                "send(object)",
                deadline,
                async_op,
                eager,
            )
        if small is None and isinstance(obj, torch.Tensor) and self._pacer is None:
            lean = encode_small_tensor(obj, inline_max=self._inline_max)
            if lean is not None and (self._wire is None or not self._wire.eligible(lean.meta)):
                # one tensor that fits the header message: one copy, one message
                return self._submit(
                    self._send,
                    lambda dl: self._do_send_small(lean, dl),
                    "send(tensor)",
                    deadline,
                    async_op,
                )
        frame = encode(
            obj, pickled=None if small is None else small.data, inline_max=self._inline_max
        )
        try:
            out = Outgoing.prepare(self._wire, frame, async_op, self._send.wire_stats)
        except CompressionError as exc:
            raise CollectiveError(
                f"p2p[{self.name}]: compressing the payload failed: {exc}"
            ) from exc
        return self._submit(
            self._send,
            lambda dl: self._do_send(out, dl),
            f"send({KIND_NAMES[frame.kind]})",
            deadline,
            async_op,
        )

    @overload
    def recv(self, async_op: Literal[False] = ..., *, timeout: float | None = ...) -> object: ...
    @overload
    def recv(
        self, async_op: Literal[True], *, timeout: float | None = ...
    ) -> AsyncResultWork[object]: ...
    @overload
    def recv(self, async_op: bool, *, timeout: float | None = ...) -> object: ...

    def recv(self, async_op: bool = False, *, timeout: float | None = None) -> object:
        """Receive the next object the peer sent with :meth:`send`.

        Tensors arrive in freshly allocated CPU tensors of the sent dtype and shape;
        containers keep their type (list, tuple, dict / OrderedDict with key order,
        dataclass with its other fields).

        Args:
            async_op: Return an AsyncWork at once instead of waiting.
            timeout: Seconds from now until the object must have arrived (None: the
                configured ``op_timeout``).

        Returns:
            The object, or an AsyncWork whose result is the object.

        Raises:
            FramingError: The peer sent something else (for instance it called
                ``send_tensor``); the receive direction is broken.
            CollectiveTimeoutError: Nothing arrived in time.
            PeerError: The connection failed, for instance because the peer died.
            CollectiveError: The object could not be unpickled (the direction stays
                usable).
            GroupBrokenError: An earlier failure broke this direction.
            GroupClosedError: The group is closed.

        Example:
            >>> obj = group.recv(timeout=30.0)  # doctest: +SKIP
            >>> work = group.recv(async_op=True)  # doctest: +SKIP
            >>> shapes = work.then(lambda o: {k: v.shape for k, v in o.items()})  # doctest: +SKIP
        """
        deadline = self._deadline(timeout)
        return self._submit(self._recv, self._do_recv, "recv()", deadline, async_op)

    def recv_fileno(self) -> int | None:
        """A descriptor that turns readable when the peer's next message may be there.

        For an event loop that receives without a thread: watch it (asyncio's
        ``loop.add_reader``) and call :meth:`recv_nowait` whenever it is readable. None
        until this side's receiving link is connected (after its first receive) and for
        transports without one (gloo between nodes: use ``recv(async_op=True)``).
        """
        link = self._recv.link
        return None if link is None or self._closed else link.fileno()

    def recv_nowait(self) -> object:
        """The next object if it has arrived whole as one message; never waits.

        Meant for the reader of :meth:`recv_fileno`. Only a plain object that travels in
        one message (no tensors, at most ``SMALL_OBJECT_MAX`` pickled bytes, sent with
        :meth:`send`) is taken here; anything else stays on the wire for :meth:`recv`.

        Returns:
            The object, or :attr:`Unready.EMPTY` (nothing whole has arrived yet, or
            another receive of this group runs now) or :attr:`Unready.LARGE` (the next
            frame is larger: take it with ``recv()``; that receive may be asynchronous,
            then call this again once it completed).

        Raises:
            CollectiveError: No receiving link with a descriptor (see
                :meth:`recv_fileno`), or the object could not be unpickled (the
                direction stays usable).
            PeerError: The peer closed or died; the receive direction is broken.
            FramingError: The stream is out of step; the receive direction is broken.
            GroupBrokenError, GroupClosedError: As for :meth:`recv`.
        """
        side = self._recv
        if side.nowait is None:  # checked once: a link keeps its descriptor
            link = side.link
            if link is None or link.fileno() is None:
                raise CollectiveError(
                    f"p2p[{self.name}]: recv_nowait() needs a link with a descriptor"
                    " (recv_fileno() is None: not connected yet, or a gloo link)"
                )
            scratch = torch.zeros(HEADER_MAX, dtype=torch.uint8)
            side.nowait = (scratch, scratch.numpy().data)
        life = self._life
        gone = None if life is None else life.gone
        if gone is not None:
            raise dead_error(self.peer_name, f"p2p[{self.name}]: recv_nowait()", gone)
        ran, got = side.direction.run_if_idle(self._do_recv_nowait, "recv_nowait()")
        return got if ran else Unready.EMPTY

    # -- send_tensor / recv_tensor --------------------------------------------------------

    @overload
    def send_tensor(
        self, tensor: torch.Tensor, async_op: Literal[False] = ..., *, timeout: float | None = ...
    ) -> None: ...
    @overload
    def send_tensor(
        self, tensor: torch.Tensor, async_op: Literal[True], *, timeout: float | None = ...
    ) -> AsyncResultWork[None]: ...
    @overload
    def send_tensor(
        self, tensor: torch.Tensor, async_op: bool, *, timeout: float | None = ...
    ) -> AsyncResultWork[None] | None: ...

    def send_tensor(
        self, tensor: torch.Tensor, async_op: bool = False, *, timeout: float | None = None
    ) -> AsyncResultWork[None] | None:
        """Send one tensor's bytes, with a 56-byte header (the size) and no metadata.

        Up to 128 KiB minus the header, the bytes ride in the header message (one gloo
        message); larger tensors are one more message, received straight into the
        peer's tensor.

        Pair it with :meth:`recv_tensor` on the peer, given a tensor of the same number of
        bytes. Never compressed.

        Args:
            tensor: A dense, contiguous CPU tensor.
            async_op: Return an AsyncWork at once instead of waiting.
            timeout: Seconds from now until the send must have completed (None: the
                configured ``op_timeout``).

        Returns:
            None, or an AsyncWork whose result is None.

        Raises:
            TypeError: ``tensor`` is not a tensor.
            ValueError: ``tensor`` is non-contiguous, not on CPU or unsupported.
            CollectiveTimeoutError, PeerError, GroupBrokenError, GroupClosedError: As
                for :meth:`send`.

        Example:
            >>> group.send_tensor(torch.arange(1024))  # doctest: +SKIP
        """
        payload = self._raw_view(tensor, "send_tensor(tensor)")
        deadline = self._deadline(timeout)
        ready = time.monotonic()
        return self._submit(
            self._send,
            lambda dl: self._do_send_tensor(payload, ready, dl),
            "send_tensor()",
            deadline,
            async_op,
        )

    @overload
    def recv_tensor(
        self, tensor: torch.Tensor, async_op: Literal[False] = ..., *, timeout: float | None = ...
    ) -> torch.Tensor: ...
    @overload
    def recv_tensor(
        self, tensor: torch.Tensor, async_op: Literal[True], *, timeout: float | None = ...
    ) -> AsyncResultWork[torch.Tensor]: ...
    @overload
    def recv_tensor(
        self, tensor: torch.Tensor, async_op: bool, *, timeout: float | None = ...
    ) -> AsyncResultWork[torch.Tensor] | torch.Tensor: ...

    def recv_tensor(
        self, tensor: torch.Tensor, async_op: bool = False, *, timeout: float | None = None
    ) -> AsyncResultWork[torch.Tensor] | torch.Tensor:
        """Receive one :meth:`send_tensor` message into ``tensor`` (in place).

        Args:
            tensor: A dense, contiguous CPU tensor with exactly as many bytes as the
                peer's ``send_tensor``; another size is a :class:`FramingError`.
            async_op: Return an AsyncWork at once instead of waiting.
            timeout: Seconds from now until the tensor must have arrived (None: the
                configured ``op_timeout``).

        Returns:
            ``tensor``, or an AsyncWork whose result is ``tensor``.

        Raises:
            TypeError: ``tensor`` is not a tensor.
            ValueError: ``tensor`` is non-contiguous, not on CPU or unsupported.
            FramingError: The peer called :meth:`send` instead of :meth:`send_tensor`,
                or sent a different number of bytes; the receive direction is broken.
            CollectiveTimeoutError, PeerError, GroupBrokenError, GroupClosedError: As
                for :meth:`recv`.

        Example:
            >>> buf = torch.empty(1024, dtype=torch.int64)  # doctest: +SKIP
            >>> work = group.recv_tensor(buf, async_op=True)  # doctest: +SKIP
            >>> work.then(lambda t: t.sum()).wait()  # doctest: +SKIP
        """
        flat = self._raw_view(tensor, "recv_tensor(tensor)")
        deadline = self._deadline(timeout)
        return self._submit(
            self._recv,
            lambda dl: self._do_recv_tensor(tensor, flat, dl),
            "recv_tensor()",
            deadline,
            async_op,
        )

    @staticmethod
    def _raw_view(tensor: torch.Tensor, op: str) -> torch.Tensor:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{op}: expected a torch.Tensor, got {type(tensor).__name__}")
        check_tensor(tensor, "tensor", op)
        return flat_bytes(tensor)

    # -- operations (run by the direction, one at a time, in order): see GroupOps --

    # -- state ----------------------------------------------------------------------------

    def stats(self) -> dict[str, dict[str, object]]:
        """Per-direction counters.

        Returns:
            ``{"send": {...}, "recv": {...}}``; each holds ``messages`` (completed
            operations), ``payload_bytes`` (tensor bytes plus pickled object bytes),
            ``wire_bytes`` (every byte on the wire, headers included),
            ``transport_messages`` (gloo messages), ``busy_seconds`` (time spent
            executing operations), ``failures``, ``queued`` and ``broken``; and, for
            the tensors (with at least one byte) of ``send`` / ``recv`` frames,
            ``compressed_tensors``, ``raw_tensors``, ``raw_reasons`` (sender only: why
            each raw tensor stayed raw, e.g. ``{"excluded_dtype": 2, "below_min_bytes": 1}``),
            ``tensor_raw_bytes`` and ``tensor_wire_bytes`` (their bytes before and on
            the wire), ``codec_seconds`` (compressing / decoding) and
            ``emulated_seconds`` (link emulation: time the sender waited for its
            emulated link, or the receiver held frames until their emulated arrival);
            ``transport`` (``"shm"`` or ``"gloo"``, None before the direction's first
            use) and ``transport_reason`` (why not shared memory; ``""`` for shm).

        Example:
            >>> group.stats()["send"]["messages"]  # doctest: +SKIP
            3
        """
        return {
            role: {
                **side.direction.snapshot(),
                **side.wire_stats.as_dict(),
                **LinkFactory.describe(side.link),
            }
            for role, side in (("send", self._send), ("recv", self._recv))
        }

    def close(self, *, timeout: float | None = 5.0) -> None:
        """Fail queued operations, drop the process groups, let running operations end.

        Idempotent. Queued operations fail with :class:`GroupClosedError`. An operation
        already on the wire cannot be interrupted: ``close`` waits up to ``timeout`` for
        it to end (it completes, fails, or reaches its deadline; the peer closing its
        side makes it fail at once), so that no thread is still inside gloo when the
        interpreter exits. The peer's pending operations fail with :class:`PeerError`.

        Args:
            timeout: Seconds to wait for running operations and direction threads to end
                (None: no limit).

        Example:
            >>> group.close()  # doctest: +SKIP
        """
        self._begin_close()
        self._finish_close(None if timeout is None else time.monotonic() + timeout)

    def _begin_close(self) -> bool:
        """Signal the close (never blocks); False if it was already closed."""
        with self._close_lock:
            if self._closed:
                return False
            self._closed = True
        if self._pacer is not None:
            self._pacer.close()  # a send paced on the emulated link fails at once
        self._recv.gate.close()  # so does a receive held for its emulated arrival
        for side in (self._send, self._recv):
            side.direction.begin_close()
            side.close()  # drops the process group, closes the liveness connection
        if self._life is not None:
            self._life.unsubscribe(self._life_token)
        if self._on_close is not None:
            self._on_close(self)  # the Collective forgets the closed group
        self._owner = None
        return True

    def _finish_close(self, deadline: float | None) -> None:
        for side in (self._send, self._recv):
            side.direction.finish_close(deadline)
