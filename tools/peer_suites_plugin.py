"""Fixtures Ray's collective tests take from Ray's test utilities (not in its wheel).

tools/peer_suites.py copies this file next to the peer's files as ``_p2p_peer_plugin.py``
and loads it with ``-p``. A local ``ray.init`` binds to loopback; the runner's
environment gives Ray a short temp dir and keeps 127.0.0.1 as the node address.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import ray

_ray_init = ray.init


def _loopback_init(*args: Any, **kwargs: Any) -> Any:
    # A local cluster binds to loopback; the peer's own calls are unchanged otherwise.
    if not args and kwargs.get("address") in (None, "local"):
        kwargs.setdefault("_node_ip_address", "127.0.0.1")
    return _ray_init(*args, **kwargs)


ray.init = _loopback_init


@pytest.fixture
def ray_start_single_node() -> Iterator[Any]:
    """A local Ray of 8 CPUs for one case (Ray's conftest.py fixture of that name)."""
    info = ray.init(num_cpus=8)
    yield info
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_start_regular_shared() -> Iterator[Any]:
    """A local Ray shared by a module's cases (Ray's test utilities' fixture)."""
    info = ray.init(num_cpus=4)
    yield info
    ray.shutdown()


@pytest.fixture
def shutdown_only() -> Iterator[None]:
    """Nothing before the case; Ray shut down after it (Ray's test utilities' fixture)."""
    yield None
    ray.shutdown()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the subset ``$P2P_PEER_SUBSET`` names: ``functions`` or ``files``."""
    subset = os.environ.get("P2P_PEER_SUBSET")
    if subset not in ("functions", "files"):
        return
    known = set(filter(None, os.environ.get("P2P_PEER_KNOWN", "").split(",")))
    seen: set[object] = set()
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        name = getattr(item, "originalname", item.name)
        key: object = (item.path.name, name) if subset == "functions" else item.path.name
        if subset == "files" and f"{item.path.name}::{name}" in known:
            dropped.append(item)  # a known failure does not stand for its file
            continue
        (dropped if key in seen else kept).append(item)
        seen.add(key)
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)
