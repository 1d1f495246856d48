"""tools/house_report.py: the counts issue 37's closing note quotes, checked on this tree."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import p2p_asyncwork
import p2p_worker

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import house_report as hr  # noqa: E402


def test_counts_match_what_the_packages_hold() -> None:
    worker = hr.count("p2p_worker")
    assert worker.folder_circles == []  # p2p_worker's folders are layers (the lint says so)
    assert worker.mutual_pairs == []
    assert worker.public_names == len(p2p_worker.__all__)
    assert hr.count("p2p_asyncwork").public_names == len(p2p_asyncwork.__all__)
    assert "_process" in worker.folders
    assert "_runtime" in worker.folders


def test_local_imports_are_found_and_a_cycle_comment_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text(
        "def f():\n"
        "    from p2p_x._a import b\n"
        "    import os\n"
        "def g():\n"
        "    # breaks the cycle _a -> _b -> _a\n"
        "    from p2p_x._b import c\n",
        encoding="utf-8",
    )
    found, commented = hr.local_imports(path, "p2p_x.m")
    assert found == [
        f"{path}:2: p2p_x.m.f imports p2p_x._a",
        f"{path}:6: p2p_x.m.g imports p2p_x._b",
    ]
    assert commented == 1
    # what the lint refuses: only the import that does not say which circle it breaks
    assert hr.local_imports(path, "p2p_x.m", uncommented_only=True) == (found[:1], 1)


def test_the_command_prints_every_package_as_json() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "house_report.py"), "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    data = json.loads(out)
    assert [d["package"] for d in data] == [
        "p2p_asyncwork",
        "p2p_compress",
        "p2p_collective",
        "p2p_worker",
    ]
    assert all(d["any_count"] >= 0 and d["modules"] > 0 for d in data)
