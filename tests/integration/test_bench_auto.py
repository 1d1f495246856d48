"""``p2p-bench`` with the chunked and adaptive modes at an emulated 1 Gbit/s link, end to end.

The command runs as a subprocess, as a user runs it (embedded local Ray on 127.0.0.1,
no baselines, one small size): ``auto`` (raw, lz4, zstd or sparse per link) and
``zstd_auto`` beside raw, chunked lz4 and whole-tensor zstd. The test reads the JSON
and the Markdown it wrote: every mode is measured, the adaptive ones compress the token
ids at 1 Gbit/s (fewer wire bytes than payload bytes), and the report's table names each
mode as a series of its own.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from test_bench_smoke import _command, _log, bench_env

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(300)]

MODES = ("raw", "lz4", "zstd_whole", "zstd_auto", "auto")


@pytest.fixture(scope="module")
def auto_run() -> Any:
    out = Path(tempfile.mkdtemp(prefix="p2pbench-auto-"))
    ray_tmp = tempfile.mkdtemp(prefix="p2pa", dir="/tmp")
    env = bench_env(ray_tmp)
    args = ["--kinds", "tensor", "--sizes", "4MiB", "--codecs", ",".join(MODES)]
    args += ["--link", "1gbit", "--reps", "4", "--no-baselines", "--out", str(out)]
    proc = subprocess.run(
        [*_command(), *args], env=env, capture_output=True, text=True, timeout=280, check=False
    )
    yield proc, out
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def test_every_mode_is_measured_and_the_adaptive_ones_compress(auto_run: Any) -> None:
    proc, out = auto_run
    assert proc.returncode == 0, _log(proc)
    doc = json.loads((out / "p2p-bench.json").read_text())
    assert doc["failures"] == [], doc["failures"]
    samples = [s for s in doc["samples"] if s["method"] == "p2p" and s["link"] == "1gbit"]
    unavailable = {u["what"] for u in doc["unavailable"]}
    assert not any("1gbit" in u or "emulat" in u for u in unavailable), doc["unavailable"]
    for mode in MODES:
        got = [s for s in samples if s["codec"] == mode]
        assert got, (mode, _log(proc))
        assert all(s["throughput_Bps"] > 0 and s["nbytes"] == 4 << 20 for s in got)
        wire = {s["wire_bytes"] for s in got}
        if mode == "raw":
            assert all(w >= 4 << 20 for w in wire), wire
        else:  # token ids at 1 Gbit/s: every mode, adaptive ones included, compresses
            assert all(0 < w < (4 << 20) * 0.7 for w in wire), (mode, wire)


def test_the_report_names_each_mode(auto_run: Any) -> None:
    proc, out = auto_run
    assert proc.returncode == 0, _log(proc)
    md = (out / "p2p-bench.md").read_text()
    for mode in MODES:
        assert f"p2p {mode} @ 1gbit" in md, (mode, md[:3000])
