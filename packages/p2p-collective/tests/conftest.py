"""Fixtures: a warm pair of real peer processes joined through a real TCPStore."""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import collective_tasks
import pytest
import torch.distributed as dist
from hypothesis import settings

# The CI gate runs hypothesis derandomized, so a red run is reproducible and a green
# one is not luck; HYPOTHESIS_PROFILE=explore draws fresh examples on every run.
settings.register_profile("gate", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "gate"))


def make_store() -> dist.TCPStore:
    """A TCPStore server on loopback, on a free port, in the test process."""
    return dist.TCPStore(
        "127.0.0.1",
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=60),
    )


class PeerPair:
    """Two spawned processes that run tasks from :mod:`collective_tasks` on command."""

    def __init__(self) -> None:
        self.store = make_store()
        self._ctx = mp.get_context("spawn")
        self._commands = [self._ctx.Queue() for _ in range(2)]
        self._results = [self._ctx.Queue() for _ in range(2)]
        self.procs = [
            self._ctx.Process(
                target=collective_tasks.serve,
                args=(rank, self.store.port, self._commands[rank], self._results[rank]),
                daemon=True,
            )
            for rank in range(2)
        ]
        for p in self.procs:
            p.start()

    def alive(self) -> bool:
        return all(p.is_alive() for p in self.procs)

    def run(
        self,
        task_a: Callable[..., Any],
        args_a: tuple[Any, ...],
        task_b: Callable[..., Any],
        args_b: tuple[Any, ...],
        timeout: float = 120.0,
    ) -> tuple[Any, Any]:
        """Run ``task_a`` on peer-a and ``task_b`` on peer-b concurrently; return both."""
        self._commands[0].put((task_a, args_a))
        self._commands[1].put((task_b, args_b))
        out = []
        for rank in range(2):
            status, value = self._results[rank].get(timeout=timeout)
            out.append((status, value))
        for rank, (status, value) in enumerate(out):
            if status != "ok":
                raise AssertionError(f"peer {rank} failed:\n{value}")
        return out[0][1], out[1][1]

    def close(self) -> None:
        for q in self._commands:
            q.put(None)
        for p in self.procs:
            p.join(timeout=15)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


@pytest.fixture(scope="session")
def pair() -> Iterator[PeerPair]:
    """The warm pair; replaced when a test leaves it dead."""
    holder = PeerPair()
    yield holder
    holder.close()


@pytest.fixture
def peers(pair: PeerPair, request: pytest.FixtureRequest) -> PeerPair:
    if not pair.alive():  # pragma: no cover - only after a crash in an earlier test
        pytest.fail("the peer processes died in an earlier test")
    return pair


@pytest.fixture
def gname(request: pytest.FixtureRequest) -> str:
    """A group name unique to the test, so tests never share a group."""
    return request.node.name


TRANSPORT_SWITCH = "P2P_TEST_TRANSPORT"
TESTS_DIR = Path(__file__).resolve().parent


def _modules_reading_the_switch() -> set[str]:
    """Sibling modules that read ``P2P_TEST_TRANSPORT``, directly or through a sibling they
    import (this conftest's own import of ``collective_tasks`` serves the ``pair`` fixture,
    which is followed by fixture name instead)."""
    sources = {p.stem: p.read_text() for p in TESTS_DIR.glob("*.py") if p.stem != "conftest"}
    imports = {
        name: {
            m for m in sources if m != name and re.search(rf"^\s*(from|import) {m}\b", text, re.M)
        }
        for name, text in sources.items()
    }
    reads = {name for name, text in sources.items() if TRANSPORT_SWITCH in text}
    while more := {name for name, deps in imports.items() if deps & reads} - reads:
        reads |= more
    return reads


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Over gloo (``P2P_TEST_TRANSPORT=gloo``, the suite's second run) keep only the tests
    whose groups follow the switch: those on the ``pair`` fixture and those of modules that
    read it. The others build their groups the same way in both runs; running them again
    would only repeat the first run. Deselected tests are counted in pytest's summary."""
    if os.environ.get(TRANSPORT_SWITCH, "shm") != "gloo":
        return
    reads = _modules_reading_the_switch()
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        stem = Path(str(item.fspath)).stem
        follows = "pair" in getattr(item, "fixturenames", ()) or stem in reads
        (keep if follows else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
