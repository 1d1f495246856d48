"""Worker send/recv through p2p-collective on a real embedded Ray cluster (CPU tensors)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from p2p_worker import Cluster, PackedPlacementStrategy, Worker, WorkerGroup

pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

SEND_GROUP_NAME = "send_worker_group"
RECV_GROUP_NAME = "recv_worker_group"


# Seed 004's communication example as written, with CPU tensors instead of CUDA ones
# (device=torch.cuda.current_device() becomes the CPU) and the received values returned
# so that the test can check them.


class SendWorker(Worker):
    def __init__(self) -> None:
        super().__init__()

    def hello_recv(self) -> str:
        # 1. Send a message (string or any serializable object) to the RecvWorker group
        # with the same rank as this SendWorker worker.
        msg = f"Hello from SendWorker Rank {self._rank}!"
        self.send(msg, dst_group_name=RECV_GROUP_NAME, dst_rank=self._rank)

        # 2. Receive a reply from the RecvWorker group with the same rank.
        reply = self.recv(src_group_name=RECV_GROUP_NAME, src_rank=self._rank)

        # 3. The send/recv APIs can also handle tensor, list of tensors and dict of tensors.
        dst_rank = (self._rank + 1) % self._world_size  # Send to the next rank in the group
        tensor = torch.ones(size=(1, 1), dtype=torch.float32)
        self.send(tensor, dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)

        tensor_list = [torch.tensor(1.0, dtype=torch.float32) for _ in range(4)]
        self.send(tensor_list, dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)

        tensor_dict = {
            "tensor1": torch.tensor(2.0, dtype=torch.float32),
            "tensor2": torch.tensor(3.0, dtype=torch.float32),
        }
        self.send(tensor_dict, dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)

        # 4. Send tensor directly without metadata overhead if you already know the tensor
        # shape and dtype at the recv side
        tensor = torch.ones(size=(2, 1), dtype=torch.float32)
        self.send_tensor(tensor, dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank)
        return str(reply)

    def hello_recv_async(self) -> None:
        # 1. Send a tensor asynchronously to the RecvWorker group with the next rank.
        dst_rank = (self._rank + 1) % self._world_size
        tensor = torch.ones(size=(3, 1), dtype=torch.float32)
        async_send_work = self.send(
            tensor, dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank, async_op=True
        )
        async_send_work.wait()  # Wait for the async send to complete

        # 2. Send a tensor asynchronously and use asyncio to wait for the operation to complete.
        async def send_tensor_async() -> None:
            dst_rank = (self._rank + 1) % self._world_size
            tensor = torch.ones(size=(4, 1), dtype=torch.float32)
            async_send_work = self.send(
                tensor, dst_group_name=RECV_GROUP_NAME, dst_rank=dst_rank, async_op=True
            )
            await async_send_work.async_wait()

        asyncio.run(send_tensor_async())


class RecvWorker(Worker):
    def __init__(self) -> None:
        super().__init__()

    def hello_recv(self) -> dict[str, Any]:
        # 1. Receive a message from the SendWorker worker group with the same rank.
        msg = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=self._rank)

        # 2. Send a reply back to the SendWorker worker group with the same rank.
        reply = f"Hello from RecvWorker Rank {self._rank}!"
        self.send(reply, dst_group_name=SEND_GROUP_NAME, dst_rank=self._rank)

        # 3. Receive a tensor, tensor list and tensor dict from the SendWorker worker group
        # with the same rank.
        src_rank = (self._rank - 1) % self._world_size  # Receive from the previous rank
        tensor = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        tensor_list = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        tensor_dict = self.recv(src_group_name=SEND_GROUP_NAME, src_rank=src_rank)

        # 4. In-place receive tensor directly without metadata overhead
        direct = torch.empty(size=(2, 1), dtype=torch.float32)
        self.recv_tensor(direct, src_group_name=SEND_GROUP_NAME, src_rank=src_rank)
        return {
            "msg": msg,
            "tensor": tensor,
            "tensor_list": tensor_list,
            "tensor_dict": tensor_dict,
            "direct": direct,
        }

    def hello_recv_async(self) -> list[torch.Tensor]:
        # 1. Receive a tensor asynchronously from the SendWorker group with the next rank.
        src_rank = (self._rank - 1) % self._world_size
        async_recv_work = self.recv(
            src_group_name=SEND_GROUP_NAME, src_rank=src_rank, async_op=True
        )
        first = async_recv_work.wait()

        # 2. Receive a tensor asynchronously and use asyncio to wait for the operation to
        # complete.
        async def recv_tensor_async() -> torch.Tensor:
            src_rank = (self._rank - 1) % self._world_size
            async_recv_work = self.recv(
                src_group_name=SEND_GROUP_NAME, src_rank=src_rank, async_op=True
            )
            return await async_recv_work.async_wait()  # type: ignore[no-any-return]

        return [first, asyncio.run(recv_tensor_async())]


def check_seed_results(
    replies: list[str], received: list[dict[str, Any]], asyncs: list[list[torch.Tensor]]
) -> None:
    world = len(received)
    assert replies == [f"Hello from RecvWorker Rank {r}!" for r in range(world)]
    for rank, got in enumerate(received):
        assert got["msg"] == f"Hello from SendWorker Rank {rank}!"
        assert torch.equal(got["tensor"], torch.ones(1, 1))
        assert isinstance(got["tensor_list"], list)
        assert len(got["tensor_list"]) == 4
        assert all(torch.equal(t, torch.tensor(1.0)) for t in got["tensor_list"])
        assert list(got["tensor_dict"]) == ["tensor1", "tensor2"]
        assert float(got["tensor_dict"]["tensor1"]) == 2.0
        assert float(got["tensor_dict"]["tensor2"]) == 3.0
        assert torch.equal(got["direct"], torch.ones(2, 1))
    for first, second in asyncs:
        assert torch.equal(first, torch.ones(3, 1))
        assert torch.equal(second, torch.ones(4, 1))


def test_seed_example_default_placement(cluster: Cluster) -> None:
    # As in the seed: default placement (one CPU-only worker per group here).
    send_group = SendWorker.create_group().launch(cluster=cluster, name=SEND_GROUP_NAME)
    recv_group = RecvWorker.create_group().launch(cluster=cluster, name=RECV_GROUP_NAME)
    res = send_group.hello_recv()
    received = recv_group.hello_recv().wait(timeout=120)
    replies = res.wait(timeout=120)
    res = send_group.hello_recv_async()
    asyncs = recv_group.hello_recv_async().wait(timeout=120)
    res.wait(timeout=120)
    check_seed_results(replies, received, asyncs)


def test_seed_example_ring_of_two(cluster: Cluster) -> None:
    two = PackedPlacementStrategy(2, cpus_per_worker=0)
    send_group = SendWorker.create_group().launch(cluster, two, name=SEND_GROUP_NAME)
    recv_group = RecvWorker.create_group().launch(cluster, two, name=RECV_GROUP_NAME)
    res = send_group.hello_recv()
    received = recv_group.hello_recv().wait(timeout=120)
    replies = res.wait(timeout=120)
    res = send_group.hello_recv_async()
    asyncs = recv_group.hello_recv_async().wait(timeout=120)
    res.wait(timeout=120)
    check_seed_results(replies, received, asyncs)


def message(i: int) -> Any:
    """The i-th message of the mixed stream: objects, tensors, containers of tensors."""
    kind = i % 6
    if kind == 0:
        return {"seq": i, "text": "x" * (i % 50)}
    if kind == 1:
        return torch.full((i % 7 + 1, 3), float(i))
    if kind == 2:
        return [torch.arange(i % 5 + 1, dtype=torch.int64) + i, torch.tensor(float(i))]
    if kind == 3:
        return {"seq": torch.tensor(i), "payload": torch.full((16,), i, dtype=torch.int32)}
    if kind == 4:
        return i
    return torch.full((4096,), i % 251, dtype=torch.uint8)  # 4 KiB


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


class Peer(Worker):
    def exchange(self, peer_group: str, count: int) -> int:
        """Send ``count`` mixed messages to the same rank of ``peer_group`` while receiving
        as many from it; check that each arrives intact and in order."""
        # Both directions at once: queue every send (they go out in order), then receive.
        works = [self.send(message(i), peer_group, self._rank, async_op=True) for i in range(count)]
        for i in range(count):
            got = self.recv(peer_group, self._rank, timeout=60)
            if not same(message(i), got):
                raise AssertionError(f"message {i}: expected {message(i)!r}, got {got!r}")
        for w in works:
            w.wait(timeout=60)
        return count


def test_two_groups_exchange_1000_mixed_messages_in_order(cluster: Cluster) -> None:
    one = PackedPlacementStrategy(1, cpus_per_worker=0)
    a = Peer.create_group().launch(cluster, one, name="peers_a")
    b = Peer.create_group().launch(cluster, one, name="peers_b")
    ha, hb = a.exchange("peers_b", 1000), b.exchange("peers_a", 1000)
    assert ha.wait(timeout=240) == [1000]
    assert hb.wait(timeout=240) == [1000]


class Checks(Worker):
    def to_self(self) -> str:
        try:
            self.send("x", dst_group_name="checks", dst_rank=self._rank)
        except ValueError as exc:
            return str(exc)
        return "no error"

    def bad_names(self) -> list[str]:
        out = []
        for call in (
            lambda: self.send("x", dst_group_name="a:b", dst_rank=0),
            lambda: self.recv(src_group_name="g", src_rank=-1),
            lambda: self.recv(src_group_name=3, src_rank=0),
        ):
            try:
                call()
            except (TypeError, ValueError) as exc:
                out.append(type(exc).__name__)
        return out

    def compressed_roundtrip(self) -> bool:
        t = torch.zeros(1 << 16, dtype=torch.int64)  # 512 KiB, highly compressible
        t[::1000] = 7
        if self._rank == 0:
            self.send({"t": t}, "checks", 1)
            return True
        got = self.recv("checks", 0)
        return bool(torch.equal(got["t"], t))

    def codec_env(self) -> str:
        return os.environ.get("P2P_WORKER_ADDRESS", "")


LZ4_JOB = {
    "cluster": {
        "collective": {"tensor_compression": {"enabled": True, "codec": "lz4", "min_bytes": 1024}}
    }
}


@pytest.fixture(scope="module")
def checks(ray_session: object) -> Iterator[WorkerGroup[Checks]]:
    with Cluster(num_nodes=1, config=LZ4_JOB) as lz4_cluster:
        assert lz4_cluster.config.codec_name == "lz4"
        yield Checks.create_group().launch(
            lz4_cluster, PackedPlacementStrategy(2, cpus_per_worker=0), name="checks"
        )


def test_bad_peers_are_refused(checks: WorkerGroup[Checks]) -> None:
    assert "cannot send to or receive from itself" in checks.to_self().wait(timeout=60)[0]
    assert checks.execute_on(0).bad_names().wait(timeout=60) == [
        ["ValueError", "ValueError", "TypeError"]
    ]


def test_compression_config_reaches_the_workers(checks: WorkerGroup[Checks]) -> None:
    assert checks.compressed_roundtrip().wait(timeout=120) == [True, True]
    assert checks.codec_env().wait(timeout=60) == ["checks:0", "checks:1"]
