"""The shared-memory hello proves the job token: a process without it is refused."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest
import torch.distributed as dist
from conftest import make_store

from p2p_collective import AuthenticationError
from p2p_collective._links._shm import join, offer
from p2p_collective._peers._auth import JobAuth


def _wait_key(store: Any) -> Any:
    def wait(key: str, timeout: float | None) -> bool:
        if store.check([key]):
            return True
        if not timeout:
            return False
        store.wait([key], datetime.timedelta(seconds=timeout))
        return True

    return wait


def _handshake(offer_key: bytes | None, join_key: bytes | None) -> tuple[Any, Any]:
    """Run both sides in this process (offer in a thread); return both outcomes."""
    store = make_store()
    # one client per side: a TCPStore client serialises its requests, and a blocking
    # wait from one thread would stall the other side's polling
    client = dist.TCPStore(
        "127.0.0.1", store.port, is_master=False, timeout=datetime.timedelta(seconds=30)
    )
    prefix = "auth-test"
    out: dict[str, Any] = {}

    def run_offer() -> None:
        try:
            out["offer"] = offer(
                store, prefix, True, "joiner", 10.0, _wait_key(store), mac=JobAuth(offer_key).mac
            )
        except Exception as exc:
            out["offer"] = exc

    t = threading.Thread(target=run_offer)
    t.start()
    try:
        joined: Any = join(
            client, prefix, True, "offerer", 10.0, _wait_key(client), mac=JobAuth(join_key).mac
        )
    except Exception as exc:
        joined = exc
    t.join(timeout=20)
    return out["offer"], joined


def _close(result: Any) -> None:
    if isinstance(result, tuple) and result[0] is not None:
        result[0].close()
        result[1].close()


def test_the_same_token_connects() -> None:
    offered, joined = _handshake(b"k" * 32, b"k" * 32)
    try:
        assert offered[2] == "" and joined[2] == ""  # noqa: PT018
        assert offered[0] is not None and joined[0] is not None  # noqa: PT018
    finally:
        _close(offered)
        _close(joined)


@pytest.mark.parametrize("join_key", [b"x" * 32, None], ids=["wrong token", "no token"])
def test_a_process_without_the_token_is_refused(join_key: bytes | None) -> None:
    offered, joined = _handshake(b"k" * 32, join_key)
    _close(joined)
    assert isinstance(offered, AuthenticationError), (offered, joined)
    assert "does not hold this job's token" in str(offered)
    assert "k" * 8 not in str(offered)  # never the token itself


def test_without_a_token_on_the_offering_side_no_proof_is_needed() -> None:
    offered, joined = _handshake(None, None)
    try:
        assert offered[2] == ""
        assert joined[2] == ""
    finally:
        _close(offered)
        _close(joined)
