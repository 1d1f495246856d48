"""A consumer's gets are served in the order it issued them.

Its requests travel in order on its control group to the channel worker, which serves
them in turn (see ``p2p_worker._channels.server``); no Ray call can overtake another.
"""

from __future__ import annotations

import pytest

from p2p_worker import Cluster, create_channel


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
