"""Link emulation: ``cluster.net_emulation`` and the sender-side pacer of a directed link.

A directed link is one direction of one group: (sender name, receiver name). Each has
a bandwidth (Mbit/s, 10**6 bit/s) and a one-way delay (ms), from the section's defaults
or from the first ``links`` override whose ``src`` / ``dst`` patterns match the two
names. The sending thread paces itself with a virtual clock per link
(:class:`LinkPacer`); nothing is exchanged with the peer per message.

Virtual clock, per link: a message of ``b`` wire bytes, ready at time ``r``, starts on
the emulated link at ``s = max(r, free_at, now - delay - window)``, occupies it until
``free_at = s + 8 b / bandwidth`` and arrives at ``free_at + delay``; the sender puts it
on the real wire at that arrival time. So a lone message takes ``b / bandwidth + delay``,
back-to-back messages stream at the full bandwidth (each delay overlaps the next
message's transmission), and ``window`` bounds the credit a sender can build up while
its real transport was blocked (for instance on a receiver that posted late), the way
a receive window bounds what a real link buffers.
"""

from __future__ import annotations

import fnmatch
import math
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from p2p_collective._errors import CollectiveTimeoutError, GroupClosedError
from p2p_collective._validate import fail as _fail
from p2p_collective._validate import mapping as _mapping

EMULATED_WINDOW_BYTES = 4 * 1024 * 1024
"""Most bytes an emulated link lets through at once after its sender was held up."""

_SECTION_KEYS = ("enabled", "bandwidth_mbps", "delay_ms", "links")
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

    def to_dict(self) -> dict[str, Any]:
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

    def __post_init__(self) -> None:
        _bandwidth(self.bandwidth_mbps, "bandwidth_mbps")
        _delay(self.delay_ms, "delay_ms")
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

    def to_dict(self) -> dict[str, Any]:
        """The section as a plain dict that :func:`parse_net_emulation` accepts."""
        out: dict[str, Any] = {
            "enabled": True,
            "bandwidth_mbps": self.bandwidth_mbps,
            "delay_ms": self.delay_ms,
        }
        if self.links:
            out["links"] = [link.to_dict() for link in self.links]
        return out


def parse_net_emulation(
    section: Mapping[str, Any] | None, path: str = "cluster.net_emulation"
) -> NetEmulationConfig | None:
    """Parse the ``net_emulation`` section.

    Keys: ``enabled`` (default true), ``bandwidth_mbps`` (default null: unlimited),
    ``delay_ms`` (default 0) and ``links``, a list of overrides ``{src, dst,
    bandwidth_mbps, delay_ms}`` where ``src`` / ``dst`` are ``fnmatch`` patterns of the
    sender's and receiver's names (default ``"*"``) and an omitted bandwidth or delay
    inherits the section's. The first matching override wins.

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
        NetEmulationConfig(bandwidth_mbps=1000.0, delay_ms=0.5, links=())
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
    return NetEmulationConfig(bandwidth, delay, tuple(links)) if enabled else None


class LinkPacer:
    """The virtual clock of one emulated directed link, used by its sending thread only.

    Args:
        link: The link's bandwidth and delay.
        name: The link, for error messages.
        window_bytes: Bound on the credit built up while the real transport was held up.
    """

    def __init__(
        self, link: LinkEmulation, name: str, window_bytes: int = EMULATED_WINDOW_BYTES
    ) -> None:
        self.name = name
        self.bandwidth_mbps = link.bandwidth_mbps
        self.delay_ms = link.delay_ms
        mbps = link.bandwidth_mbps
        self._byte_s = 0.0 if mbps is None else 8.0 / (mbps * 1e6)
        self._delay_s = link.delay_ms / 1000.0
        self._credit_s = self._delay_s + window_bytes * self._byte_s
        self._free_at = 0.0
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
        return cls(link, f"{src} -> {dst}")

    def transfer_seconds(self, nbytes: int) -> float:
        """What ``nbytes`` take on this link alone: ``8 * nbytes / bandwidth + delay``."""
        return nbytes * self._byte_s + self._delay_s

    def pace(self, nbytes: int, ready: float, deadline: float | None) -> float:
        """Wait until a message of ``nbytes`` wire bytes has crossed the emulated link.

        Args:
            nbytes: Bytes of the message as it goes on the wire.
            ready: ``time.monotonic()`` at which the message was ready to go.
            deadline: ``time.monotonic()`` deadline of the operation, or None.

        Returns:
            Seconds waited.

        Raises:
            CollectiveTimeoutError: The emulated arrival falls after ``deadline`` (the
                pacer waits until the deadline first).
            GroupClosedError: :meth:`close` was called.
        """
        now = time.monotonic()
        start = max(ready, self._free_at, now - self._credit_s)
        self._free_at = start + nbytes * self._byte_s
        arrive = self._free_at + self._delay_s
        wait = arrive - now
        if wait <= 0:
            return 0.0
        late = deadline is not None and arrive > deadline
        until = deadline if late and deadline is not None else arrive
        if self._closed.wait(max(until - now, 0.0)):
            raise GroupClosedError(f"emulated link {self.name}: closed while pacing a send")
        slept = time.monotonic() - now
        self.slept_seconds += slept
        if late:
            raise CollectiveTimeoutError(
                f"emulated link {self.name}: {nbytes} bytes at {self.bandwidth_mbps} Mbit/s"
                f" and {self.delay_ms} ms delay arrive after the operation's deadline"
            )
        return slept

    def close(self) -> None:
        """Wake a pacing sender; it fails with :class:`GroupClosedError`."""
        self._closed.set()

    def __repr__(self) -> str:
        return (
            f"<LinkPacer {self.name} bandwidth_mbps={self.bandwidth_mbps} delay_ms={self.delay_ms}>"
        )
