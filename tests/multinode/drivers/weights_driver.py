"""Four-node driver of ``p2p-bench weights``: every method, the trainer on node 0, spread.

Usage: python weights_driver.py OUT LINK_MBPS -- FLAG...

Runs ``p2p-bench weights FLAG... --placement spread --address auto --link-mbps LINK_MBPS
--out OUT`` on the running cluster and prints one ``P2PMN-RESULT <json>``: the cluster's
node addresses (by node rank), the exit status, the wall seconds, the JSON the run wrote
and its Markdown report (or the traceback of the run).
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from p2p_worker import Cluster
from p2p_worker.bench import main as bench

RESULT_PREFIX = "P2PMN-RESULT "


def main() -> None:
    out, link_mbps = Path(sys.argv[1]), sys.argv[2]
    flags = sys.argv[sys.argv.index("--") + 1 :]
    cluster = Cluster(address="auto")
    result: dict[str, Any] = {"nodes": [n.ip for n in cluster.nodes]}
    cluster.shutdown()
    argv = ["weights", *flags, "--placement", "spread", "--address", "auto"]
    argv += ["--link-mbps", link_mbps, "--out", str(out)]
    start = time.perf_counter()
    try:
        result["status"] = bench(argv)
    except Exception:  # the test shows why, Ray's log lines around it notwithstanding
        result["status"] = -1
        result["error"] = traceback.format_exc()
    result["wall_seconds"] = time.perf_counter() - start
    written = out / "p2p-bench-weights.json"
    if written.exists():
        result.update(json.loads(written.read_text(encoding="utf-8")))
        result["report"] = (out / "p2p-bench-weights.md").read_text(encoding="utf-8")
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
