"""A plain embedded Ray on loopback, as Ray users start it (``ray.init``, no p2p Cluster)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import ray
import ray.cloudpickle


@contextlib.contextmanager
def plain_local_ray(test_module: ModuleType, num_cpus: int = 4) -> Iterator[None]:
    """``ray.init`` bound to 127.0.0.1 for the length of the block.

    The test module's functions and classes travel to the actors by value, so actors
    can run code defined in the test file.
    """
    if ray.is_initialized():
        ray.shutdown()
    tmp = os.environ.get("P2P_RAY_TMPDIR") or "/tmp/p2pray"
    os.makedirs(tmp, exist_ok=True)
    ray.cloudpickle.register_pickle_by_value(test_module)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Member, below
    ray.init(
        address="local",
        _node_ip_address="127.0.0.1",
        _temp_dir=tmp,
        include_dashboard=False,
        num_cpus=num_cpus,
        logging_level="WARNING",
    )
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0)
class Member:
    """A plain Ray actor that runs whatever function it is given (shipped by value)."""

    def run(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


@contextlib.contextmanager
def fresh_members(n: int) -> Iterator[list[Any]]:
    """``n`` fresh :class:`Member` actors for the block, killed afterwards."""
    team = [Member.remote() for _ in range(n)]
    try:
        yield team
    finally:
        for actor in team:
            ray.kill(actor)
