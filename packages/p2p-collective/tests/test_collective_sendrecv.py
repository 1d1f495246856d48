"""send/recv between two real processes over real gloo on loopback."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import collective_tasks as ct
import pytest
import torch
from conftest import PeerPair

pytestmark = pytest.mark.timeout(300)


def same(a: Any, b: Any) -> bool:
    """Deep equality that also checks container types, dtypes, shapes and key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and a.requires_grad == b.requires_grad
            and torch.equal(a.detach(), b.detach())
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a.keys()) == list(b.keys()) and all(same(a[k], b[k]) for k in a)
    if dataclasses.is_dataclass(a):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return bool(a == b)


def check_payloads(received: list[Any]) -> None:
    expected = ct.make_payloads()
    assert len(received) == len(expected)
    for (name, want), got in zip(expected, received, strict=True):
        assert same(want, got), f"{name}: sent {want!r}, received {got!r}"


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_every_payload_kind_both_directions(peers: PeerPair, gname: str, async_op: bool) -> None:
    stats, received = peers.run(
        ct.t_send_payloads, (gname, async_op), ct.t_recv_payloads, (gname, async_op)
    )
    check_payloads(received)
    assert stats["messages"] == len(ct.make_payloads())
    assert stats["wire_bytes"] > stats["payload_bytes"] > 0
    received, stats = peers.run(
        ct.t_recv_payloads, (gname, async_op), ct.t_send_payloads, (gname, async_op)
    )
    check_payloads(received)


def test_received_containers_keep_their_types(peers: PeerPair, gname: str) -> None:
    _, received = peers.run(ct.t_send_payloads, (gname, False), ct.t_recv_payloads, (gname, False))
    by_name = dict(zip([n for n, _ in ct.make_payloads()], received, strict=True))
    assert type(by_name["ordered_dict"]) is OrderedDict
    assert list(by_name["dict"]) == ["b", "a", "c"]
    assert list(by_name["dict_nonstr_keys"]) == [3, (1, "x"), None]
    assert isinstance(by_name["tuple"], tuple)
    assert by_name["dataclass"].step == 42
    assert by_name["dataclass"].note == "hi"
    assert by_name["frozen_dataclass"].tag == (1, 2)
    assert by_name["requires_grad"].requires_grad
    assert by_name["none"] is None


def test_receive_posted_before_send(peers: PeerPair, gname: str) -> None:
    (obj, tensor, pending), _ = peers.run(ct.t_recv_early, (gname,), ct.t_send_late, (gname,))
    assert pending
    assert same(obj, {"late": torch.arange(3)})
    assert same(tensor, torch.arange(6, dtype=torch.float32))


def test_ten_thousand_small_messages_in_order_from_several_threads(
    peers: PeerPair, gname: str
) -> None:
    threads, per = 4, 2500
    order, got = peers.run(
        ct.t_send_many_threads, (gname, threads, per), ct.t_recv_many, (gname, threads * per)
    )
    assert len(got) == threads * per
    assert [tuple(x) for x in got] == [tuple(x) for x in order]


@pytest.mark.slow
def test_256_mib_tensors(peers: PeerPair, gname: str) -> None:
    nbytes = 256 * 1024 * 1024
    _, (ok_frame, ok_raw, payload_bytes) = peers.run(
        ct.t_send_big, (gname, nbytes), ct.t_recv_big, (gname, nbytes)
    )
    assert ok_frame
    assert ok_raw
    assert payload_bytes == 2 * nbytes + 80


def test_then_chains(peers: PeerPair, gname: str) -> None:
    out, _ = peers.run(ct.t_then_chains, (gname,), ct.t_send_for_chains, (gname,))
    assert out[0] == 6.0
    assert out[1] is True
    assert out[2] == [1.0, 2.0, 3.0, 4.0]
    assert out[3] == "second"
    assert out[4] == ("third", "fourth")


def test_bad_inputs_are_refused_and_the_group_keeps_working(peers: PeerPair, gname: str) -> None:
    messages, got = peers.run(ct.t_bad_inputs, (gname,), ct.t_recv_after_bad_inputs, (gname, 17))
    assert got == list(range(17))
    assert "NO ERROR" not in messages, messages
    expect = [
        ("ValueError", "payload is not contiguous"),
        ("ValueError", "payload[1] is not contiguous"),
        ("ValueError", "payload[0] is not contiguous"),
        ("ValueError", "payload['x'] is not contiguous"),
        ("ValueError", "payload[5] is not contiguous"),
        ("ValueError", "payload.mask is not contiguous"),
        ("ValueError", "cannot be pickled"),
        ("ValueError", "cannot be pickled"),
        ("ValueError", "is on device meta"),
        ("ValueError", "layout torch.sparse_coo"),
        ("ValueError", "send_tensor(tensor): tensor is not contiguous"),
        ("TypeError", "expected a torch.Tensor, got list"),
        ("ValueError", "recv_tensor(tensor): tensor is not contiguous"),
        ("TypeError", "expected a torch.Tensor, got str"),
        ("ValueError", "timeout: got -1.0"),
        ("ValueError", "timeout: got nan"),
        ("ValueError", "timeout: got True"),
    ]
    for msg, (kind, fragment) in zip(messages, expect, strict=True):
        assert msg.startswith(kind), (msg, kind)
        assert fragment in msg, (msg, fragment)


def test_sixteen_peers_per_process(peers: PeerPair) -> None:
    hub, spokes = peers.run(ct.t_hub, (16, 5), ct.t_spokes, (16, 5), timeout=240)
    assert hub == [5] * 16
    assert spokes == [5] * 16


def test_default_process_group_is_not_disturbed(peers: PeerPair, gname: str) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    a, b = peers.run(
        ct.t_default_pg_untouched, (gname, port), ct.t_default_pg_untouched, (gname, port)
    )
    assert a == b == [18.0, 60.0, 2.0]
