"""Compression over an emulated 100 Mbit/s link, between two plain processes.

Runs on its own: ``python docs/examples/link_emulation.py``. Both processes hold the
same job-level configuration: lz4 compression and emulated 100 Mbit/s links with a 5 ms
delay. The emulated link carries the bytes that really go on the wire, so the
compressible tensor arrives much sooner than the incompressible one of the same size.
Each transfer is timed from the send until the receiver's reply is back (one tiny
message, 5 ms, on the reverse link): a send itself returns as soon as its bytes fit the
emulated link's 4 MiB buffer, as on a real network.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from p2p_collective import (
    Collective,
    CollectiveConfig,
    parse_collective_config,
    parse_net_emulation,
)

HOST = "127.0.0.1"
TIMEOUT = 120.0
MBIT_PER_S = 100
NBYTES = 8 * 1024 * 1024

CLUSTER = {
    "collective": {
        "tensor_compression": {"codec": "lz4", "min_bytes": 16384},
    },
    # Every directed link (each direction of each group) is paced on its own.
    "net_emulation": {"enabled": True, "bandwidth_mbps": MBIT_PER_S, "delay_ms": 5},
}


def job_config() -> CollectiveConfig:
    config = parse_collective_config(CLUSTER["collective"], path="cluster.collective")
    emulation = parse_net_emulation(CLUSTER["net_emulation"], path="cluster.net_emulation")
    return dataclasses.replace(config, net_emulation=emulation)


def payloads() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {
        # 8 MiB of token ids below 1000: most bytes are zero, lz4 shrinks them a lot.
        "token ids (int64)": torch.randint(0, 1000, (NBYTES // 8,), dtype=torch.int64),
        # 8 MiB of random bytes: nothing to gain, sent raw and charged in full.
        "random bytes (uint8)": torch.randint(0, 256, (NBYTES,), dtype=torch.uint8),
    }


def run(name: str, store_port: int) -> None:
    store = dist.TCPStore(HOST, store_port, is_master=False, timeout=timedelta(seconds=TIMEOUT))
    collective = Collective(name, store, host=HOST, config=job_config(), timeout=TIMEOUT)
    group = collective.create_collective_group(["sender", "receiver"])
    for label, tensor in payloads().items():
        if name == "sender":
            start = time.perf_counter()
            group.send(tensor, timeout=TIMEOUT)  # returns once the bytes fit the link buffer
            assert group.recv(timeout=TIMEOUT) == "arrived"
            took = time.perf_counter() - start
            link_time = 8 * tensor.nbytes / (MBIT_PER_S * 1e6)
            print(f"{label}: {took:.2f} s; uncompressed at {MBIT_PER_S} Mbit/s: {link_time:.2f} s")
        else:
            assert torch.equal(group.recv(timeout=TIMEOUT), tensor)
            group.send("arrived")
    collective.close()


def main() -> None:
    store = dist.TCPStore(
        HOST, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=TIMEOUT)
    )
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=run, args=(n, store.port)) for n in ("sender", "receiver")]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=3 * TIMEOUT)
    codes = [proc.exitcode for proc in procs]
    assert codes == [0, 0], f"exit codes: {codes}"
    print("link_emulation: ok")


if __name__ == "__main__":
    main()
