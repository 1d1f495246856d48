"""The asynchronous API between two plain processes: await, wait and then.

Runs on its own: ``python docs/examples/collective_async.py``. ``main`` starts two
processes; ``sender`` and ``receiver`` hold the two ends of one group.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from p2p_collective import Collective, CollectiveGroup

HOST = "127.0.0.1"
TIMEOUT = 60.0


def open_group(name: str, store_port: int) -> tuple[Collective, CollectiveGroup]:
    store = dist.TCPStore(HOST, store_port, is_master=False, timeout=timedelta(seconds=TIMEOUT))
    collective = Collective(name, store, host=HOST, timeout=TIMEOUT)
    return collective, collective.create_collective_group(["sender", "receiver"])


async def send_side(group: CollectiveGroup, obj: Any) -> None:
    # asynchronous object send with await
    send_work = group.send(obj, async_op=True)  # AsyncWork
    await send_work.async_wait()  # does not block the event loop
    group.send_tensor(torch.arange(4.0), async_op=True).wait()


def receive_side(group: CollectiveGroup, tensor: torch.Tensor) -> Any:
    recv_work = group.recv(async_op=True)  # AsyncWork
    obj = recv_work.wait()  # blocks; returns the received object

    # chain a post-processing step
    def postprocess(buf: torch.Tensor) -> float:
        # for example: move to another device, convert a dtype, notify another subsystem
        return float(buf.sum())

    w = group.recv_tensor(tensor, async_op=True)  # the receiver's preallocated tensor
    w2 = w.then(postprocess)  # AsyncFuncWork
    assert w2.wait() == 6.0  # postprocess has finished
    return obj


def sender(store_port: int) -> None:
    collective, group = open_group("sender", store_port)
    asyncio.run(send_side(group, {"step": 1, "weights": torch.ones(3)}))
    assert group.recv(timeout=TIMEOUT) == "done"
    collective.close()


def receiver(store_port: int) -> None:
    collective, group = open_group("receiver", store_port)
    obj = receive_side(group, torch.empty(4))
    assert obj["step"] == 1
    assert torch.equal(obj["weights"], torch.ones(3))
    group.send("done")
    collective.close()


def main() -> None:
    store = dist.TCPStore(
        HOST, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT)
    )
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=fn, args=(store.port,)) for fn in (sender, receiver)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=2 * TIMEOUT)
    codes = [proc.exitcode for proc in procs]
    assert codes == [0, 0], f"exit codes: {codes}"
    print("collective_async: ok")


if __name__ == "__main__":
    main()
