"""Link emulation: ``cluster.net_emulation``, the sender's virtual clock, the receiver's gate.

A directed link is one direction of one group: (sender name, receiver name). Each has
a bandwidth (Mbit/s, 10**6 bit/s) and a one-way delay (ms), from the section's defaults
or from the first ``links`` override whose ``src`` / ``dst`` patterns match the two
names. Nothing is exchanged with the peer per message beyond the frame itself.

Sender (:class:`LinkPacer`), per link: a frame of ``b`` wire bytes, ready at time ``r``,
starts on the emulated link at ``s = max(r, free_at, now - delay - window)`` and
occupies it until ``free_at = s + 8 b / bandwidth``; its header arrives at ``s + 8 h /
bandwidth + delay`` (``h``: the header message's bytes). The sender waits only until at
most ``window`` bytes of the backlog remain (``free_at - window``), as a real sender
waits until its bytes fit the socket buffers, then writes the header's arrival time into
the header and sends the whole frame. So a lone message arrives ``b / bandwidth +
delay`` after it was ready, back-to-back messages stream at the full bandwidth (each
delay overlaps the next message's transmission), and ``window`` also bounds the credit a
sender can build up while its real transport was blocked.

Receiver (:class:`ArrivalGate`): holds each message of such a frame until its emulated
arrival (header arrival plus the bytes after the header at the link's byte time) before
the frame is decoded or returned.

Egress (``egress: process``): a real NIC sends one frame at a time, so a process that
sends to N peers at once shares its bandwidth among them. With ``egress: link`` (the
default) every directed link has a clock of its own, as if each had its own NIC; with
``egress: process`` the links of one sender name (one :class:`Collective`, one process in
a job) share one :class:`Egress` clock: a frame starts when the sender's egress is free,
whichever link it goes to. Each frame still takes its own link's byte time, so give the
links of one sender the same bandwidth (the NIC's) for a faithful model.
"""

from __future__ import annotations

import fnmatch
import math
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from p2p_collective._errors import CollectiveError, CollectiveTimeoutError, GroupClosedError
from p2p_collective._frames._framing import patch_arrival
from p2p_collective._validate import fail as _fail
from p2p_collective._validate import mapping as _mapping

EMULATED_WINDOW_BYTES = 4 * 1024 * 1024
"""Bytes a sender may have in flight on an emulated link before a send blocks (a socket
buffer's worth); also the most it lets through at once after its sender was held up."""

_SECTION_KEYS = ("enabled", "bandwidth_mbps", "delay_ms", "links", "egress")
EGRESS_MODES = ("link", "process")
"""``net_emulation.egress``: a clock per directed link, or one per sender (see the module)."""
_LINK_KEYS = ("src", "dst", "bandwidth_mbps", "delay_ms")


def _bandwidth(value: object, path: str) -> float | None:
    allowed = "a number of Mbit/s > 0, or null for unlimited"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, value, allowed)
    if math.isnan(value) or math.isinf(value) or value <= 0:
        raise _fail(path, value, allowed)
    return float(value)


def _delay(value: object, path: str) -> float:
    allowed = "a number of milliseconds >= 0"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, value, allowed)
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise _fail(path, value, allowed)
    return float(value)


def _egress(value: object, path: str) -> str:
    if value not in EGRESS_MODES:
        raise _fail(path, value, "'link' (a clock per directed link) or 'process' (one per sender)")
    assert isinstance(value, str)
    return value


def _pattern(value: object, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, value, "a non-empty name or fnmatch pattern such as 'actor:*'")
    return value


@dataclass(frozen=True)
class LinkEmulation:
    """Bandwidth and delay of the directed links whose names match two patterns.

    Attributes:
        src: ``fnmatch`` pattern of the sender's name (``"*"`` matches every name).
        dst: ``fnmatch`` pattern of the receiver's name.
        bandwidth_mbps: Bandwidth in Mbit/s, or None for unlimited.
        delay_ms: One-way delay in milliseconds.
    """

    src: str = "*"
    dst: str = "*"
    bandwidth_mbps: float | None = None
    delay_ms: float = 0.0

    def __post_init__(self) -> None:
        _pattern(self.src, "src")
        _pattern(self.dst, "dst")
        _bandwidth(self.bandwidth_mbps, "bandwidth_mbps")
        _delay(self.delay_ms, "delay_ms")

    def matches(self, src: str, dst: str) -> bool:
        """Whether the link from ``src`` to ``dst`` is one of these links."""
        return fnmatch.fnmatchcase(src, self.src) and fnmatch.fnmatchcase(dst, self.dst)

    def to_dict(self) -> dict[str, object]:
        """The override as a plain dict, as written under ``links``."""
        return {
            "src": self.src,
            "dst": self.dst,
            "bandwidth_mbps": self.bandwidth_mbps,
            "delay_ms": self.delay_ms,
        }


@dataclass(frozen=True)
class NetEmulationConfig:
    """Link emulation of a job (``cluster.net_emulation``), paced at each sender.

    Attributes:
        bandwidth_mbps: Default bandwidth of every directed link in Mbit/s; None leaves
            bandwidth unlimited.
        delay_ms: Default one-way delay of every directed link, in milliseconds.
        links: Per-link overrides; the first whose ``src`` / ``dst`` patterns match a
            link's sender and receiver names gives that link's bandwidth and delay.
        egress: ``"link"``: every directed link has its own clock; ``"process"``: the
            links of one sender share one egress, as a process's links share its NIC.

    Example:
        >>> cfg = NetEmulationConfig(1000.0, 0.5, (LinkEmulation("actor:*", "*", 100.0, 5.0),))
        >>> cfg.for_link("actor:0", "rollout:3").bandwidth_mbps
        100.0
        >>> cfg.for_link("rollout:3", "actor:0").bandwidth_mbps
        1000.0
    """

    bandwidth_mbps: float | None = None
    delay_ms: float = 0.0
    links: tuple[LinkEmulation, ...] = ()
    egress: str = "link"

    def __post_init__(self) -> None:
        _bandwidth(self.bandwidth_mbps, "bandwidth_mbps")
        _delay(self.delay_ms, "delay_ms")
        _egress(self.egress, "egress")
        object.__setattr__(self, "links", tuple(self.links))
        for i, link in enumerate(self.links):
            if not isinstance(link, LinkEmulation):
                raise _fail(f"links[{i}]", link, "a LinkEmulation")

    def for_link(self, src: str, dst: str) -> LinkEmulation:
        """The bandwidth and delay of the directed link from ``src`` to ``dst``."""
        for link in self.links:
            if link.matches(src, dst):
                return link
        return LinkEmulation("*", "*", self.bandwidth_mbps, self.delay_ms)

    def to_dict(self) -> dict[str, object]:
        """The section as a plain dict that :func:`parse_net_emulation` accepts."""
        out: dict[str, object] = {
            "enabled": True,
            "bandwidth_mbps": self.bandwidth_mbps,
            "delay_ms": self.delay_ms,
        }
        if self.links:
            out["links"] = [link.to_dict() for link in self.links]
        if self.egress != "link":
            out["egress"] = self.egress
        return out


def parse_net_emulation(
    section: Mapping[str, object] | None, path: str = "cluster.net_emulation"
) -> NetEmulationConfig | None:
    """Parse the ``net_emulation`` section.

    Keys: ``enabled`` (default true), ``bandwidth_mbps`` (default null: unlimited),
    ``delay_ms`` (default 0), ``links``, a list of overrides ``{src, dst,
    bandwidth_mbps, delay_ms}`` where ``src`` / ``dst`` are ``fnmatch`` patterns of the
    sender's and receiver's names (default ``"*"``) and an omitted bandwidth or delay
    inherits the section's (the first matching override wins), and ``egress``
    (default ``"link"``; ``"process"``: a sender's links share one egress, see the module).

    Args:
        section: The section as a plain dict, or None.
        path: The section's key path, for error messages.

    Returns:
        The config, or None when the section is omitted or ``enabled`` is false (a
        disabled section is still checked).

    Raises:
        ConfigError: An unknown key or a value out of range; the message names the key
            path, the value and what is allowed.

    Example:
        >>> parse_net_emulation({"bandwidth_mbps": 1000, "delay_ms": 0.5})
        NetEmulationConfig(bandwidth_mbps=1000.0, delay_ms=0.5, links=(), egress='link')
        >>> cfg = parse_net_emulation({"bandwidth_mbps": 1000,
        ...                            "links": [{"src": "actor:*", "bandwidth_mbps": 100}]})
        >>> cfg.for_link("actor:0", "rollout:0").bandwidth_mbps
        100.0
    """
    if section is None:
        return None
    sec = _mapping(section, path, _SECTION_KEYS)
    enabled = sec.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _fail(f"{path}.enabled", enabled, "true or false")
    bandwidth = _bandwidth(sec.get("bandwidth_mbps"), f"{path}.bandwidth_mbps")
    delay = _delay(sec.get("delay_ms", 0.0), f"{path}.delay_ms")
    raw_links = sec.get("links", [])
    if raw_links is None:
        raw_links = []
    if isinstance(raw_links, (str, bytes)) or not isinstance(raw_links, Sequence):
        raise _fail(f"{path}.links", raw_links, "a list of {src, dst, bandwidth_mbps, delay_ms}")
    links = []
    for i, item in enumerate(raw_links):
        where = f"{path}.links[{i}]"
        entry = _mapping(item, where, _LINK_KEYS)
        links.append(
            LinkEmulation(
                src=_pattern(entry.get("src", "*"), f"{where}.src"),
                dst=_pattern(entry.get("dst", "*"), f"{where}.dst"),
                bandwidth_mbps=_bandwidth(
                    entry.get("bandwidth_mbps", bandwidth), f"{where}.bandwidth_mbps"
                ),
                delay_ms=_delay(entry.get("delay_ms", delay), f"{where}.delay_ms"),
            )
        )
    egress = _egress(sec.get("egress", "link"), f"{path}.egress")
    return NetEmulationConfig(bandwidth, delay, tuple(links), egress) if enabled else None


def clock_id() -> str:
    """Names this process's ``CLOCK_MONOTONIC``: the kernel's boot id on Linux.

    Two processes with the same id read the same monotonic clock, so a time one of them
    writes into a frame means the same instant to the other. Elsewhere the id is unique
    to the process and receivers fall back to the relative hold.
    """
    global _CLOCK_ID
    if _CLOCK_ID is None:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                _CLOCK_ID = "boot:" + f.read().strip()
        except OSError:
            _CLOCK_ID = "process:" + uuid.uuid4().hex
    return _CLOCK_ID


_CLOCK_ID: str | None = None


def publish_clock(store: Any, prefix: str) -> None:
    """Sending side of a direction: publish whose clock its arrival times are in."""
    try:
        store.set(f"{prefix}/send/clock", clock_id())
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {prefix!r}: {exc}") from exc


def shares_clock(store: Any, prefix: str) -> bool:
    """Receiving side, after meeting the sender: whether it reads this side's clock."""
    try:
        theirs = bytes(store.get(f"{prefix}/send/clock")).decode()
    except Exception as exc:
        raise CollectiveError(f"rendezvous store failed at {prefix!r}: {exc}") from exc
    return theirs == clock_id()


def _hold(closed: threading.Event, until: float, deadline: float | None, what: str) -> float:
    """Sleep until ``until`` (monotonic) unless closed; fail at ``deadline`` if it is earlier.

    Returns:
        Seconds slept (0 when ``until`` has passed).
    """
    now = time.monotonic()
    if until <= now:
        return 0.0
    late = deadline is not None and until > deadline
    end = deadline if late and deadline is not None else until
    if closed.wait(max(end - now, 0.0)):
        raise GroupClosedError(f"{what}: the group was closed")
    slept = time.monotonic() - now
    if late:
        raise CollectiveTimeoutError(f"{what}: the emulated link delivers after the deadline")
    return slept


class Egress:
    """When a sender's emulated egress is next free: the clock its links' pacers share.

    One per sender name and process under ``egress: process`` (:meth:`of`); a pacer of
    its own under ``egress: link``. Sending threads of several groups schedule on it under
    its lock.
    """

    _shared: ClassVar[weakref.WeakValueDictionary[str, Egress]] = weakref.WeakValueDictionary()
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self.free_at = 0.0
        self.lock = threading.Lock()

    @classmethod
    def of(cls, sender: str) -> Egress:
        """The egress shared by every link of ``sender`` in this process."""
        with cls._shared_lock:
            egress = cls._shared.get(sender)
            if egress is None:
                egress = cls()
                cls._shared[sender] = egress
            return egress


class LinkPacer:
    """The virtual clock of one emulated directed link, used by its sending thread only.

    A frame (all its messages) is scheduled at once: it starts on the emulated link at
    ``max(ready, free_at, now - credit)`` and occupies it for ``8 * bytes / bandwidth``.
    The sender is released, as a real sender is once its bytes fit the socket buffers,
    when at most ``window_bytes`` of the link's backlog remain; the header then carries
    the emulated arrival so that the receiver (:class:`ArrivalGate`) holds each message
    until it would have crossed the link.

    Args:
        link: The link's bandwidth and delay.
        name: The link, for error messages.
        window_bytes: Emulated bytes in flight before a send blocks; also bounds the
            credit built up while the real transport was held up.
        egress: The clock shared with the sender's other links (``egress: process``),
            or None for a clock of this link's own.
    """

    def __init__(
        self,
        link: LinkEmulation,
        name: str,
        window_bytes: int = EMULATED_WINDOW_BYTES,
        egress: Egress | None = None,
    ) -> None:
        self.name = name
        self.bandwidth_mbps = link.bandwidth_mbps
        self.delay_ms = link.delay_ms
        mbps = link.bandwidth_mbps
        self._byte_s = 0.0 if mbps is None else 8.0 / (mbps * 1e6)
        self.byte_ps = round(self._byte_s * 1e12)
        """Picoseconds per byte, as the frame header carries it (0: unlimited)."""
        self._delay_s = link.delay_ms / 1000.0
        self._window_bytes = window_bytes
        self._window_s = window_bytes * self._byte_s
        self._credit_s = self._delay_s + self._window_s
        self._egress = egress if egress is not None else Egress()
        self._closed = threading.Event()
        self.slept_seconds = 0.0

    @classmethod
    def create(cls, config: NetEmulationConfig | None, src: str, dst: str) -> LinkPacer | None:
        """The pacer of the link from ``src`` to ``dst``, or None when it is not emulated."""
        if config is None:
            return None
        link = config.for_link(src, dst)
        if link.bandwidth_mbps is None and link.delay_ms == 0:
            return None
        egress = Egress.of(src) if config.egress == "process" else None
        return cls(link, f"{src} -> {dst}", egress=egress)

    def transfer_seconds(self, nbytes: int) -> float:
        """What ``nbytes`` take on this link alone: ``8 * nbytes / bandwidth + delay``."""
        return nbytes * self._byte_s + self._delay_s

    def release(
        self,
        sizes: Sequence[int],
        ready: float,
        deadline: float | None,
        header: memoryview | None = None,
    ) -> float:
        """Schedule a frame's messages on the link; wait until the sender may send them.

        Args:
            sizes: Wire bytes of each message of the frame, header message first.
            ready: ``time.monotonic()`` at which the frame was ready to go.
            deadline: ``time.monotonic()`` deadline of the operation, or None.
            header: The frame's packed header: the header message's emulated arrival
                (ns of ``CLOCK_MONOTONIC``, and microseconds from now) and the link's
                byte time are written into it for the receiver.

        Returns:
            Seconds waited.

        Raises:
            CollectiveTimeoutError: The sender would be released after ``deadline``
                (the pacer waits until the deadline first).
            GroupClosedError: :meth:`close` was called.
        """
        egress = self._egress
        with egress.lock:
            now = time.monotonic()
            start = max(ready, egress.free_at, now - self._credit_s)
            first = start + sizes[0] * self._byte_s + self._delay_s
            free_at = egress.free_at = start + sum(sizes) * self._byte_s
        slept = _hold(
            self._closed, free_at - self._window_s, deadline, f"emulated link {self.name}"
        )
        self.slept_seconds += slept
        if header is not None:
            hold = max(math.ceil((first - time.monotonic()) * 1e6), 0)
            patch_arrival(header, max(int(first * 1e9), 1), hold, self.byte_ps)
        return slept

    def set_bandwidth(self, mbps: float | None) -> None:
        """Change the link's bandwidth from the next frame on (None: unlimited).

        Raises:
            ConfigError: ``mbps`` is not a number > 0 or None.
        """
        _bandwidth(mbps, "bandwidth_mbps")
        self.bandwidth_mbps = mbps
        self._byte_s = 0.0 if mbps is None else 8.0 / (mbps * 1e6)
        self.byte_ps = round(self._byte_s * 1e12)
        self._window_s = self._window_bytes * self._byte_s
        self._credit_s = self._delay_s + self._window_s

    def schedule(self, nbytes: int, ready: float, deadline: float | None) -> tuple[int, int, float]:
        """Schedule one message of a chunked frame; wait until the sender may send it.

        Like :meth:`release` for a frame of one message, but returns when the message's
        *last* byte arrives, for the receiver to hold it until then.

        Returns:
            ``(arrive_ns, hold_us, slept)``: the arrival (ns of ``CLOCK_MONOTONIC``),
            the same as microseconds from now, and the seconds waited.

        Raises:
            CollectiveTimeoutError, GroupClosedError: As :meth:`release`.
        """
        egress = self._egress
        with egress.lock:
            now = time.monotonic()
            start = max(ready, egress.free_at, now - self._credit_s)
            free_at = egress.free_at = start + nbytes * self._byte_s
        end = free_at + self._delay_s
        slept = _hold(
            self._closed, free_at - self._window_s, deadline, f"emulated link {self.name}"
        )
        self.slept_seconds += slept
        hold = min(max(math.ceil((end - time.monotonic()) * 1e6), 0), (1 << 32) - 1)
        return max(int(end * 1e9), 1), hold, slept

    def close(self) -> None:
        """Wake a pacing sender; it fails with :class:`GroupClosedError`."""
        self._closed.set()

    def __repr__(self) -> str:
        return (
            f"<LinkPacer {self.name} bandwidth_mbps={self.bandwidth_mbps} delay_ms={self.delay_ms}>"
        )


class ArrivalGate:
    """The receiving end of emulated links: holds each message until it would arrive.

    One per receiving direction. A frame whose header carries an emulated arrival
    (``arrive_ns`` != 0) is delivered no earlier than that: message ``i`` of the frame is
    held until ``arrival + bytes after the header * byte time``. With a sender on the
    same kernel (:func:`clock_id`) the arrival is an instant of the shared monotonic
    clock, so a frame that waited in a buffer while this side was busy is not held again;
    otherwise it is counted from when the header was received.

    Args:
        name: The direction, for error messages.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.shared_clock = False
        """Whether the sender reads the same monotonic clock (set when the link is made)."""
        self._closed = threading.Event()

    def arrival(self, arrive_ns: int, hold_us: int, received_at: float) -> float | None:
        """The header's emulated arrival on this side's monotonic clock (None: not emulated)."""
        if not arrive_ns:
            return None
        if self.shared_clock:
            return arrive_ns * 1e-9
        return received_at + hold_us * 1e-6

    def hold(self, arrival: float, after: int, byte_ps: int, deadline: float | None) -> float:
        """Hold until the bytes ``after`` the header message have arrived too.

        ``arrival`` is the header's (:meth:`arrival`), ``byte_ps`` the link's byte time
        from the header. Returns the seconds held (see :meth:`wait`).
        """
        return self.wait(arrival + after * byte_ps * 1e-12, deadline)

    def wait(self, until: float, deadline: float | None) -> float:
        """Hold the receiving thread until ``until``; return the seconds held.

        Raises:
            CollectiveTimeoutError: ``until`` falls after ``deadline``.
            GroupClosedError: :meth:`close` was called.
        """
        return _hold(self._closed, until, deadline, f"{self.name}: emulated link")

    def close(self) -> None:
        """Wake a held receiver; it fails with :class:`GroupClosedError`."""
        self._closed.set()
