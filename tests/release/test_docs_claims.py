"""What the README and the overview tell a new user is true of this repository.

* Every ``pip install`` of packages from the clone names all the p2p packages the named
  ones depend on, in the same command (the siblings are on no index, so a command that
  leaves one out fails with "No matching distribution found").
* ``pip install p2p-<name>`` from an index is only mentioned as the future it is.
* NCCL and CUDA IPC are called planned wherever they are named: today the collective
  layer moves CPU tensors over gloo and same-node shared memory.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "docs" / "overview.rst", ROOT / "docs" / "getting-started.rst"]
tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")


def _p2p_deps(dist: str) -> set[str]:
    with (ROOT / "packages" / dist / "pyproject.toml").open("rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return {re.split(r"[=<>!~ ]", d, maxsplit=1)[0] for d in deps if d.startswith("p2p-")}


def _closure(dist: str) -> set[str]:
    out = {dist}
    for dep in _p2p_deps(dist):
        out |= _closure(dep)
    return out


def _commands(path: Path) -> list[str]:
    text = re.sub(r"\\\n\s*", " ", path.read_text(encoding="utf-8"))
    return [m.group(0) for m in re.finditer(r"pip install[^\n`]*", text)]


def _paragraphs(path: Path) -> list[str]:
    return re.split(r"\n\s*\n", path.read_text(encoding="utf-8"))


def test_install_commands_from_the_clone_name_every_sibling_they_need() -> None:
    checked = 0
    for doc in DOCS:
        for cmd in _commands(doc):
            named = set(re.findall(r"(?:\./)?packages/(p2p-[a-z]+)", cmd))
            if not named:
                continue
            checked += 1
            needed = set().union(*(_closure(d) for d in named))
            assert needed <= named, f"{doc.name}: {cmd!r} misses {sorted(needed - named)}"
    assert checked >= 3


def test_bare_index_installs_are_only_mentioned_as_the_future() -> None:
    for doc in DOCS:
        for para in _paragraphs(doc):
            if re.search(r"pip install p2p-[a-z]", para):
                assert "index" in para, f"{doc.name}: {para!r}"


@pytest.mark.parametrize("word", ["NCCL", "CUDA IPC", "same-device IPC"])
def test_gpu_transports_are_called_planned(word: str) -> None:
    for doc in [*DOCS, ROOT / "packages" / "p2p-collective" / "pyproject.toml"]:
        for para in _paragraphs(doc):
            if word in para:
                assert re.search(r"planned|not yet", para), f"{doc.name}: {para!r}"


def test_collective_description_says_what_is_true_today() -> None:
    with (ROOT / "packages" / "p2p-collective" / "pyproject.toml").open("rb") as f:
        description = tomllib.load(f)["project"]["description"]
    assert "gloo" in description
    assert "shared memory" in description
    assert "CPU tensors" in description
