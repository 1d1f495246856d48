"""Workers of two groups exchanging objects and tensors by group name and rank.

Runs on its own: ``python docs/examples/workers_send_recv.py``. This is seed 004's
SendWorker / RecvWorker example with CPU tensors.
"""

from __future__ import annotations

import asyncio

import torch

from p2p_worker import Cluster, NodePlacementStrategy, Worker

SEND_GROUP_NAME = "send_worker_group"
RECV_GROUP_NAME = "recv_worker_group"


class SendWorker(Worker):
    def hello_recv(self) -> str:
        # 1. Any picklable object to the worker of the same rank in the other group.
        self.send(f"Hello from SendWorker {self._rank}", RECV_GROUP_NAME, self._rank)
        reply = self.recv(src_group_name=RECV_GROUP_NAME, src_rank=self._rank)

        # 2. Tensors, lists of tensors and dicts of tensors take the tensor path.
        dst_rank = (self._rank + 1) % self._world_size
        self.send(torch.ones(1, 1), dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)
        self.send([torch.tensor(1.0) for _ in range(4)], RECV_GROUP_NAME, dst_rank)
        tensors = {"tensor1": torch.tensor(2.0), "tensor2": torch.tensor(3.0)}
        self.send(tensors, RECV_GROUP_NAME, dst_rank)

        # 3. No metadata at all when the receiver already holds a tensor of this shape.
        self.send_tensor(torch.ones(2, 1), RECV_GROUP_NAME, dst_rank)
        return reply

    def hello_recv_async(self) -> None:
        dst_rank = (self._rank + 1) % self._world_size
        work = self.send(torch.ones(3, 1), RECV_GROUP_NAME, dst_rank, async_op=True)
        work.wait()

        async def send_async() -> None:
            work = self.send(torch.ones(4, 1), RECV_GROUP_NAME, dst_rank, async_op=True)
            await work.async_wait()

        asyncio.run(send_async())


class RecvWorker(Worker):
    def hello_recv(self) -> float:
        msg = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=self._rank)
        assert msg == f"Hello from SendWorker {self._rank}"
        self.send(f"Hello from RecvWorker {self._rank}", SEND_GROUP_NAME, self._rank)

        src_rank = (self._rank - 1) % self._world_size
        tensor = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        tensor_list = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        tensor_dict = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)

        buf = torch.empty(2, 1)  # in-place receive, no metadata
        self.recv_tensor(buf, src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        total = tensor.sum() + sum(t for t in tensor_list) + sum(tensor_dict.values())
        return float(total + buf.sum())

    def hello_recv_async(self) -> list[float]:
        src_rank = (self._rank - 1) % self._world_size
        work = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank, async_op=True)
        first = work.wait()

        async def recv_async() -> torch.Tensor:
            return await self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank, async_op=True)

        second = asyncio.run(recv_async())
        return [float(first.sum()), float(second.sum())]


def main() -> None:
    cluster = Cluster(num_nodes=1)
    # Two CPU-only workers per group, both on node 0, reserving no CPU (a small machine).
    two_cpu_workers = NodePlacementStrategy([0, 0], cpus_per_worker=0)
    send_group = SendWorker.create_group().launch(
        cluster, placement_strategy=two_cpu_workers, name=SEND_GROUP_NAME
    )
    recv_group = RecvWorker.create_group().launch(
        cluster, placement_strategy=two_cpu_workers, name=RECV_GROUP_NAME
    )

    # Both groups must run their halves at the same time: start one, then wait on both.
    sending = send_group.hello_recv()
    assert recv_group.hello_recv().wait() == [1.0 + 4.0 + 5.0 + 2.0] * 2
    assert sending.wait() == ["Hello from RecvWorker 0", "Hello from RecvWorker 1"]

    sending = send_group.hello_recv_async()
    assert recv_group.hello_recv_async().wait() == [[3.0, 4.0]] * 2
    sending.wait()
    print("workers_send_recv: ok")


if __name__ == "__main__":
    main()
