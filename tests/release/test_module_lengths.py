"""tools/check_modules.py's length rule: 600 lines, and the listed older files only shrink."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import check_modules as cm  # noqa: E402


def write(tmp: Path, lines: int) -> Path:
    path = tmp / "m.py"
    path.write_text("x = 1\n" * lines, encoding="utf-8")
    return path


def test_a_new_file_over_the_limit_is_named_with_its_length(tmp_path: Path) -> None:
    assert cm.length_problems("pkg/m.py", write(tmp_path, cm.MAX_LINES)) == []
    assert cm.length_problems("pkg/m.py", write(tmp_path, cm.MAX_LINES + 1)) == [
        f"pkg/m.py: {cm.MAX_LINES + 1} lines (limit {cm.MAX_LINES})"
    ]


def test_a_listed_file_may_shrink_not_grow_and_leaves_the_list_when_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rel, allowed = "pkg/old.py", cm.MAX_LINES + 200  # the list may be empty by now
    monkeypatch.setattr(cm, "OVER_LIMIT", {rel: allowed})
    assert cm.length_problems(rel, write(tmp_path, allowed)) == []
    assert cm.length_problems(rel, write(tmp_path, allowed - 50)) == []
    grown = cm.length_problems(rel, write(tmp_path, allowed + 1))
    assert grown == [f"{rel}: {allowed + 1} lines, more than the {allowed} it had (limit 600)"]
    short = cm.length_problems(rel, write(tmp_path, cm.MAX_LINES))
    assert short == [f"{rel}: {cm.MAX_LINES} lines, within 600: take it out of OVER_LIMIT"]


def test_the_list_holds_only_files_over_the_limit_today() -> None:
    for rel, allowed in cm.OVER_LIMIT.items():
        n = len((ROOT / rel).read_text(encoding="utf-8").splitlines())
        assert cm.MAX_LINES < n <= allowed, rel
