"""Does a process exit cleanly after closing its Collective with receives still pending?

Each trial starts two processes joined by one group. One of them ("closer") posts
receives its peer never answers (a few small ones, then a 4 MiB ``recv_tensor``), closes
its ``Collective`` and exits at once, while its peer is still alive; the peer waits two
seconds and exits. A clean exit has exit code 0; ``terminate called without an active
exception`` (SIGABRT, exit code -6) is the failure this program looks for. It was seen
at the end of soak runs, in the side that closed first. Not deterministic, so it runs
``--trials`` times.

Usage::

    python benchmarks/soak/exit_with_pending.py --trials 10
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import sys
import time

STORE_TIMEOUT = datetime.timedelta(seconds=60)


def side(port: int, name: str, other: str, trial: int) -> None:
    import torch
    import torch.distributed as dist

    from p2p_collective import Collective

    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=STORE_TIMEOUT)
    coll = Collective(name, store)
    group = coll.create_collective_group([name, other], group_name=f"trial{trial}")
    hello = group.send("hi", async_op=True)
    assert group.recv(timeout=60) == "hi"
    hello.wait(timeout=60)
    if name == "closer":
        pending = [group.recv(async_op=True, timeout=60) for _ in range(3)]
        pending.append(
            group.recv_tensor(torch.empty(4 << 20, dtype=torch.uint8), async_op=True, timeout=60)
        )
        time.sleep(0.5)
    store.set(f"t{trial}/ready/{name}", b"1")
    store.wait([f"t{trial}/ready/{other}"], STORE_TIMEOUT)
    coll.close()
    if name != "closer":
        time.sleep(2.0)  # the closer exits while this side is still alive


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=10, help="trials to run (10)")
    args = p.parse_args(argv)
    import torch.distributed as dist

    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=STORE_TIMEOUT
    )
    ctx = mp.get_context("spawn")
    aborted = 0
    for trial in range(args.trials):
        procs = {
            name: ctx.Process(target=side, args=(store.port, name, other, trial))
            for name, other in (("closer", "peer"), ("peer", "closer"))
        }
        for proc in procs.values():
            proc.start()
        for proc in procs.values():
            proc.join(timeout=120)
        codes = {name: proc.exitcode for name, proc in procs.items()}
        aborted += any(code != 0 for code in codes.values())
        print(f"trial {trial}: exit codes {codes}", flush=True)
    print(f"{aborted} of {args.trials} trials ended with a process that did not exit cleanly")
    return 1 if aborted else 0


if __name__ == "__main__":
    sys.exit(main())
