"""Keeping a long-lived worker's start-up heap out of Python's full garbage collections.

A Ray actor with torch loaded holds a large heap (the interpreter's modules, Ray's state,
torch, the worker's own objects), and each full (generation 2) collection walks all of
it: measured in ``p2p-bench rl``'s workers, 100-240 ms per collection, two or three
times in a 16-step ``--quick`` run, each landing in whichever phase was running (weight
phases of 0.11-0.14 s among 0.006-0.009 s ones; a channel worker's in a rollout phase,
0.12 s against 0.005 s).
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect once, then keep what this process holds now out of later full collections.

    ``gc.freeze()`` moves every object that exists now to the permanent generation, so
    later collections walk only what was made since. Objects made later are collected
    as before; frozen ones are still freed by reference counting, only cyclic garbage
    among them stays. Call it once a worker has finished setting up.
    """
    gc.collect()
    gc.freeze()
