"""Two members' collectives over their pair group (``_groups._pair_ops``), without Ray.

Two spawned processes meet through a ``TCPStore``: with shared memory on, the pair
says so after its first exchange and every collective gives the reduction of both
members' tensors; with shared memory off in one member's config, both members see gloo
and fall back to it (the group's gloo process group), alike.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from pair_spawn import run_members

pytestmark = pytest.mark.timeout(120)
if os.environ.get("P2P_TEST_TRANSPORT", "shm") == "gloo":
    # These members pick their transports themselves (pair_spawn): the rerun adds nothing.
    pytest.skip("P2P_TEST_TRANSPORT=gloo: the suite runs over gloo", allow_module_level=True)


def _pair_body(coll: Any, rank: int, key: str) -> tuple[bool, list[bool]]:
    from p2p_collective.internal import PairCollectives

    pair = coll.create_pair_group([f"{key}-0", f"{key}-1"], group_name=f"{key}/coll")
    two = PairCollectives(pair, rank)
    on_shm = two.connect(60)
    results = []
    if on_shm:
        for n in (5, 300_000):  # sent inline, then from the pair's sending thread
            t = torch.arange(n, dtype=torch.float32) + rank
            two.allreduce(t, "sum", 60)
            results.append(bool(torch.equal(t, 2 * torch.arange(n, dtype=torch.float32) + 1)))
            m = torch.full((n,), float(rank))
            two.reduce(m, 1, "max", 60)
            results.append(bool(torch.equal(m, torch.full((n,), float(rank)))))
        two.barrier(60)
    return on_shm, results


def _run(shm: tuple[bool, bool], key: str) -> list[Any]:
    return run_members(_pair_body, key, shm)


def test_on_one_node_the_pair_runs_on_shared_memory_with_gloo_results() -> None:
    assert _run((True, True), "pc-on") == [(0, True, [True] * 4), (1, True, [True] * 4)]


def test_shared_memory_off_in_one_member_sends_both_back_to_gloo() -> None:
    assert _run((True, False), "pc-off") == [(0, False, []), (1, False, [])]
