"""Waiting helpers shared by the channel tests (not a test module)."""

from __future__ import annotations

import time
from typing import Any

import ray

from p2p_worker import Channel, ChannelEmpty


def wait_for(cond: Any, timeout: float = 30.0) -> None:
    """Poll ``cond()`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def settled(ch: Channel, timeout: float = 30.0) -> dict[str, Any]:
    """Stats once every delivered item's slot is back (the channel worker frees a slot
    just after the consumer has the item, so a snapshot taken at once may lag)."""
    deadline = time.monotonic() + timeout
    while True:
        st = ch.stats()
        if st["held"] == st["queued"] + st["arriving"] or time.monotonic() > deadline:
            return st


def drain(ch: Channel) -> list[Any]:
    """Every item the channel holds now, oldest first (``get_nowait`` until empty)."""
    items = []
    while True:
        try:
            items.append(ch.get_nowait())
        except ChannelEmpty:
            return items


def channel_actor(name: str) -> Any:
    """The Ray actor of channel ``name``, found through Ray's public actor listing."""
    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].endswith("/" + name):
            return ray.get_actor(entry["name"], namespace=entry["namespace"])
    raise AssertionError(f"no named actor for channel {name!r}")
