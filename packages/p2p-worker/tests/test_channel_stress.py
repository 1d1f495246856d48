"""Channels under load and under failure: many producers and consumers, dead peers, compression."""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest
import ray
import torch
from channel_helpers import settled, wait_for

from p2p_worker import (
    Channel,
    Cluster,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Worker,
    connect_channel,
    create_channel,
)

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

ONE = NodePlacementStrategy([0], cpus_per_worker=0)
STOP = "stop"


class Producer(Worker):
    def produce(self, name: str, count: int, window: int) -> int:
        """Put (rank, i) for i in range(count); ``window`` async puts in flight (0: sync)."""
        ch = self.connect_channel(name)
        pending: collections.deque[Any] = collections.deque()
        for i in range(count):
            item = (self._rank, i) if i % 2 else {"p": self._rank, "i": i, "x": torch.full((2,), i)}
            if window:
                pending.append(ch.put(item, async_op=True))
                if len(pending) >= window:
                    pending.popleft().wait(120)
            else:
                ch.put(item, timeout=120)
        for work in pending:
            work.wait(120)
        return count

    def put_raw(self, name: str, items: list[Any]) -> None:
        ch = self.connect_channel(name)
        for item in items:
            ch.put(item, timeout=60)

    def reserve_and_hang(self, name: str) -> str:
        """Take a slot like a put does, then never send the payload (the test kills us)."""
        link = self.connect_channel(name)._link()
        answer = ray.get(link.actor.put_begin.remote(link.peer, 10**6, True, None), timeout=60)
        return "ok" if answer >= 0 else f"refused ({answer})"

    def link_stats(self, prefix: str) -> dict[str, Any]:
        """Send-side counters of this process's groups whose name starts with ``prefix``."""
        out = {"payload_bytes": 0, "wire_bytes": 0}
        for name, group in self.collective.groups.items():
            if name.startswith(prefix):
                st = group.stats()["send"]
                out["payload_bytes"] += st["payload_bytes"]
                out["wire_bytes"] += st["wire_bytes"]
        return out

    def send_direct(self, peer_group: str, tensor: torch.Tensor) -> dict[str, Any]:
        self.send(tensor, peer_group, 0)
        group = self.collective.create_collective_group([self.worker_address, f"{peer_group}:0"])
        st = group.stats()["send"]
        return {"payload_bytes": st["payload_bytes"], "wire_bytes": st["wire_bytes"]}


class Consumer(Worker):
    def consume(self, name: str, batch: int) -> list[tuple[int, int]]:
        """Get items until a STOP; batches of up to ``batch`` (1: single gets)."""
        ch = self.connect_channel(name)
        got: list[tuple[int, int]] = []
        while True:
            items = (
                ch.get_batch(max_items=batch, timeout=120) if batch > 1 else [ch.get(timeout=120)]
            )
            stops = sum(1 for it in items if it == STOP)
            for it in items:
                if it != STOP:
                    got.append((it["p"], it["i"]) if isinstance(it, dict) else tuple(it))
            if stops:
                for _ in range(stops - 1):  # leave the other consumers their STOPs
                    ch.put(STOP)
                return got

    def block_on_get(self, name: str) -> Any:
        return self.connect_channel(name).get()

    def get_n(self, name: str, n: int) -> list[Any]:
        ch = self.connect_channel(name)
        return [ch.get(timeout=60) for _ in range(n)]

    def recv_direct(self, peer_group: str) -> torch.Tensor:
        return self.recv(peer_group, 0)  # type: ignore[no-any-return]

    def link_stats(self, prefix: str) -> dict[str, Any]:
        out = {"payload_bytes": 0, "wire_bytes": 0}
        for name, group in self.collective.groups.items():
            if name.startswith(prefix):
                st = group.stats()["recv"]
                out["payload_bytes"] += st["payload_bytes"]
                out["wire_bytes"] += st["wire_bytes"]
        return out


@pytest.mark.slow
def test_four_producers_four_consumers_every_item_once_in_order(cluster: Cluster) -> None:
    producers = Producer.create_group().launch(
        cluster, PackedPlacementStrategy(4, cpus_per_worker=0), name="prod"
    )
    consumers = Consumer.create_group().launch(
        cluster, PackedPlacementStrategy(4, cpus_per_worker=0), name="cons"
    )
    count = 2000
    ch = create_channel(cluster, "many", maxsize=64)
    t0 = time.monotonic()
    # Consumers 0-1 get one item at a time, 2-3 in batches; producers 0-1 pipeline
    # async puts, 2-3 put synchronously.
    consuming = [consumers.execute_on(r).consume("many", [1, 1, 16, 16][r]) for r in range(4)]
    producing = [
        producers.execute_on(r).produce("many", count, [16, 16, 0, 0][r]) for r in range(4)
    ]
    assert [h.wait(240)[0] for h in producing] == [count] * 4
    for _ in range(4):
        ch.put(STOP)
    results = [h.wait(240)[0] for h in consuming]
    elapsed = time.monotonic() - t0
    everything = [item for got in results for item in got]
    assert len(everything) == 4 * count
    assert sorted(everything) == [(p, i) for p in range(4) for i in range(count)]
    for got in results:  # every consumer saw each producer's items in order
        for p in range(4):
            mine = [i for q, i in got if q == p]
            assert mine == sorted(mine)
    assert all(results), "every consumer got items"
    st = settled(ch)
    assert (st["held"], st["queued"], st["failures"]) == (0, 0, 0)
    assert st["puts"] >= 4 * count + 4  # the STOPs too (consumers hand back extra ones)
    print(f"\n4x4x{count} items through one channel in {elapsed:.1f} s")


def test_a_consumer_killed_while_waiting_does_not_wedge_the_channel(cluster: Cluster) -> None:
    doomed = Consumer.create_group().launch(cluster, ONE, name="doomed")
    survivor = Consumer.create_group().launch(cluster, ONE, name="survivor")
    producer = Producer.create_group().launch(cluster, ONE, name="feeder")
    ch = create_channel(cluster, "wedge", maxsize=2, transfer_timeout=60.0)
    blocked = doomed.block_on_get("wedge")
    wait_for(lambda: ch.stats()["waiting_getters"] == 1)
    ray.kill(doomed.actors[0], no_restart=True)
    time.sleep(0.5)
    t0 = time.monotonic()
    getting = survivor.get_n("wedge", 10)
    producer.put_raw("wedge", list(range(10))).wait(120)
    assert getting.wait(120) == [list(range(10))]  # nothing lost, nothing doubled, FIFO
    assert time.monotonic() - t0 < 45  # far less than a transfer timeout per item
    st = settled(ch)
    assert (st["held"], st["queued"]) == (0, 0)
    with pytest.raises(Exception):  # noqa: B017, PT011 - the killed call fails, its kind is Ray's
        blocked.wait(30)


def test_a_producer_dead_after_taking_a_slot_frees_it(cluster: Cluster) -> None:
    zombie = Producer.create_group().launch(cluster, ONE, name="zombie")
    ch = create_channel(cluster, "slot", maxsize=1, transfer_timeout=60.0)
    assert zombie.reserve_and_hang("slot").wait(60) == ["ok"]
    assert ch.full()
    ray.kill(zombie.actors[0], no_restart=True)
    t0 = time.monotonic()
    ch.put("after", timeout=45)  # room comes back once the dead producer's link fails
    assert time.monotonic() - t0 < 45
    assert ch.get(timeout=30) == "after"
    st = settled(ch)
    assert st["failures"] == 1
    assert st["held"] == 0


def test_compression_applies_through_the_channel(ray_session: object) -> None:
    config = {"collective": {"tensor_compression": {"codec": "lz4", "min_bytes": 1024}}}
    with Cluster(num_nodes=1, config=config) as cluster:
        prod = Producer.create_group().launch(cluster, ONE, name="zprod")
        cons = Consumer.create_group().launch(cluster, ONE, name="zcons")
        tensor = torch.zeros(256 * 1024, dtype=torch.int64)  # 2 MiB, very compressible
        # The same tensor by plain Worker.send first: what compression does there.
        receiving = cons.recv_direct("zprod")
        direct = prod.send_direct("zcons", tensor).wait(60)[0]
        assert torch.equal(receiving.wait(60)[0], tensor)
        direct_ratio = direct["wire_bytes"] / max(direct["payload_bytes"], 1)
        if direct_ratio > 0.9:
            pytest.skip(
                "p2p_collective does not compress on the wire yet (Worker.send of a zero "
                f"tensor put {direct_ratio:.2f} of its bytes on the wire); nothing to compare"
            )
        ch = create_channel(cluster, "zipped", maxsize=2)
        getting = cons.get_n("zipped", 1)
        prod.put_raw("zipped", [tensor]).wait(60)
        assert torch.equal(getting.wait(60)[0][0], tensor)
        hop_in = prod.link_stats("p2pch.").wait(60)[0]
        hop_out = cons.link_stats("p2pch.").wait(60)[0]
        for hop in (hop_in, hop_out):
            assert hop["payload_bytes"] >= tensor.nbytes
            assert hop["wire_bytes"] / hop["payload_bytes"] < 0.9
        send, into, out = (h["wire_bytes"] / h["payload_bytes"] for h in (direct, hop_in, hop_out))
        print(f"\nwire/payload: send {send:.4f}, into the channel {into:.4f}, out of it {out:.4f}")
        ch.destroy()


def test_destroy_fails_waiters_and_frees_the_name(cluster: Cluster) -> None:
    ch = create_channel(cluster, "doomed_ch", maxsize=0)
    waiting = ch.get(async_op=True)
    time.sleep(0.3)
    ch.destroy()
    with pytest.raises(Exception, match=r"destroyed|died|gone"):
        waiting.wait(30)
    again = create_channel(cluster, "doomed_ch", maxsize=0)  # the name is free again
    again.put(1)
    assert again.get() == 1
    assert connect_channel(cluster, "doomed_ch") is again
    assert isinstance(again, Channel)
