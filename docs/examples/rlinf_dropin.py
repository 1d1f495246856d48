"""RLinf scheduler code on p2p-worker: only the import line differs.

Runs on its own: ``python docs/examples/rlinf_dropin.py``. Everything below the import
is written as for ``from rlinf.scheduler import ...``: RLinf's CPU placement, its
``send`` / ``recv`` with ``options``, an ``async def`` method, its ``broadcast`` form
and a keyed, weighted channel created in the driver.
"""

from __future__ import annotations

import time

import torch

# was: from rlinf.scheduler import (...)
from p2p_worker import (
    Channel,
    Cluster,
    CollectiveGroupOptions,
    NodePlacementStrategy,
    Worker,
)

SEND_GROUP = "send_group"
RECV_GROUP = "recv_group"


def rollout(step: int, obs: torch.Tensor) -> dict[str, object]:
    # Payload classes pickled by reference must live in an importable module, not in
    # the script run as __main__ (true of RLinf as of pickle); a dict needs neither.
    return {"step": step, "obs": obs}


class Sender(Worker):
    def hello(self) -> None:
        peer = (self._rank + 1) % self._world_size  # ring pairing
        options = CollectiveGroupOptions(accel_max_ctas=1)  # tunes NCCL; CPU ignores it
        self.send(rollout(self._rank, torch.ones(2)), RECV_GROUP, peer, options=options)

    def fill(self, channel: Channel) -> None:
        for step in range(4):  # weights 1, 2, 1, 2 under this worker's key
            channel.put(rollout(step, torch.zeros(3)), weight=1 + step % 2, key=self._rank)

    def share(self) -> str:
        groups = [(SEND_GROUP, [0, 1]), (RECV_GROUP, [0, 1])]
        payload = "weights v1" if self._rank == 0 else None
        return self.broadcast(payload, groups=groups, src=(SEND_GROUP, 0))


class Receiver(Worker):
    async def hello(self) -> int:  # awaited on the actor's event loop
        peer = (self._rank - 1) % self._world_size
        got = await self.recv(SEND_GROUP, peer, async_op=True).async_wait()
        return got["step"]

    def share(self) -> str:
        groups = [(SEND_GROUP, [0, 1]), (RECV_GROUP, [0, 1])]
        return self.broadcast(None, groups=groups, src=(SEND_GROUP, 0))


def main() -> None:
    cluster = Cluster(num_nodes=1)
    placement = NodePlacementStrategy([0] * 2)  # CPU workers share the node's cores
    senders = Sender.create_group().launch(cluster, placement_strategy=placement, name=SEND_GROUP)
    receivers = Receiver.create_group().launch(
        cluster, placement_strategy=placement, name=RECV_GROUP
    )

    got = receivers.hello()
    senders.hello().wait()
    assert got.wait() == [1, 0]  # receiver r hears from sender r - 1

    shared = senders.share(), receivers.share()
    assert shared[0].wait() + shared[1].wait() == ["weights v1"] * 4

    channel = Channel.create(name="rollouts")  # made in the driver, passed to workers
    senders.fill(channel).wait()
    # Another process's item counts under its key once it has reached the channel
    # worker, a moment after that process's put returned (see the migration page).
    deadline = time.monotonic() + 30
    while channel.qsize(key=1) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert channel.qsize(key=1) == 4
    batch = channel.get_batch(target_weight=3, key=1)  # weights 1 + 2
    assert [r["step"] for r in batch] == [0, 1]
    assert channel.get(key=0)["step"] == 0  # each key is its own FIFO
    channel.destroy()
    cluster.shutdown()
    print("rlinf_dropin: ok")


if __name__ == "__main__":
    main()
