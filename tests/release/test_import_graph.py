"""tools/check_modules.py's import-circle check, on small packages written for the test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from _import_graph import circles, import_graph, package_modules  # noqa: E402


def write(pkg: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = pkg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return pkg


def found(pkg: Path) -> list[list[str]]:
    return circles(import_graph(package_modules(pkg)))


def test_a_circle_through_a_function_local_import_is_found(tmp_path: Path) -> None:
    pkg = write(
        tmp_path / "demo",
        {
            "__init__.py": "from demo._a import a\n",
            "_a.py": "from demo._b import b\n\ndef a() -> None: ...\n",
            "_b.py": "def b() -> None:\n    from demo import _a\n",
            "_c.py": "import demo._a\n",
        },
    )
    assert found(pkg) == [["demo._a", "demo._b"]]


def test_relative_imports_and_subpackage_inits_count(tmp_path: Path) -> None:
    pkg = write(
        tmp_path / "demo",
        {
            "__init__.py": "",
            "sub/__init__.py": "from .x import X\n",
            "sub/x.py": "X = 1\n",
            "y.py": "from .sub import x\n",  # runs sub/__init__ too
            "sub/z.py": "from ..y import *\n",
        },
    )
    graph = import_graph(package_modules(pkg))
    assert graph["demo.y"] == {"demo.sub", "demo.sub.x"}
    assert graph["demo.sub.z"] == {"demo.y"}
    assert found(pkg) == []


def test_the_repository_has_no_import_circle() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "check_modules.py")],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "module checks passed" in done.stdout
