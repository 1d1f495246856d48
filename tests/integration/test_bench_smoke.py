"""Smoke test of the main job: ``p2p-bench --quick`` end to end, checked by its outputs.

The command runs as a subprocess, exactly as a user runs it (embedded local Ray on
127.0.0.1, short temp dir). The test reads what it wrote -- the JSON of every sample,
the Markdown report and the PNG plot -- and checks their content, not just the exit
status. A codec or link the installed stack does not provide yet must be reported as
unavailable (with a reason), never measured as something it is not.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(420)]

KINDS = ("tensor", "tensor_list", "tensor_dict", "dataclass", "object")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _command() -> list[str]:
    script = Path(sys.executable).with_name("p2p-bench")
    if script.exists():
        return [str(script)]
    found = shutil.which("p2p-bench")
    if found:
        return [found]
    return [sys.executable, "-c", "import sys; from p2p_worker.bench import main; sys.exit(main())"]


def bench_env(ray_tmp: str) -> dict[str, str]:
    """The environment of a ``p2p-bench`` run as a user starts it on one machine.

    An embedded local Ray (never an outer cluster's ``RAY_ADDRESS``) with its own short
    temp dir ``ray_tmp``, gloo on loopback, unbuffered output and a wide table.
    """
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        P2P_RAY_TMPDIR=ray_tmp,
        RAY_USAGE_STATS_ENABLED="0",
        GLOO_SOCKET_IFNAME="lo",
        PYTHONUNBUFFERED="1",
        COLUMNS="160",
    )
    return env


@pytest.fixture(scope="module")
def quick_run() -> Any:
    out = Path(tempfile.mkdtemp(prefix="p2pbench-"))
    ray_tmp = tempfile.mkdtemp(prefix="p2pb", dir="/tmp")
    env = bench_env(ray_tmp)
    proc = subprocess.run(
        [*_command(), "--quick", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    yield proc, out
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _log(proc: subprocess.CompletedProcess[str]) -> str:
    tail_out, tail_err = proc.stdout[-6000:], proc.stderr[-6000:]
    return f"exit {proc.returncode}\n--- stdout\n{tail_out}\n--- stderr\n{tail_err}"


def test_exits_zero_and_writes_three_files(quick_run: Any) -> None:
    proc, out = quick_run
    assert proc.returncode == 0, _log(proc)
    for name in ("p2p-bench.json", "p2p-bench.md", "p2p-bench.png"):
        assert (out / name).is_file(), f"{name} missing\n{_log(proc)}"
    assert "MB/s (median of 3) — loopback" in proc.stdout


def test_json_has_positive_samples_for_every_method_and_kind(quick_run: Any) -> None:
    proc, out = quick_run
    doc = json.loads((out / "p2p-bench.json").read_text())
    assert doc["schema"] == "p2p-bench/1"
    assert doc["failures"] == [], doc["failures"]
    samples = doc["samples"]
    assert samples, _log(proc)
    assert all(s["seconds"] > 0 and s["throughput_Bps"] > 0 for s in samples)
    assert all(s["nbytes"] > 0 for s in samples)
    for method in ("gloo", "ray", "raycoll", "p2p"):
        for kind in KINDS:
            if method == "raycoll" and kind == "object":  # Ray's collectives: tensors only
                continue
            got = [s for s in samples if s["method"] == method and s["kind"] == kind]
            assert got, f"no {method} samples for {kind}"
            sizes = {s["size"] for s in got}
            assert len(sizes) == (1 if kind == "object" else 2), (method, kind, sizes)
    # every codec is either measured or reported unavailable with a reason
    unavailable = {u["what"]: u["reason"] for u in doc["unavailable"]}
    for codec in ("raw", "lz4", "zstd"):
        measured = [s for s in samples if s["method"] == "p2p" and s["codec"] == codec]
        if codec == "raw":
            assert measured
        elif not measured:
            assert unavailable.get(f"codec {codec}"), (codec, unavailable)
        else:
            # compression on the wire: the token-id tensor travels in fewer bytes
            tensor = [s for s in measured if s["kind"] == "tensor" and s["wire_bytes"]]
            assert tensor
            assert all(s["wire_bytes"] < s["nbytes"] for s in tensor)
    assert doc["data"]["tensor"].startswith("one int64 tensor of token ids")
    ratios = {(r["series"], r["against"]) for r in doc["ratios"]}
    assert ("p2p raw", "torch.distributed gloo") in ratios
    assert ("p2p raw", "Ray object store") in ratios
    assert ("p2p raw", "ray.util.collective") in ratios
    skipped = {s["what"]: s["reason"] for s in doc["skipped"]}
    assert skipped["ray.util.collective object"] == "ray.util.collective sends tensors only"


def test_markdown_has_tables_ratio_lines_and_the_plot(quick_run: Any) -> None:
    _, out = quick_run
    md = (out / "p2p-bench.md").read_text()
    assert md.startswith("# p2p-bench report")
    assert "![throughput against payload size](p2p-bench.png)" in md
    assert (
        "| kind | size | torch.distributed gloo | Ray object store | ray.util.collective"
        " | p2p raw" in md
    )
    for kind in KINDS:
        assert f"\n| {kind} | " in md, kind
    assert "**p2p raw** vs **torch.distributed gloo**: " in md
    assert "**p2p raw** vs **Ray object store**: " in md
    assert "**p2p raw** vs **ray.util.collective**: " in md
    assert "- tensor 64 KiB (loopback): p2p raw = " in md
    assert "x torch.distributed gloo" in md
    assert "## Data" in md
    assert "## How it is measured" in md


def test_png_is_a_real_image(quick_run: Any) -> None:
    _, out = quick_run
    data = (out / "p2p-bench.png").read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 600
    assert height >= 400
    assert len(data) > 20_000
