"""Counts that say how easy the house is to read, per package (issue 37's closing numbers).

For each p2p package's source (``packages/p2p-x/src/p2p_x``):

* **folders** -- its sub-packages and top-level modules, each one node of the folder graph;
* **folder circles** -- groups of folders that reach each other through imports (0 when
  the folders are layers), the pairs of folders that import each other directly, and the
  module imports between the folders of a circle (one of each such pair points up);
* **local imports** -- ``import`` statements of p2p modules inside a function; those whose
  line (or the line above) names the ``cycle`` they break are counted apart;
* **over 600** -- modules longer than ``check_modules.MAX_LINES``, and the longest module;
* **Any** -- ``Any`` as a whole word in the source (issue 37 item 7);
* **public names** -- the length of the package's ``__all__``.

Usage: ``python tools/house_report.py [--json]``. It only reads files; ``check_modules.py``
is what fails the lint.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _import_graph import circles, import_graph, local_imports, package_modules
from check_modules import MAX_LINES, PACKAGES

ROOT = Path(__file__).resolve().parent.parent
_ANY = re.compile(r"\bAny\b")


@dataclass
class PackageCounts:
    """The counts of one package (see the module docstring for what each means)."""

    package: str
    modules: int
    folders: list[str]
    folder_circles: list[list[str]]
    mutual_pairs: list[str]
    imports_in_circles: list[str]
    local_imports: list[str]
    local_imports_breaking_a_cycle: int
    over_limit: list[str]
    longest: str
    any_count: int
    public_names: int
    folder_edges: dict[str, list[str]] = field(default_factory=dict)


def folder_of(module: str) -> str:
    """``p2p_x._a._b`` -> ``_a``; the package root itself is ``<root>``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "<root>"


def public_names(src: Path) -> int:
    tree = ast.parse((src / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value = node.value
            if isinstance(value, ast.List | ast.Tuple):
                return len(value.elts)
    return 0


def count(pkg: str) -> PackageCounts:
    """Every count of package ``pkg`` (``p2p_worker``, ...)."""
    src = ROOT / "packages" / pkg.replace("_", "-") / "src" / pkg
    modules = package_modules(src)
    graph = import_graph(modules)
    folder_graph: dict[str, set[str]] = {}
    for mod, targets in graph.items():
        here = folder_of(mod)
        folder_graph.setdefault(here, set())
        for target in targets:
            if folder_of(target) != here:
                folder_graph[here].add(folder_of(target))
    folder_graph.pop("<root>", None)  # the root __init__ re-exports; nothing imports it
    for targets in folder_graph.values():
        targets.discard("<root>")
    groups = circles(folder_graph)
    in_circle = {f: i for i, g in enumerate(groups) for f in g}
    mutual = sorted(
        f"{a} <-> {b}"
        for a, ts in folder_graph.items()
        for b in ts
        if a < b and a in folder_graph.get(b, ())
    )
    inside = sorted(
        f"{mod} -> {target}"
        for mod, targets in graph.items()
        for target in targets
        if folder_of(mod) != folder_of(target)
        and folder_of(mod) in in_circle
        and in_circle.get(folder_of(target)) == in_circle[folder_of(mod)]
    )
    local: list[str] = []
    commented = 0
    lengths: dict[str, int] = {}
    anys = 0
    for mod, path in modules.items():
        found, named = local_imports(path, mod)
        local += found
        commented += named
        text = path.read_text(encoding="utf-8")
        lengths[path.relative_to(ROOT).as_posix()] = len(text.splitlines())
        anys += len(_ANY.findall(text))
    longest = max(lengths, key=lambda rel: lengths[rel])
    return PackageCounts(
        package=pkg,
        modules=len(modules),
        folders=sorted(folder_graph),
        folder_circles=groups,
        mutual_pairs=mutual,
        imports_in_circles=inside,
        local_imports=sorted(local),
        local_imports_breaking_a_cycle=commented,
        over_limit=sorted(f"{rel} ({n})" for rel, n in lengths.items() if n > MAX_LINES),
        longest=f"{longest} ({lengths[longest]})",
        any_count=anys,
        public_names=public_names(src),
        folder_edges={f: sorted(t) for f, t in sorted(folder_graph.items())},
    )


def render(counts: PackageCounts) -> str:
    lines = [
        f"{counts.package}: {counts.modules} modules in {len(counts.folders)} folders/modules",
        f"  folder circles: {len(counts.folder_circles)} {counts.folder_circles or ''}".rstrip(),
        f"  folder pairs importing each other: {len(counts.mutual_pairs)}"
        f" {counts.mutual_pairs or ''}".rstrip(),
        f"  module imports between folders of a circle: {len(counts.imports_in_circles)}",
        f"  function-local p2p imports: {len(counts.local_imports)}"
        f" ({counts.local_imports_breaking_a_cycle} commented as breaking a cycle)",
        *(f"    {line}" for line in counts.local_imports),
        f"  modules over {MAX_LINES} lines: {len(counts.over_limit)}; longest {counts.longest}",
        *(f"    {line}" for line in counts.over_limit),
        f"  'Any' as a word: {counts.any_count}",
        f"  public names (__all__): {counts.public_names}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")
    args = parser.parse_args(argv)
    all_counts = [count(pkg) for pkg in PACKAGES]
    if args.json:
        print(json.dumps([asdict(c) for c in all_counts], indent=2))
    else:
        print("\n".join(render(c) for c in all_counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
