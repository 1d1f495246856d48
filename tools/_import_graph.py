"""The import graph of one package's modules, and the circles in it.

Every ``import`` statement counts, at module level or inside a function: a function-local
import hides a circle from the interpreter but not from a reader, who still has to know
both modules to follow either. ``from pkg import name`` counts as an import of
``pkg.name`` when that is a module, and of ``pkg`` itself when ``pkg`` is a subpackage
(its ``__init__`` runs first).
"""

from __future__ import annotations

import ast
from pathlib import Path


def package_modules(src_pkg: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package rooted at ``src_pkg``."""
    root = src_pkg.parent
    found: dict[str, Path] = {}
    for path in sorted(src_pkg.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(target: str, modules: dict[str, Path]) -> str | None:
    """The innermost known module that ``target`` names (``a.b.c`` -> ``a.b`` if no ``c``)."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _targets(node: ast.AST, here: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = here.split(".")
        if not is_package:
            anchor = anchor[:-1]
        anchor = anchor[: len(anchor) - node.level + 1]
        base = ".".join([*anchor, base]) if base else ".".join(anchor)
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (the package root excluded).

    The root ``__init__`` re-exports the public names, so every module "imports" it only
    to be imported from outside; edges into the root are not counted.
    """
    roots = {name for name in modules if "." not in name}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            for target in _targets(node, name, path.name == "__init__.py"):
                hit = _resolve(target, modules)
                if hit is not None and hit != name and hit not in roots:
                    edges.add(hit)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Groups of modules that reach each other through imports (each group sorted)."""
    order: list[str] = []
    seen: set[str] = set()

    def finish_order(start: str) -> None:  # iterative DFS: post-order of the graph
        stack = [(start, iter(sorted(graph.get(start, ()))))]
        seen.add(start)
        while stack:
            node, it = stack[-1]
            nxt = next((w for w in it if w not in seen), None)
            if nxt is None:
                stack.pop()
                order.append(node)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))

    for node in sorted(graph):
        if node not in seen:
            finish_order(node)
    reverse: dict[str, set[str]] = {n: set() for n in graph}
    for src, dsts in graph.items():
        for dst in dsts:
            reverse.setdefault(dst, set()).add(src)
    groups: list[list[str]] = []
    assigned: set[str] = set()
    for node in reversed(order):  # Kosaraju: components of the reversed graph
        if node in assigned:
            continue
        comp, todo = [], [node]
        assigned.add(node)
        while todo:
            cur = todo.pop()
            comp.append(cur)
            for prev in reverse.get(cur, ()):
                if prev not in assigned:
                    assigned.add(prev)
                    todo.append(prev)
        if len(comp) > 1:
            groups.append(sorted(comp))
    return sorted(groups)


def local_imports(
    path: Path, module: str, *, uncommented_only: bool = False
) -> tuple[list[str], int]:
    """Imports of p2p modules inside functions in ``path``: (described, how many name a cycle).

    An import counts as commented when its line or the line above says ``cycle`` (the
    circle it breaks). With ``uncommented_only`` only the others are described.
    """
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    found: list[str] = []
    seen: set[int] = set()
    commented = 0
    for func in ast.walk(ast.parse(text, filename=str(path))):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(func):
            if getattr(node, "lineno", None) in (None, *seen):
                continue
            if isinstance(node, ast.ImportFrom):
                target = node.module or ""
                if not node.level and not target.startswith("p2p_"):
                    continue
            elif isinstance(node, ast.Import):
                target = node.names[0].name
                if not target.startswith("p2p_"):
                    continue
            else:
                continue
            seen.add(node.lineno)  # a nested function is walked again from its parent
            around = " ".join(lines[max(node.lineno - 2, 0) : node.lineno]).lower()
            if "cycle" in around:
                commented += 1
                if uncommented_only:
                    continue
            found.append(f"{path}:{node.lineno}: {module}.{func.name} imports {target}")
    return found, commented
