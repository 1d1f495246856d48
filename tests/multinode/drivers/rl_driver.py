"""Four-node driver of ``p2p-bench rl``: the same loop with every worker on node 0, then spread.

Usage: python rl_driver.py OUT PLACEMENT... -- FLAG...

Runs ``p2p-bench rl FLAG... --placement PLACEMENT --address auto --link-mbps 1000 --out
OUT/PLACEMENT`` once per ``PLACEMENT`` (``one-node``, ``spread``) on the running cluster,
one after the other, and prints one ``P2PMN-RESULT <json>``: the cluster's node addresses
(by node rank) and per placement the exit status, the wall seconds, the JSON the run
wrote (its timelines left out) and its Markdown report.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from p2p_worker import Cluster
from p2p_worker.bench import main as bench

RESULT_PREFIX = "P2PMN-RESULT "
LINK_MBPS = "1000"


def run(out: Path, placement: str, flags: list[str]) -> dict[str, Any]:
    folder = out / placement
    argv = ["rl", *flags, "--placement", placement, "--address", "auto"]
    argv += ["--link-mbps", LINK_MBPS, "--out", str(folder)]
    start = time.perf_counter()
    status = bench(argv)
    result: dict[str, Any] = {"status": status, "wall_seconds": time.perf_counter() - start}
    written = folder / "p2p-bench-rl.json"
    if written.exists():
        payload = json.loads(written.read_text(encoding="utf-8"))
        payload.pop("timelines", None)
        result.update(payload)
        result["report"] = (folder / "p2p-bench-rl.md").read_text(encoding="utf-8")
    return result


def main() -> None:
    out = Path(sys.argv[1])
    split = sys.argv.index("--")
    placements, flags = sys.argv[2:split], sys.argv[split + 1 :]
    cluster = Cluster(address="auto")
    result: dict[str, Any] = {"nodes": [n.ip for n in cluster.nodes]}
    cluster.shutdown()
    for placement in placements:
        result[placement] = run(out, placement, flags)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
