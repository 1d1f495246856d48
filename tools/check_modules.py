"""Lint checks that ruff and import-linter do not cover.

1. No Python module is longer than 600 lines (split it by concept instead). The files
   that were longer when the limit came down from 800 are listed in ``OVER_LIMIT`` with
   their length then: each may shrink but not grow, and leaves the list (it must) as
   soon as it is within the limit -- so the list only gets shorter (issue 37, item 6).
2. A package imports only the public names of the other p2p packages: no
   ``from p2p_collective._frames._framing import ...`` outside ``p2p_collective`` itself.
3. p2p_asyncwork and p2p_compress never import ``torch.distributed`` (import-linter
   cannot express a ban on a subpackage of an external package).
4. No import circles between the modules of one package (see ``_import_graph.py``), and
   no import of another p2p module inside a function unless a comment on that line or
   the line above names the ``cycle`` it breaks (issue 37 item 1).

Exits non-zero and prints every violation.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_graph import circles, import_graph, local_imports, package_modules

MAX_LINES = 600
OVER_LIMIT: dict[str, int] = {}
"""Files over ``MAX_LINES`` when it came down from 800: path -> the most lines it may have."""
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


def length_problems(rel: str, path: Path) -> list[str]:
    """What is wrong with the length of the file ``path`` (``rel`` from the root)."""
    n = len(path.read_text(encoding="utf-8").splitlines())
    allowed = OVER_LIMIT.get(rel)
    if allowed is None:
        return [f"{rel}: {n} lines (limit {MAX_LINES})"] if n > MAX_LINES else []
    if n <= MAX_LINES:
        return [f"{rel}: {n} lines, within {MAX_LINES}: take it out of OVER_LIMIT"]
    if n > allowed:
        return [f"{rel}: {n} lines, more than the {allowed} it had (limit {MAX_LINES})"]
    return []


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    problems: list[str] = []
    for path in tracked_python_files(root):
        problems.extend(length_problems(path.relative_to(root).as_posix(), path))
        problems.extend(private_imports(path))
    problems += [
        f"{rel}: listed in OVER_LIMIT but gone" for rel in OVER_LIMIT if not (root / rel).exists()
    ]
    for pkg in PACKAGES:
        src = root / "packages" / pkg.replace("_", "-") / "src" / pkg
        modules = package_modules(src)
        for group in circles(import_graph(modules)):
            problems.append(f"import circle in {pkg}: {' <-> '.join(group)}")
        for module, path in modules.items():
            found, _ = local_imports(path, module, uncommented_only=True)
            why = "inside a function (say which import circle it breaks, or move it up)"
            problems += [f"{line} {why}" for line in found]
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s)")
        return 1
    print("module checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
