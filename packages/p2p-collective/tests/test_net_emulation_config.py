"""``cluster.net_emulation``: parsing, per-link overrides and the pacer's virtual clock."""

from __future__ import annotations

import sys
import time

import pytest

from p2p_asyncwork import ConfigError
from p2p_collective import (
    EMULATED_WINDOW_BYTES,
    CollectiveTimeoutError,
    GroupClosedError,
    LinkEmulation,
    NetEmulationConfig,
    parse_net_emulation,
)
from p2p_collective._frames._framing import _ARRIVAL, _ARRIVAL_OFFSET, FIXED
from p2p_collective._links._emulation import ArrivalGate, LinkPacer, clock_id


def test_defaults_and_the_original_keys() -> None:
    assert parse_net_emulation(None) is None
    assert parse_net_emulation({"enabled": False, "bandwidth_mbps": 5}) is None
    cfg = parse_net_emulation({"bandwidth_mbps": 1000, "delay_ms": 0.5})
    assert cfg == NetEmulationConfig(1000.0, 0.5, ())
    assert parse_net_emulation({}) == NetEmulationConfig(None, 0.0, ())
    assert cfg is not None
    assert cfg.to_dict() == {"enabled": True, "bandwidth_mbps": 1000.0, "delay_ms": 0.5}
    assert parse_net_emulation(cfg.to_dict()) == cfg


def test_links_override_per_directed_link_first_match_wins() -> None:
    cfg = parse_net_emulation(
        {
            "bandwidth_mbps": 1000,
            "delay_ms": 1,
            "links": [
                {"src": "actor:*", "dst": "rollout:*", "bandwidth_mbps": 100, "delay_ms": 5},
                {"src": "actor:*", "delay_ms": 2},  # bandwidth inherited
                {"dst": "p2p_driver*", "bandwidth_mbps": None},  # unlimited, delay inherited
            ],
        }
    )
    assert cfg is not None
    assert cfg.for_link("actor:0", "rollout:3") == LinkEmulation("actor:*", "rollout:*", 100.0, 5.0)
    assert cfg.for_link("actor:0", "critic:0") == LinkEmulation("actor:*", "*", 1000.0, 2.0)
    assert cfg.for_link("rollout:3", "actor:0") == LinkEmulation("*", "*", 1000.0, 1.0)
    assert cfg.for_link("rollout:3", "p2p_driver.12:0") == LinkEmulation(
        "*", "p2p_driver*", None, 1.0
    )
    assert parse_net_emulation(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("section", "path", "fragment"),
    [
        ({"bandwidth": 1}, "cluster.net_emulation.bandwidth", "unknown key"),
        ({"bandwidth_mbps": 0}, "cluster.net_emulation.bandwidth_mbps", "> 0"),
        ({"bandwidth_mbps": -3}, "cluster.net_emulation.bandwidth_mbps", "> 0"),
        ({"bandwidth_mbps": "fast"}, "cluster.net_emulation.bandwidth_mbps", "Mbit/s"),
        ({"bandwidth_mbps": float("inf")}, "cluster.net_emulation.bandwidth_mbps", "> 0"),
        ({"delay_ms": -1}, "cluster.net_emulation.delay_ms", ">= 0"),
        ({"delay_ms": True}, "cluster.net_emulation.delay_ms", ">= 0"),
        ({"enabled": "yes"}, "cluster.net_emulation.enabled", "true or false"),
        ({"links": {"src": "a"}}, "cluster.net_emulation.links", "a list"),
        ({"links": ["a"]}, "cluster.net_emulation.links[0]", "a mapping"),
        ({"links": [{"from": "a"}]}, "cluster.net_emulation.links[0].from", "unknown key"),
        ({"links": [{"src": ""}]}, "cluster.net_emulation.links[0].src", "pattern"),
        ({"links": [{"dst": 3}]}, "cluster.net_emulation.links[0].dst", "pattern"),
        (
            {"links": [{}, {"bandwidth_mbps": 0}]},
            "cluster.net_emulation.links[1].bandwidth_mbps",
            "> 0",
        ),
        ("fast", "cluster.net_emulation", "a mapping"),
    ],
)
def test_bad_values_name_the_key_path(section: object, path: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_net_emulation(section)  # type: ignore[arg-type]
    assert info.value.path == path
    assert path in str(info.value)
    assert fragment in str(info.value)


def test_a_disabled_section_is_still_checked() -> None:
    with pytest.raises(ConfigError):
        parse_net_emulation({"enabled": False, "delay_ms": -1})


def test_pacer_only_for_emulated_links() -> None:
    cfg = NetEmulationConfig(None, 0.0, (LinkEmulation("a", "b", 10.0, 0.0),))
    assert LinkPacer.create(None, "a", "b") is None
    assert LinkPacer.create(cfg, "b", "a") is None  # nothing to emulate on that link
    pacer = LinkPacer.create(cfg, "a", "b")
    assert pacer is not None
    assert pacer.transfer_seconds(1_250_000) == pytest.approx(1.0)


def release(
    pacer: LinkPacer, sizes: list[int], ready: float, deadline: float | None
) -> tuple[float, int, int]:
    """``(seconds waited, arrive_ns, hold_us)``: what the pacer writes into a header."""
    header = bytearray(FIXED.size)
    slept = pacer.release(sizes, ready, deadline, memoryview(header))
    arrive_ns, hold_us, _ = _ARRIVAL.unpack_from(header, _ARRIVAL_OFFSET)
    return slept, arrive_ns, hold_us


def test_virtual_clock_streams_at_the_bandwidth_and_adds_the_delay_once() -> None:
    # 80 Mbit/s: 100_000 bytes take 10 ms; 200 ms delay. Five frames ready at once go back
    # to back: the last arrives after 5 * 10 ms + 200 ms, not five delays.
    pacer = LinkPacer(
        LinkEmulation(bandwidth_mbps=80.0, delay_ms=200.0), "a -> b", window_bytes=100_000
    )
    ready = time.monotonic()
    arrivals = []
    for _ in range(5):
        _, arrive_ns, _ = release(pacer, [100_000], ready, None)
        arrivals.append(arrive_ns * 1e-9)
    # frame k arrives (k + 1) * 10 ms + 200 ms after ready; the sender was held until at
    # most 100_000 bytes (one frame) of the backlog remained: 40 ms
    assert [a - ready for a in arrivals] == pytest.approx([0.21, 0.22, 0.23, 0.24, 0.25], abs=1e-3)
    assert 0.04 - 0.002 <= time.monotonic() - ready < 0.5
    # a lone frame once the link is idle: bytes / bandwidth + delay, sender not held
    time.sleep(max(ready + 0.05 - time.monotonic(), 0.0) + 0.005)
    t0 = time.monotonic()
    slept, arrive_ns, hold_us = release(pacer, [100_000], t0, None)
    assert slept == 0.0
    assert arrive_ns * 1e-9 - t0 == pytest.approx(0.21, abs=1e-3)
    assert hold_us * 1e-6 == pytest.approx(0.21, abs=2e-3)
    assert pacer.byte_ps == 100_000  # 8 bit / 80 Mbit/s = 100 ns per byte


def test_credit_is_bounded_by_the_window() -> None:
    pacer = LinkPacer(LinkEmulation(bandwidth_mbps=8.0, delay_ms=0.0), "a -> b", window_bytes=1000)
    ready = time.monotonic() - 10.0  # ready long ago, as if the transport had been held up
    t0 = time.monotonic()
    # 1000 bytes of credit (1 ms): the first frame's 1000 bytes have "arrived" already; the
    # second's 2000 bytes take 2 ms more, of which the sender waits 1 ms (its window)
    _, first, _ = release(pacer, [1000], ready, None)
    assert first * 1e-9 <= t0 + 1e-4
    _, second, _ = release(pacer, [2000], ready, None)
    assert second * 1e-9 - t0 == pytest.approx(0.002, abs=5e-4)
    assert time.monotonic() - t0 >= 0.0008
    assert EMULATED_WINDOW_BYTES == 4 * 1024 * 1024


def test_pacing_past_the_deadline_times_out_and_close_wakes_the_sender() -> None:
    pacer = LinkPacer(LinkEmulation(bandwidth_mbps=8.0, delay_ms=0.0), "a -> b", window_bytes=0)
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match="a -> b"):
        release(pacer, [1_000_000], t0, t0 + 0.05)  # needs 1 s
    assert time.monotonic() - t0 < 0.5
    pacer2 = LinkPacer(LinkEmulation(bandwidth_mbps=8.0, delay_ms=0.0), "a -> b", window_bytes=0)
    pacer2.close()
    with pytest.raises(GroupClosedError):
        release(pacer2, [1_000_000], time.monotonic(), None)


def test_arrival_gate_holds_until_the_arrival_on_either_clock() -> None:
    gate = ArrivalGate("b <- a")
    assert gate.arrival(0, 0, time.monotonic()) is None  # not an emulated frame
    now = time.monotonic()
    # another kernel's clock: counted from when this side received the header
    assert gate.arrival(123, 50_000, now) == pytest.approx(now + 0.05)
    gate.shared_clock = True  # same kernel: the sender's instant as it is
    assert gate.arrival(int((now + 0.05) * 1e9), 999_999, now) == pytest.approx(now + 0.05)
    held = gate.wait(now + 0.05, None)
    assert time.monotonic() >= now + 0.05
    assert 0.0 < held <= 0.05 + 0.01
    assert gate.wait(now, None) == 0.0  # passed: no hold
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError, match="b <- a"):
        gate.wait(t0 + 10, t0 + 0.05)
    assert time.monotonic() - t0 < 0.5
    gate.close()
    with pytest.raises(GroupClosedError):
        gate.wait(time.monotonic() + 10, None)


def test_clock_id_names_this_kernel() -> None:
    cid = clock_id()
    assert cid == clock_id()
    if sys.platform == "linux":
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            assert cid == "boot:" + f.read().strip()


def test_egress_is_parsed_checked_and_round_trips() -> None:
    cfg = parse_net_emulation({"bandwidth_mbps": 1000, "egress": "process"})
    assert cfg == NetEmulationConfig(1000.0, 0.0, (), "process")
    assert cfg is not None
    assert cfg.to_dict()["egress"] == "process"
    assert parse_net_emulation(cfg.to_dict()) == cfg
    assert "egress" not in NetEmulationConfig(1000.0).to_dict()  # the default stays implicit
    with pytest.raises(ConfigError, match=r"cluster\.net_emulation\.egress.*'link'.*'process'"):
        parse_net_emulation({"egress": "node"})
    with pytest.raises(ConfigError, match="egress"):
        NetEmulationConfig(1000.0, egress="nic")


def test_links_of_one_sender_share_its_egress_under_egress_process() -> None:
    # 8 Mbit/s: 10_000 bytes take 10 ms. Two links of one sender, a frame each, ready at
    # once: with one egress the second starts when the first has left (arrives at 20 ms);
    # with a clock per link both arrive at 10 ms.
    shared = NetEmulationConfig(8.0, 0.0, (), "process")
    a = LinkPacer.create(shared, "hub-egress-test", "spoke0")
    b = LinkPacer.create(shared, "hub-egress-test", "spoke1")
    other = LinkPacer.create(shared, "another-sender", "spoke0")
    assert a is not None
    assert b is not None
    assert other is not None
    ready = time.monotonic()
    arrivals = [release(p, [10_000], ready, None)[1] * 1e-9 - ready for p in (a, b, other)]
    assert arrivals == pytest.approx([0.01, 0.02, 0.01], abs=1e-3)
    per_link = NetEmulationConfig(8.0, 0.0, ())
    c = LinkPacer.create(per_link, "hub-egress-test2", "spoke0")
    d = LinkPacer.create(per_link, "hub-egress-test2", "spoke1")
    assert c is not None
    assert d is not None
    ready = time.monotonic()
    arrivals = [release(p, [10_000], ready, None)[1] * 1e-9 - ready for p in (c, d)]
    assert arrivals == pytest.approx([0.01, 0.01], abs=1e-3)
