"""Every code example of the documentation runs here, so the docs cannot drift from the code.

The examples are complete programs under ``docs/examples/``; the pages include them with
``literalinclude``. Each one is run in a fresh interpreter with a timeout and must exit 0
and print ``<name>: ok`` (``<name>`` is the file's stem).

An example that imports a name a p2p package does not have (or an attribute listed in
``EXTRA_REQUIREMENTS``) fails, naming what is missing: a renamed public name must take
the docs with it. The selected examples run two at a time, each in its own interpreter
with its own Ray temp dir: most of an example's time is starting an interpreter and an
embedded Ray cluster, which waits on other processes about as much as it computes.

The docstring examples of every public name (what the API reference shows) run here too,
through :mod:`doctest`, one package per subprocess.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = DOCS / "examples"
PACKAGES = ("p2p_asyncwork", "p2p_compress", "p2p_collective", "p2p_worker")

# Attributes an example needs beyond the names it imports: "module:Object.attribute".
EXTRA_REQUIREMENTS: dict[str, list[str]] = {
    "workers_quickstart.py": [
        "p2p_worker:Worker.create_group",
        "p2p_worker:Worker.timer",
        "p2p_worker:Worker.worker_timer",
    ],
    "workers_send_recv.py": [
        "p2p_worker:Worker.create_group",
        "p2p_worker:Worker.send",
        "p2p_worker:Worker.recv",
        "p2p_worker:Worker.send_tensor",
        "p2p_worker:Worker.recv_tensor",
    ],
    "workers_torch_distributed.py": ["p2p_worker:Worker.create_group"],
    "workers_children.py": [
        "p2p_worker:Worker.create_group",
        "p2p_worker:WorkerGroup.launch_children",
    ],
    "workers_timers.py": [
        "p2p_worker:Worker.create_group",
        "p2p_worker:Worker.timer",
        "p2p_worker:Worker.worker_timer",
    ],
    "channels.py": [
        "p2p_worker:Worker.create_group",
        "p2p_worker:Worker.create_channel",
        "p2p_worker:Worker.connect_channel",
    ],
}

# Seconds per example; examples that start Ray get more (Ray starts slowly on 2 cores).
TIMEOUT_PLAIN = 180
TIMEOUT_RAY = 420


def example_files() -> list[Path]:
    return sorted(EXAMPLES.glob("*.py"))


def p2p_imports(path: Path) -> dict[str, list[str]]:
    """The names an example imports from the p2p packages: {module: [names]}."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in PACKAGES:
                found.setdefault(node.module, []).extend(a.name for a in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    found.setdefault(alias.name, [])
    return found


def missing_requirements(path: Path) -> list[str]:
    """What the example imports from the p2p packages that they do not have."""
    wanted = [f"{mod}:{name}" for mod, names in p2p_imports(path).items() for name in names]
    wanted += [f"{mod}:" for mod, names in p2p_imports(path).items() if not names]
    wanted += EXTRA_REQUIREMENTS.get(path.name, [])
    return missing_names(wanted)


def missing_names(wanted: list[str]) -> list[str]:
    """The ``module:Object.attribute`` items of ``wanted`` that do not exist."""
    missing: list[str] = []
    for item in wanted:
        mod_name, _, dotted = item.partition(":")
        try:
            obj: object = importlib.import_module(mod_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and mod_name.startswith(exc.name):
                missing.append(f"module {mod_name}")
                continue
            raise
        for part in dotted.split(".") if dotted else []:
            if not hasattr(obj, part):
                missing.append(f"{mod_name}.{dotted}")
                break
            obj = getattr(obj, part)
    return missing


def uses_ray(path: Path) -> bool:
    return any(mod.split(".")[0] == "p2p_worker" for mod in p2p_imports(path))


def example_env(tmp: Path) -> dict[str, str]:
    """Loopback only, short socket paths, no attaching to someone else's Ray cluster."""
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["P2P_RAY_TMPDIR"] = str(tmp)
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_program(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    # A short directory: Ray's Unix socket paths must stay under ~107 characters.
    tmp = Path(tempfile.mkdtemp(prefix="p2pdoc", dir="/tmp"))
    try:
        return subprocess.run(
            [sys.executable, *args],
            cwd=tmp,
            env=example_env(tmp),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def example_params() -> list[object]:
    params: list[object] = []
    for path in example_files():
        marks = [pytest.mark.timeout(TIMEOUT_RAY + 60)]
        if uses_ray(path):
            marks += [pytest.mark.ray, pytest.mark.slow]
        params.append(pytest.param(path, id=path.stem, marks=marks))
    return params


# Measured on the 2-core machine, eight Ray examples: 187 s one at a time, 137 s two at a
# time, 145 s three at a time.
PARALLEL_EXAMPLES = 2


def run_example(path: Path) -> subprocess.CompletedProcess[str]:
    return run_program([str(path)], TIMEOUT_RAY if uses_ray(path) else TIMEOUT_PLAIN)


@pytest.fixture(scope="module")
def example_runs(
    request: pytest.FixtureRequest,
) -> Iterator[dict[Path, Future[subprocess.CompletedProcess[str]]]]:
    """Every selected example, started in test order, ``PARALLEL_EXAMPLES`` at a time."""
    selected = [
        item.callspec.params["path"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_example_runs"
    ]
    with ThreadPoolExecutor(PARALLEL_EXAMPLES, thread_name_prefix="docs-example") as pool:
        runs = {path: pool.submit(run_example, path) for path in selected}
        yield runs
        for run in runs.values():
            run.cancel()


@pytest.mark.parametrize("path", example_params())
def test_example_runs(
    path: Path, example_runs: dict[Path, Future[subprocess.CompletedProcess[str]]]
) -> None:
    missing = missing_requirements(path)
    assert not missing, (
        f"{path.name} uses names the packages do not have: {', '.join(missing)}"
        " (a public name renamed or removed? the docs must follow)"
    )
    proc = example_runs[path].result()
    report = f"--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, f"{path.name} exited with {proc.returncode}\n{report}"
    expected = f"{path.stem}: ok"
    assert expected in proc.stdout.splitlines(), f"{path.name} did not print {expected!r}\n{report}"


INCLUDE = re.compile(r"^\s*\.\.\s+literalinclude::\s+(\S+)", re.MULTILINE)


def doc_pages() -> list[Path]:
    return [p for p in DOCS.rglob("*.rst") if "_build" not in p.parts]


def test_every_example_is_shown_and_every_include_exists() -> None:
    """No orphan example (untested prose is the drift this file prevents), no dead include."""
    included: set[Path] = set()
    for page in doc_pages():
        for target in INCLUDE.findall(page.read_text(encoding="utf-8")):
            resolved = (page.parent / target).resolve()
            assert resolved.is_file(), f"{page.relative_to(ROOT)} includes missing {target}"
            included.add(resolved)
    orphans = [p.name for p in example_files() if p.resolve() not in included]
    assert not orphans, f"examples not included by any docs page: {orphans}"


CODE_BLOCK = re.compile(r"^(\s*)\.\.\s+code-block::\s*(\S+)\s*$", re.MULTILINE)


def code_blocks(language: str) -> list[tuple[Path, str]]:
    """The bodies of ``.. code-block:: <language>`` directives in the docs pages."""
    found: list[tuple[Path, str]] = []
    for page in doc_pages():
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            match = CODE_BLOCK.match(line)
            if not match or match.group(2) != language:
                continue
            indent = len(match.group(1))
            body: list[str] = []
            for nxt in lines[i + 1 :]:
                if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= indent:
                    break
                body.append(nxt)
            found.append((page, textwrap.dedent("\n".join(body)).strip("\n")))
    return found


def test_no_python_outside_examples() -> None:
    """Python in the docs comes from docs/examples (run above), never from inline blocks."""
    for language in ("python", "py", "pycon", "python3"):
        blocks = code_blocks(language)
        assert not blocks, f"inline {language} code in {[str(p.name) for p, _ in blocks]}"


def test_yaml_config_blocks_are_valid() -> None:
    """Every ``cluster:`` YAML block of the docs passes the real configuration parser."""
    yaml = pytest.importorskip("yaml")
    blocks = [(page, yaml.safe_load(body)) for page, body in code_blocks("yaml")]
    assert blocks, "the docs show configuration blocks; none were found"
    from p2p_worker import parse_cluster_config

    for page, data in blocks:
        assert isinstance(data, dict), f"{page.name}: a YAML block is not a mapping"
        assert set(data) == {"cluster"}, f"{page.name}: a YAML block is not a cluster: tree"
        parse_cluster_config(data)  # raises ConfigError naming the key path


def test_examples_use_public_names_only() -> None:
    for path in example_files():
        for module in p2p_imports(path):
            private = any(part.startswith("_") for part in module.split("."))
            assert not private, f"{path.name} imports the private module {module}; use public names"


DOCTEST_RUNNER = r"""
import doctest, importlib, sys
name = sys.argv[1]
package = importlib.import_module(name)
# Each example runs in its defining module's globals plus the package's public names,
# as for a user who imported them from the package.
public = {n: getattr(package, n) for n in getattr(package, "__all__", ())}
finder = doctest.DocTestFinder(exclude_empty=True)
runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
tests = finder.find(package, name, extraglobs=public)
seen = set()
for attr, obj in public.items():
    if id(obj) in seen or not (callable(obj) or isinstance(obj, type)):
        continue
    seen.add(id(obj))
    tests += finder.find(obj, f"{name}.{attr}", extraglobs=public)
for test in tests:
    runner.run(test)
result = runner.summarize(verbose=False)
print(f"doctests: attempted={result.attempted} failed={result.failed}")
sys.exit(1 if result.failed else 0)
"""


@pytest.mark.timeout(TIMEOUT_PLAIN + 60)
@pytest.mark.parametrize("package", PACKAGES)
def test_api_reference_examples_run(package: str) -> None:
    """The ``Example:`` sections of the public names, as the API reference shows them."""
    proc = run_program(["-c", DOCTEST_RUNNER, package], TIMEOUT_PLAIN)
    report = f"--- stdout ---\n{proc.stdout[-8000:]}\n--- stderr ---\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, f"doctests of {package} failed\n{report}"
