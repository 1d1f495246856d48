"""Order: a consumer's gets are served in the order it issued them, and a put that
returned is in the channel before anything any process puts afterwards.

A process's requests travel in order on its control group to the channel worker, which
serves them in turn (see ``p2p_worker._channels._server.server``); no Ray call can overtake
another. A put whose payload travels on its own (a credit, or after a grant) completes
only with the channel worker's receipt.
"""

from __future__ import annotations

from typing import Any

import pytest
from channel_helpers import wait_for

from p2p_worker import Cluster, PackedPlacementStrategy, Worker, create_channel


class Burster(Worker):
    def burst(self, name: str, round_: int, count: int, pipelined: bool) -> int:
        """Put ``(rank, round_, i)`` for i < ``count``: blocking, or async then all waited."""
        ch = self.connect_channel(name)
        works = []
        for i in range(count):
            item = (self._rank, round_, i)
            if pipelined:
                works.append(ch.put(item, async_op=True))
            else:
                ch.put(item, timeout=60)
        for work in works:
            work.wait(60)
        return count


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_many_async_gets_of_one_consumer_get_items_in_issue_order(cluster: Cluster) -> None:
    ch = create_channel(cluster, "issue-order", maxsize=0)
    # Waiting gets first, then the items come one by one.
    works = [ch.get(async_op=True) for _ in range(40)]
    for i in range(40):
        ch.put(i, async_op=bool(i % 2))
    assert [w.wait(60) for w in works] == list(range(40))
    # Items queued first under three keys, then gets of every key interleaved.
    for i in range(30):
        ch.put(i, key=i % 3)
    keyed = [(i % 3, ch.get(key=i % 3, async_op=True)) for i in range(30)]
    for key in range(3):
        assert [w.wait(60) for k, w in keyed if k == key] == list(range(key, 30, 3))
    assert ch.qsize() == 0


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_put_that_returned_comes_before_any_later_put_of_another_process(
    cluster: Cluster,
) -> None:
    # The pattern of "producers are done, now the driver puts the end marker": once a
    # producer's call returned, its items must come out before the marker. (Puts with
    # credits used to complete when their payload left, before the channel worker had
    # it: a marker put right after could overtake them, about 1 round in 10 here.)
    producers = Burster.create_group().launch(
        cluster, PackedPlacementStrategy(4, cpus_per_worker=0), name="bursters"
    )
    ch = create_channel(cluster, "visible", maxsize=0)
    late: list[Any] = []
    for r in range(30):
        handles = [producers.execute_on(p).burst("visible", r, 8, p >= 2) for p in range(4)]
        for p, handle in enumerate(handles):
            assert handle.wait(60) == [8]
            ch.put(("mark", p, r))
        got = [ch.get(timeout=60) for _ in range(4 * 9)]
        for p in range(4):
            mark = got.index(("mark", p, r))
            late += [item for item in got[mark:] if item[0] == p]
            assert sorted(i for q, _, i in got if q == p) == list(range(8))
    assert late == [], f"items that came after the marker put once their put returned: {late}"
    # Unused credits are handed back within 50 ms (until then qsize may count them).
    wait_for(lambda: ch.qsize() == 0)
    ch.destroy()
