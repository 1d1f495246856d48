"""Fails loudly when torch changes a private API p2p-collective relies on.

Every private name is used only in ``p2p_collective._links._torch_gloo``; this checks that each
still exists with the fields used, and that the adapter builds a working process group.
"""

from __future__ import annotations

import datetime
import threading

import pytest
import torch
import torch.distributed as dist

from p2p_collective._links._torch_gloo import make_device, new_gloo_group, op_options

pytestmark = pytest.mark.timeout(60)


def test_gloo_options_still_has_the_private_fields_used() -> None:
    make = getattr(dist.ProcessGroupGloo, "_Options", None)
    assert make is not None, "torch dropped ProcessGroupGloo._Options: update _torch_gloo"
    opts = make()
    for field in ("_devices", "_timeout", "_threads"):
        assert hasattr(opts, field), f"ProcessGroupGloo._Options lost {field}: update _torch_gloo"
    opts._threads = 1
    opts._timeout = datetime.timedelta(seconds=3)
    assert opts._threads == 1
    assert opts._timeout == datetime.timedelta(seconds=3)


def test_allgather_options_is_still_where_it_is_taken_from() -> None:
    c10d = torch._C._distributed_c10d
    assert hasattr(c10d, "AllgatherOptions"), "AllgatherOptions moved: update _torch_gloo"
    for cls in ("AllgatherOptions", "AllreduceOptions", "BroadcastOptions", "ReduceOptions"):
        opts = op_options(cls, datetime.timedelta(seconds=2))
        assert opts.timeout == datetime.timedelta(seconds=2)
    assert op_options("ReduceOptions", datetime.timedelta(seconds=1), rootRank=1).rootRank == 1
    with pytest.raises(ValueError, match="AllgatherOptions"):
        op_options("ScatterOptions", datetime.timedelta(seconds=1))


def test_the_adapter_builds_a_working_two_rank_group_bound_to_loopback() -> None:
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    device = make_device("127.0.0.1")
    groups: list[object] = [None, None]

    def build(rank: int) -> None:
        client = dist.TCPStore("127.0.0.1", store.port, is_master=False)  # one per rank
        groups[rank] = new_gloo_group(
            client, "adapter", rank, 2, device, datetime.timedelta(seconds=30), 1
        )

    threads = [threading.Thread(target=build, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    a, b = groups
    assert a is not None
    assert b is not None
    out = torch.zeros(4, dtype=torch.uint8)
    recv = b.recv([out], 0, 0)  # type: ignore[attr-defined]
    a.send([torch.arange(4, dtype=torch.uint8)], 1, 0).wait()  # type: ignore[attr-defined]
    recv.wait()
    assert out.tolist() == [0, 1, 2, 3]
