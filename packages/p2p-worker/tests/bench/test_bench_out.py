"""p2p-bench checks its --out folder before any work: a bad one fails in seconds, exit 2."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2p_worker.bench._cli import check_out_dir, main


def _cases(tmp: Path) -> dict[str, tuple[Path, str]]:
    a_file = tmp / "passwd"
    a_file.write_text("root:x:0:0::/root:/bin/sh\n")
    return {
        "existing_file": (a_file, "it is an existing file"),
        "parent_is_a_file": (a_file / "out", "a parent of it is a file"),
        "cannot_create": (Path("/proc/p2p-bench-out-test"), "cannot create it"),
        "cannot_write": (Path("/proc/self"), "cannot write into it"),
    }


@pytest.mark.parametrize(
    "case", ["existing_file", "parent_is_a_file", "cannot_create", "cannot_write"]
)
def test_bad_out_is_refused_before_any_work(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, why = _cases(tmp_path)[case]
    t0 = time.monotonic()
    assert main(["--quick", "--out", str(out)]) == 2
    assert time.monotonic() - t0 < 5  # no Ray cluster, no measurement
    captured = capsys.readouterr()
    assert captured.out == ""  # the run's banner never printed
    line = captured.err.strip()
    assert line.startswith(f"p2p-bench: error: --out: got {str(out)!r}; allowed: a folder")
    assert why in line


def test_good_out_is_created_and_left_clean(tmp_path: Path) -> None:
    out = tmp_path / "a" / "b"
    assert check_out_dir(out) is None
    assert out.is_dir()
    assert list(out.iterdir()) == []  # the probe file is gone
    assert check_out_dir(out) is None  # an existing folder is fine too


def test_console_script_exits_fast_on_an_existing_file(tmp_path: Path) -> None:
    exe = shutil.which("p2p-bench", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("p2p-bench console script not installed in this environment")
    target = tmp_path / "results.json"
    target.write_text("{}")
    t0 = time.monotonic()
    result = subprocess.run(
        [exe, "--quick", "--out", str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert time.monotonic() - t0 < 60
    assert "it is an existing file" in result.stderr
    assert "p2p-bench failed" not in result.stdout
    assert target.read_text() == "{}"
