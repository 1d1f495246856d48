"""In-process tests: configuration, argument checks, frames, the direction queue, the pool."""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections import OrderedDict
from typing import Any

import collective_tasks as ct
import pytest
import torch
from conftest import make_store

from p2p_asyncwork import ConfigError
from p2p_collective import (
    HEADER_MAX,
    Collective,
    CollectiveConfig,
    CollectiveError,
    CollectiveTimeoutError,
    FramingError,
    GroupBrokenError,
    GroupClosedError,
    parse_collective_config,
)
from p2p_collective._errors import CleanFailure
from p2p_collective._frames._framing import FIXED, Flag, parse_fixed
from p2p_collective._frames._payload import encode, rebuild
from p2p_collective._frames._recvpool import ReceiveBufferPool
from p2p_collective._groups._direction import Direction
from p2p_collective._wire._frame_io import patch_frame_seq, read_frame

# -- configuration ---------------------------------------------------------------------


def test_config_defaults_and_round_trip() -> None:
    cfg = parse_collective_config(None)
    assert cfg == CollectiveConfig()
    assert (cfg.init_timeout, cfg.op_timeout) == (60.0, 1800.0)
    assert cfg.compression is None
    assert cfg.buffer_pool.max_bytes == 2 * 1024**3
    full = parse_collective_config(
        {
            "tensor_compression": {"codec": "zstd", "level": 3},
            "tensor_buffer_pool": {"max_bytes": 1 << 20},
            "init_timeout": 5,
            "op_timeout": None,
            "recv_buffer_cache_bytes": 0,
            "shared_memory": False,
            "object_policy": "plain",
        }
    )
    assert (full.shared_memory, full.object_policy) == (False, "plain")
    assert (cfg.shared_memory, cfg.object_policy) == (True, "pickle")
    assert full.compression is not None
    assert full.compression.codec_name == "zstd"
    assert (full.init_timeout, full.op_timeout, full.recv_buffer_cache_bytes) == (5.0, None, 0)
    assert parse_collective_config(full.to_dict()) == full


@pytest.mark.parametrize(
    ("section", "path"),
    [
        ({"op_timout": 3}, "cluster.collective.op_timout"),
        ({"init_timeout": 0}, "cluster.collective.init_timeout"),
        ({"op_timeout": "1s"}, "cluster.collective.op_timeout"),
        ({"op_timeout": True}, "cluster.collective.op_timeout"),
        ({"recv_buffer_cache_bytes": -1}, "cluster.collective.recv_buffer_cache_bytes"),
        ({"shared_memory": "yes"}, "cluster.collective.shared_memory"),
        ({"object_policy": "json"}, "cluster.collective.object_policy"),
        (
            {"tensor_compression": {"codec": "lz4", "level": 3}},
            "cluster.collective.tensor_compression.level",
        ),
        (
            {"tensor_buffer_pool": {"max_bytes": 0}},
            "cluster.collective.tensor_buffer_pool.max_bytes",
        ),
    ],
)
def test_config_errors_name_the_key_path(section: dict[str, Any], path: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_collective_config(section)
    assert info.value.path == path
    assert path in str(info.value)


def test_config_rejects_a_non_mapping_section() -> None:
    with pytest.raises(ConfigError, match=r"cluster\.collective"):
        parse_collective_config([1, 2])  # type: ignore[arg-type]


# -- Collective arguments and the group cache -------------------------------------------


class Address:
    def __init__(self, name: str) -> None:
        self.name = name

    def get_name(self) -> str:
        return self.name


def test_groups_are_cached_by_sorted_names_and_ranked_by_them() -> None:
    store = make_store()
    coll = Collective(Address("worker/1"), store)
    g = coll.create_collective_group([Address("worker/1"), "worker/0"])
    assert g is coll.create_collective_group(["worker/0", "worker/1"])
    assert (g.name, g.rank, g.peer_name) == ("worker/0+worker/1", 1, "worker/0")
    named = coll.create_collective_group(["worker/1", "worker/0"], group_name="custom")
    assert named is not g
    assert named.name == "custom"
    assert set(coll.groups) == {"worker/0+worker/1", "custom"}
    named.close()
    assert set(coll.groups) == {"worker/0+worker/1"}
    assert coll.create_collective_group(["worker/1", "worker/0"], "custom") is not named
    coll.close()
    assert g.closed
    with pytest.raises(GroupClosedError):
        coll.create_collective_group(["worker/0", "worker/1"])
    with pytest.raises(GroupClosedError):
        g.send("x")


@pytest.mark.parametrize(
    ("addresses", "group_name", "error", "fragment"),
    [
        (["a"], None, ValueError, "exactly two distinct addresses"),
        (["a", "a"], None, ValueError, "exactly two distinct addresses"),
        # three or more addresses make an N-member group: duplicates and a missing own
        # address are refused there too
        (["a", "b", "b"], None, ValueError, "two or more distinct addresses"),
        (["b", "c", "d"], None, ValueError, "own address 'a'"),
        (["b", "c"], None, ValueError, "own address 'a'"),
        ("ab", None, TypeError, "sequence of two addresses"),
        (["a", 3], None, TypeError, "worker_addresses[1]"),
        (["a", ""], None, ValueError, "empty name"),
        (["a", "b"], "", ValueError, "group_name"),
    ],
)
def test_create_collective_group_rejects_bad_arguments(
    addresses: Any, group_name: Any, error: type[Exception], fragment: str
) -> None:
    coll = Collective("a", make_store())
    with pytest.raises(error) as info:
        coll.create_collective_group(addresses, group_name)
    assert fragment in str(info.value)
    coll.close()


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"host": "0.0.0.0"}, ValueError, "never a wildcard"),
        ({"host": ""}, ValueError, "host"),
        ({"timeout": -1.0}, ValueError, "timeout"),
        ({"config": {"op_timeout": 1}}, TypeError, "CollectiveConfig"),
    ],
)
def test_collective_rejects_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        Collective("a", make_store(), **kwargs)


def test_collective_rejects_an_object_that_is_not_a_store() -> None:
    with pytest.raises(TypeError, match="lacks set, add, wait"):
        Collective("a", {"set": 1, "get": 2})
    with pytest.raises(TypeError, match="get_name"):
        Collective(3, make_store())


def test_timeouts_come_from_the_config_unless_given() -> None:
    store = make_store()
    cfg = CollectiveConfig(init_timeout=7.0, op_timeout=9.0)
    assert Collective("a", store, config=cfg).init_timeout == 7.0
    assert Collective("a", store, config=cfg, timeout=None).init_timeout is None
    assert Collective("a", store, config=cfg, timeout=2).init_timeout == 2.0


# -- frames, end to end through a replaying link ----------------------------------------


class ReplayLink:
    """Plays the messages of encoded frames back to ``read_frame``, like a gloo peer."""

    peer = "replay"

    def __init__(self) -> None:
        self.messages: list[torch.Tensor] = []

    def feed(self, frame: Any, seq: int) -> None:
        patch_frame_seq(frame, seq)
        self.messages += [m.clone() for m in (*frame.header_messages(), *frame.payloads)]

    def recv(self, buf: torch.Tensor, deadline: float | None, header: bool = False) -> None:
        msg = self.messages.pop(0)
        assert msg.numel() <= buf.numel(), "a longer message would abort a real receiver"
        buf[: msg.numel()].copy_(msg)


def roundtrip(obj: Any, pool: ReceiveBufferPool | None = None) -> tuple[Any, Any]:
    link = ReplayLink()
    frame = encode(obj)
    link.feed(frame, 11)
    scratch = torch.zeros(HEADER_MAX, dtype=torch.uint8)
    got = read_frame(
        link,  # type: ignore[arg-type]
        scratch,
        scratch.numpy().data,
        11,
        None,
        pool or ReceiveBufferPool(0),
    )
    assert not link.messages
    return rebuild(got.kind, got.flags, got.metas, got.names, got.obj, got.tensors), frame


@pytest.mark.parametrize(
    ("name", "obj"), ct.make_payloads(), ids=[n for n, _ in ct.make_payloads()]
)
def test_every_payload_kind_round_trips_through_frames(name: str, obj: Any) -> None:
    from test_collective_sendrecv import same

    back, _ = roundtrip(obj)
    assert same(obj, back), (name, obj, back)


def test_small_frames_are_one_message_and_large_ones_are_split() -> None:
    _, small = roundtrip({"a": torch.ones(16), "b": torch.arange(3)})
    assert small.header_messages() == [small.buffer]
    assert not small.payloads
    assert small.wire_bytes == small.buffer.numel()
    big = torch.arange(HEADER_MAX, dtype=torch.int64)
    back, frame = roundtrip([big, torch.ones(2)])
    assert len(frame.payloads) == 2
    assert torch.equal(back[0], big)
    many_keys = {f"k{i}" * 50: torch.ones(1) for i in range(1000)}
    back, frame = roundtrip(many_keys)
    assert len(frame.header_messages()) == 2  # metadata over HEADER_MAX: extension message
    assert list(back) == list(many_keys)
    _, huge_obj = roundtrip({"blob": b"x" * (3 * HEADER_MAX)})
    assert len(huge_obj.header_messages()) == 2


def test_large_received_tensors_use_the_pool_and_blocks_come_back() -> None:
    pool = ReceiveBufferPool(64 << 20)
    t = torch.arange(1 << 19, dtype=torch.float32)  # 2 MiB
    back, _ = roundtrip({"w": t}, pool)
    assert torch.equal(back["w"], t)
    view = back["w"][10:20]
    del back
    gc.collect()
    assert pool.stats() == {"idle_bytes": 0, "hits": 0, "misses": 1}  # the view holds it
    del view
    gc.collect()
    assert pool.stats()["idle_bytes"] == 2 << 20
    again, _ = roundtrip(t.clone(), pool)
    assert pool.stats()["hits"] == 1
    assert torch.equal(again, t)


def test_pool_keeps_at_most_its_idle_budget() -> None:
    pool = ReceiveBufferPool(3 << 20)
    blocks = [pool.take(2 << 20) for _ in range(3)]
    del blocks
    gc.collect()
    assert pool.stats()["idle_bytes"] == 2 << 20  # the other two blocks were freed
    assert ReceiveBufferPool(0).take(8 << 20).numel() == 8 << 20


def test_header_checks() -> None:
    frame = encode({"x": 1})
    patch_frame_seq(frame, 4)
    view = frame.view
    assert parse_fixed(view, 4, "p").kind == 6
    with pytest.raises(FramingError, match="sequence number 4, expected 5"):
        parse_fixed(view, 5, "p")
    bad = bytearray(view)
    bad[4] = 99
    with pytest.raises(FramingError, match="version 99"):
        parse_fixed(memoryview(bad), 4, "p")
    bad = bytearray(view)
    bad[0:4] = b"XXXX"
    with pytest.raises(FramingError, match="send_tensor"):
        parse_fixed(memoryview(bad), 4, "p")
    bad = bytearray(view)
    bad[6] = Flag.EXT | Flag.INLINE
    with pytest.raises(FramingError, match="flags"):
        parse_fixed(memoryview(bad), 4, "p")
    assert FIXED.size == 56


@dataclasses.dataclass
class Unrebuildable:
    t: torch.Tensor

    def __setstate__(self, state: Any) -> None:
        raise RuntimeError("refuses to unpickle")


def test_unpicklable_payloads_are_refused_before_sending() -> None:
    with pytest.raises(ValueError, match="cannot be pickled"):
        encode(lambda: 1)
    with pytest.raises(ValueError, match=r"payload\['b'\] is not contiguous"):
        encode(OrderedDict(a=torch.ones(2), b=torch.ones(2, 3).t()))


# -- the ordered direction queue ---------------------------------------------------------


def test_direction_runs_ops_in_submission_order_across_threads_and_modes() -> None:
    d = Direction("test")
    order: list[int] = []
    gate = threading.Event()

    def op(i: int) -> Any:
        def run(deadline: float | None) -> int:
            if i == 0:
                gate.wait(5)
            order.append(i)
            return i

        return run

    works = [d.submit(op(0), label="0", deadline=None, async_op=True)]
    works += [d.submit(op(i), label=str(i), deadline=None, async_op=True) for i in range(1, 50)]
    result: list[Any] = []
    sync = threading.Thread(
        target=lambda: result.append(d.submit(op(50), label="50", deadline=None, async_op=False))
    )
    sync.start()
    time.sleep(0.05)
    gate.set()
    sync.join(5)
    assert [w.wait(timeout=5) for w in works] == list(range(50))
    assert result == [50]
    assert order == list(range(51))
    assert d.snapshot()["messages"] == 0  # ops count messages themselves
    d.close(1.0)


def test_direction_failure_breaks_it_and_clean_failures_do_not() -> None:
    d = Direction("test")

    def clean(deadline: float | None) -> None:
        raise CleanFailure(CollectiveTimeoutError("peer did not join"))

    def boom(deadline: float | None) -> None:
        raise CollectiveError("transport failed")

    with pytest.raises(CollectiveTimeoutError):
        d.submit(clean, label="clean", deadline=None, async_op=False)
    assert d.submit(lambda dl: 7, label="ok", deadline=None, async_op=False) == 7
    first = d.submit(boom, label="boom", deadline=None, async_op=True)
    assert isinstance(first.exception(timeout=5), CollectiveError)
    later = d.submit(lambda dl: 8, label="later", deadline=None, async_op=True)
    err = later.exception(timeout=5)
    assert isinstance(err, GroupBrokenError)
    assert err.__cause__ is first.exception()
    with pytest.raises(GroupBrokenError):
        d.submit(lambda dl: 9, label="sync", deadline=None, async_op=False)
    assert d.snapshot()["broken"]
    d.close(1.0)


def test_queued_op_past_its_deadline_fails_without_breaking_the_direction() -> None:
    d = Direction("test")
    gate = threading.Event()
    blocker = d.submit(lambda dl: gate.wait(5), label="slow", deadline=None, async_op=True)
    t0 = time.monotonic()
    with pytest.raises(CollectiveTimeoutError):
        d.submit(lambda dl: 1, label="late", deadline=time.monotonic() + 0.2, async_op=False)
    assert time.monotonic() - t0 < 4.0
    gate.set()
    assert blocker.wait(timeout=5) is True
    assert d.submit(lambda dl: 2, label="after", deadline=None, async_op=False) == 2
    d.close(1.0)


def test_sync_op_from_a_callback_on_the_direction_thread_does_not_deadlock() -> None:
    d = Direction("test")
    first = d.submit(lambda dl: 1, label="a", deadline=None, async_op=True)
    queued = d.submit(lambda dl: 2, label="b", deadline=None, async_op=True)
    chained = queued.then(
        lambda v: (v, d.submit(lambda dl: 3, label="c", deadline=None, async_op=False))
    )
    assert first.wait(timeout=5) == 1
    assert chained.wait(timeout=5) == (2, 3)
    d.close(1.0)


def test_close_fails_queued_ops() -> None:
    d = Direction("test")
    gate = threading.Event()
    running = d.submit(lambda dl: gate.wait(5), label="run", deadline=None, async_op=True)
    queued = [d.submit(lambda dl: 0, label="q", deadline=None, async_op=True) for _ in range(3)]
    time.sleep(0.05)
    d.close(0.1)
    assert all(isinstance(w.exception(timeout=5), GroupClosedError) for w in queued)
    gate.set()
    assert running.wait(timeout=5) is True
    with pytest.raises(GroupClosedError):
        d.submit(lambda dl: 0, label="x", deadline=None, async_op=False)
