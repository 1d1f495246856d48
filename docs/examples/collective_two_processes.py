"""Two plain processes talking through p2p-collective: no Ray, just a TCPStore.

Runs on its own: ``python docs/examples/collective_two_processes.py``. The launcher hosts
the rendezvous store and starts two processes, ``alice`` and ``bob``; in a real
deployment any process both can reach (often rank 0) hosts the store instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing as mp
from datetime import timedelta

import torch
import torch.distributed as dist

from p2p_collective import Collective, CollectiveGroup

HOST = "127.0.0.1"  # loopback here; the node's own address on a real cluster
TIMEOUT = 60.0  # seconds, for every blocking call below


@dataclasses.dataclass
class Batch:
    tokens: torch.Tensor
    rewards: torch.Tensor
    step: int  # non-tensor fields travel too


def connect(name: str, store_port: int) -> tuple[Collective, CollectiveGroup]:
    store = dist.TCPStore(HOST, store_port, is_master=False, timeout=timedelta(seconds=TIMEOUT))
    collective = Collective(name, store, host=HOST, timeout=TIMEOUT)
    # Both sides name the same two members; the group is cached by the sorted names.
    group = collective.create_collective_group(["alice", "bob"])
    return collective, group


def alice(store_port: int) -> None:
    collective, group = connect("alice", store_port)
    group.send(torch.arange(8))  # one tensor
    group.send([torch.ones(2, 3), torch.zeros(4, dtype=torch.int64)])  # a list of tensors
    group.send({"obs": torch.rand(2, 2), "mask": torch.ones(2, dtype=torch.bool)})
    group.send(Batch(tokens=torch.arange(6).view(2, 3), rewards=torch.ones(2), step=7))
    group.send({"epoch": 3, "note": "any picklable object"})  # pickled, inline in the header

    # Direct tensor path: no metadata, the receiver already holds a tensor of this shape.
    group.send_tensor(torch.full((4,), 2.5))

    # Asynchronous sends return AsyncWork handles at once; order is still kept.
    works = [group.send(torch.full((3,), float(i)), async_op=True) for i in range(3)]
    for work in works:
        work.wait(timeout=TIMEOUT)

    reply = group.recv(timeout=TIMEOUT)
    assert reply == "thanks, alice", reply
    collective.close()


def postprocess(buf: torch.Tensor) -> float:
    # For example: move to another device, convert a dtype, or notify another subsystem.
    return float(buf.sum())


async def receive_async(group: CollectiveGroup) -> list[torch.Tensor]:
    # await a handle (or its async_wait()) inside asyncio code: no thread is parked.
    works = [group.recv(async_op=True) for _ in range(3)]
    return [await work for work in works]


def bob(store_port: int) -> None:
    collective, group = connect("bob", store_port)
    assert torch.equal(group.recv(timeout=TIMEOUT), torch.arange(8))
    ones, zeros = group.recv(timeout=TIMEOUT)
    assert ones.shape == (2, 3)
    assert zeros.dtype == torch.int64
    tensors = group.recv(timeout=TIMEOUT)
    assert list(tensors) == ["obs", "mask"]  # key order is kept
    batch = group.recv(timeout=TIMEOUT)
    assert isinstance(batch, Batch)
    assert batch.step == 7
    assert group.recv(timeout=TIMEOUT) == {"epoch": 3, "note": "any picklable object"}

    buf = torch.empty(4)  # preallocated: same shape and dtype as the sender's tensor
    work = group.recv_tensor(buf, async_op=True)
    total = work.then(postprocess)  # an AsyncFuncWork; called with the filled tensor
    assert total.wait(timeout=TIMEOUT) == 10.0

    received = asyncio.run(receive_async(group))
    assert [float(t[0]) for t in received] == [0.0, 1.0, 2.0]

    group.send("thanks, alice")
    collective.close()


def main() -> None:
    # The launcher hosts the store; port 0 lets the OS pick a free port.
    store = dist.TCPStore(
        HOST, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT)
    )
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=fn, args=(store.port,)) for fn in (alice, bob)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=2 * TIMEOUT)
    codes = [proc.exitcode for proc in procs]
    assert codes == [0, 0], f"exit codes: {codes}"
    print("collective_two_processes: ok")


if __name__ == "__main__":
    main()
