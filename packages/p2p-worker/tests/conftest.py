"""Fixtures for p2p-worker tests: one embedded local Ray cluster per test session.

Starting Ray costs seconds and hundreds of MB, so the whole session shares one Ray
connection, started by a configuration-free :class:`p2p_worker.Cluster`. Each test that
needs workers gets its own ``Cluster`` object on that connection (with its own
rendezvous store) and shuts it down afterwards, which stops every group it launched.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

# Before ray is imported anywhere: loopback-only embedded cluster, short socket paths.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("P2P_RAY_TMPDIR", "/tmp/p2pray")

import pytest

TESTS_DIR = Path(__file__).resolve().parent


def _register_test_modules_by_value() -> None:
    """Ray workers cannot import this directory's modules; ship their classes by value."""
    import ray.cloudpickle

    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().parent == TESTS_DIR and name != "conftest":
            ray.cloudpickle.register_pickle_by_value(module)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[object]:
    """The session's Ray connection: an embedded local cluster on 127.0.0.1."""
    from p2p_worker import Cluster

    _register_test_modules_by_value()
    base = Cluster(address="local")
    yield base
    base.shutdown()


@pytest.fixture
def cluster(ray_session: object) -> Iterator[object]:
    """A Cluster object of its own on the session's Ray connection; shut down after the test."""
    from p2p_worker import Cluster

    _register_test_modules_by_value()
    c = Cluster(num_nodes=1)
    yield c
    c.shutdown()
