"""Lint checks that ruff and import-linter do not cover.

1. No Python module is longer than 800 lines (split it by concept instead).
2. A package imports only the public names of the other p2p packages: no
   ``from p2p_collective._frames._framing import ...`` outside ``p2p_collective`` itself.
3. p2p_asyncwork and p2p_compress never import ``torch.distributed`` (import-linter
   cannot express a ban on a subpackage of an external package).
4. No import circles between the modules of one package (see ``_import_graph.py``).

Exits non-zero and prints every violation.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_graph import circles, import_graph, package_modules

MAX_LINES = 800
PACKAGES = ("p2p_asyncwork", "p2p_compress", "p2p_collective", "p2p_worker")
NO_TORCH_DISTRIBUTED = ("p2p_asyncwork", "p2p_compress")


def tracked_python_files(root: Path) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [root / line for line in out.splitlines() if line and (root / line).exists()]


def own_package(path: Path) -> str | None:
    # src/p2p_x/... and the package's own tests (packages/p2p-x/tests/...) both belong to it.
    for part in path.parts:
        if part in PACKAGES:
            return part
        if part.replace("-", "_") in PACKAGES:
            return part.replace("-", "_")
    return None


def private_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    owner = own_package(path)
    problems = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            if (
                owner in NO_TORCH_DISTRIBUTED
                and "/src/" in str(path)
                and (name == "torch.distributed" or name.startswith("torch.distributed."))
            ):
                problems.append(f"{path}:{node.lineno}: {owner} must not import {name}")
            parts = name.split(".")
            if (
                parts[0] in PACKAGES
                and parts[0] != owner
                and any(p.startswith("_") for p in parts[1:])
            ):
                problems.append(f"{path}:{node.lineno}: imports private module {name}")
    return problems


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    problems: list[str] = []
    for path in tracked_python_files(root):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            problems.append(f"{path.relative_to(root)}: {n} lines (limit {MAX_LINES})")
        problems.extend(private_imports(path))
    for pkg in PACKAGES:
        src = root / "packages" / pkg.replace("_", "-") / "src" / pkg
        for group in circles(import_graph(package_modules(src))):
            problems.append(f"import circle in {pkg}: {' <-> '.join(group)}")
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    print("module checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
