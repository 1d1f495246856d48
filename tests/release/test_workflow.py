"""The CI workflow runs as written: every ``run:`` line is valid bash with the matrix filled in,
and every nox session it names exists in the noxfile.

``run: nox -s ${{ matrix.session }}`` with ``tests(package='asyncwork')`` was a bash syntax
error in five of nine jobs; this test catches that class of mistake before a runner does.
"""

from __future__ import annotations

import functools
import itertools
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))
BASH = shutil.which("bash")

# Stand-ins for the commands a run line calls: they print nox's argv (NUL-separated) and
# nothing else runs. `sudo -E env "PATH=..." python -m nox ...` reaches the same printer.
_STUBS = r"""
sudo() { while [ "$#" -gt 0 ] && [ "$1" != python ] && [ "$1" != python3 ]; do shift; done; "$@"; }
python() { if [ "$1 $2" = "-m nox" ]; then shift 2; printf 'NOX\0'; printf '%s\0' "$@"; fi; }
python3() { python "$@"; }
nox() { python -m nox "$@"; }
"""


def _matrix_rows(job: dict[str, Any]) -> list[dict[str, Any]]:
    matrix = (job.get("strategy") or {}).get("matrix") or {}
    include = matrix.get("include") or []
    axes = {k: v for k, v in matrix.items() if k not in ("include", "exclude")}
    rows = [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
    if not axes:
        rows = []
    rows += [dict(row) for row in include]
    return rows or [{}]


def _fill(text: str, row: dict[str, Any]) -> str:
    def repl(match: re.Match[str]) -> str:
        expr = match.group(1).strip()
        if expr.startswith("matrix."):
            return str(row.get(expr.removeprefix("matrix."), ""))
        return "x"  # secrets, env, github context: any word

    return re.sub(r"\$\{\{(.*?)\}\}", repl, text)


def _run_lines() -> list[tuple[str, str]]:
    out = []
    for wf in WORKFLOWS:
        doc = yaml.safe_load(wf.read_text(encoding="utf-8"))
        for job_id, job in doc["jobs"].items():
            for row in _matrix_rows(job):
                for i, step in enumerate(job.get("steps", [])):
                    if "run" in step:
                        label = f"{wf.name}:{job_id}:step{i}:{row or ''}"
                        out.append((label, _fill(step["run"], row)))
    return out


RUN_LINES = _run_lines()


def _nox_sessions() -> set[str]:
    listing = subprocess.run(
        [sys.executable, "-m", "nox", "-l", "-f", str(ROOT / "noxfile.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        cwd=ROOT,
    ).stdout
    names = {m.group(1) for m in re.finditer(r"^[-*] (\S+) ->", listing, flags=re.M)}
    return names | {n.split("(")[0] for n in names}


@functools.cache
def _load_noxfile() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("p2p_noxfile", ROOT / "noxfile.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # registers the sessions with nox: once per process
    return module


def _noxfile() -> Any:
    pytest.importorskip("nox", reason="loading the noxfile needs nox installed")
    return _load_noxfile()


def test_the_workflow_has_run_lines() -> None:
    assert WORKFLOWS
    assert len(RUN_LINES) >= 10


@pytest.mark.skipif(BASH is None, reason="needs bash")
@pytest.mark.parametrize(("label", "script"), RUN_LINES, ids=[lbl for lbl, _ in RUN_LINES])
def test_run_line_is_valid_bash(label: str, script: str) -> None:
    result = subprocess.run(
        [str(BASH), "-n", "-c", script], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, f"{label}: {script!r}\n{result.stderr}"


@pytest.mark.skipif(BASH is None, reason="needs bash")
def test_every_nox_session_named_exists() -> None:
    pytest.importorskip("nox", reason="listing the sessions needs nox installed")
    sessions = _nox_sessions()
    assert "ci" in sessions
    called = []
    for label, script in RUN_LINES:
        result = subprocess.run(
            [str(BASH), "-c", _STUBS + script],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        argv = result.stdout.split("\0")
        if "NOX" not in argv:
            continue
        argv = argv[argv.index("NOX") + 1 :]
        assert "-s" in argv, f"{label}: {argv}"
        name = argv[argv.index("-s") + 1]
        assert name in sessions, f"{label}: nox -s {name!r} is not a session ({sorted(sessions)})"
        called.append(name)
    assert "integration(device='cuda')" in called
    assert "multinode" in called
    assert any(n.startswith("tests(") for n in called)


def test_the_gpu_session_has_its_own_constraints_and_existing_tests() -> None:
    noxfile = _noxfile()
    cuda = Path(noxfile.CUDA_CONSTRAINTS)
    assert cuda.name == "cuda.txt"
    assert cuda != Path(noxfile.CONSTRAINTS)
    lines = [ln.strip() for ln in cuda.read_text().splitlines()]
    pins = [ln for ln in lines if ln and not ln.startswith("#")]
    nested = [ln.split(maxsplit=1)[1] for ln in pins if ln.startswith("-c ")]
    every = pins + [p for n in nested for p in (cuda.parent / n).read_text().splitlines()]
    assert "torch==2.13.0" in every
    for path in noxfile.GPU_TESTS:
        target = ROOT / path
        assert target.exists(), path
        files = [target] if target.is_file() else sorted(target.rglob("test_*.py"))
        assert any("pytest.mark.gpu" in f.read_text() for f in files), path


class _Recorder:
    """Stands in for nox's Session in the ci session, which only calls notify()."""

    def __init__(self) -> None:
        self.notified: list[str] = []
        self.posargs: dict[str, list[str] | None] = {}

    def notify(self, name: str, posargs: list[str] | None = None) -> None:
        self.notified.append(name)
        self.posargs[name] = posargs


def test_ci_session_runs_multinode_and_the_compress_only_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("P2P_NOX_PRUNE_VENVS", raising=False)
    noxfile = _noxfile()
    recorder = _Recorder()
    noxfile.ci.func(recorder)
    sessions = _nox_sessions()
    assert set(recorder.notified) <= sessions
    for name in ("lint", "compress_alone", "integration(device='cpu')", "multinode", "docs"):
        assert name in recorder.notified
    # The peers' own test files, with the runner's CI selection (and its check).
    assert recorder.posargs["peers"] == ["--ci"]
    for pkg in ("asyncwork", "compress", "collective", "worker"):
        assert f"typecheck(package='{pkg}')" in recorder.notified
    assert recorder.notified[-1] == "docs"  # it removes the shared venv the others use
    (ROOT / ".ci" / "run").read_text().index("nox -s ci")
