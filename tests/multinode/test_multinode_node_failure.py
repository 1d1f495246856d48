"""Killing the second node's processes fails pending operations on the first within seconds.

Each test gets its own cluster (``fresh_cluster``): the worker node does not come back.
The driver prints ``P2PMN-EVENT posted`` once a receive is pending on node 0; the test
then SIGKILLs every process of node 1 and the driver reports when the receive failed.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]


def _kill_while_pending(cluster: Any, driver_path: Path) -> tuple[dict[str, Any], float]:
    driver = cluster.start_driver([str(driver_path), "pending-recv"])
    try:
        driver.wait_event("posted", timeout=240)
        killed_at = time.time()
        assert cluster.kill_node("worker")
        res = driver.finish(timeout=150).check()
    finally:
        driver.kill()
    return res, res["at"] - killed_at if res.get("at") else float("inf")


def test_pending_raw_gloo_recv_fails_when_the_worker_node_dies(
    fresh_cluster: Any, drivers_dir: Path
) -> None:
    res, after = _kill_while_pending(fresh_cluster, drivers_dir / "ray_driver.py")
    print(f"raw gloo: pending recv failed {after:.2f} s after the kill: {res['error']}")
    assert res["error"], res
    assert after < 10.0, res


def test_pending_p2p_recv_fails_within_seconds_when_the_peer_node_dies(
    fresh_cluster: Any, drivers_dir: Path
) -> None:
    res, after = _kill_while_pending(fresh_cluster, drivers_dir / "p2p_driver.py")
    print(f"p2p: pending recv failed {after:.2f} s after the kill: {res}")
    assert res["warm"] == [True, True]
    assert res["error"] is not None, res
    assert res["is_p2p_error"], res
    assert after < 10.0, res
    # Later operations towards the dead peer fail fast as well.
    assert res["send_after"]["error"] is not None, res
    assert res["send_after"]["seconds"] < 10.0, res
