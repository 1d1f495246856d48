"""A channel between workers: a FIFO queue with real flow control.

Runs on its own: ``python docs/examples/channels.py``. A consumer creates the channel,
a producer connects to it by name, and items -- tensors, dicts of tensors, any object --
flow through it in order. ``maxsize`` bounds what the channel holds at any time.
"""

from __future__ import annotations

import queue

import torch

from p2p_worker import ChannelEmpty, Cluster, NodePlacementStrategy, Worker

CHANNEL = "rollouts"
ITEMS = 20


class Consumer(Worker):
    def open(self) -> None:
        # The channel lives on node 0 and holds at most 4 items at a time.
        self.channel = self.create_channel(CHANNEL, node_id=0, maxsize=4)

    def consume(self, n: int) -> list[int]:
        steps = []
        for _ in range(n):
            item = self.channel.get()
            assert torch.equal(item["obs"], torch.full((4,), float(item["step"])))
            steps.append(item["step"])
        assert self.channel.empty()
        try:
            extra = self.channel.get_nowait()
        except ChannelEmpty:  # also a queue.Empty: nothing is waiting in the channel
            extra = None
        assert extra is None
        return steps


class Producer(Worker):
    def produce(self, n: int) -> int:
        channel = self.connect_channel(CHANNEL)
        for step in range(n):
            item = {"step": step, "obs": torch.full((4,), float(step))}
            if step % 2:
                channel.put(item)  # blocks while the channel is full
            else:
                work = channel.put(item, async_op=True)  # an AsyncWork, pending while full
                work.wait()
        return n


def main() -> None:
    assert issubclass(ChannelEmpty, queue.Empty)
    cluster = Cluster(num_nodes=1)
    one_cpu_worker = NodePlacementStrategy([0], cpus_per_worker=0)
    consumers = Consumer.create_group().launch(
        cluster, placement_strategy=one_cpu_worker, name="consumer"
    )
    producers = Producer.create_group().launch(
        cluster, placement_strategy=one_cpu_worker, name="producer"
    )
    consumers.open().wait()

    consuming = consumers.consume(ITEMS)  # runs while the producer fills the channel
    assert producers.produce(ITEMS).wait() == [ITEMS]
    assert consuming.wait() == [list(range(ITEMS))]  # FIFO: in the order they were put
    print("channels: ok")


if __name__ == "__main__":
    main()
