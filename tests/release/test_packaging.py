"""What ships in each wheel: the Apache-2.0 LICENSE file and the same project metadata;
p2p-worker's benchmark libraries only in its ``bench`` extra.

Builds the four wheels from the working tree (pip wheel, no network: hatchling must be
installed in the test environment) and reads them as an index would.
"""

from __future__ import annotations

import ast
import email.parser
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("asyncwork", "compress", "collective", "worker")
tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")


def _pyproject(pkg: str) -> dict[str, object]:
    with (ROOT / "packages" / f"p2p-{pkg}" / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)["project"]  # type: ignore[no-any-return]


def test_license_is_apache_2_and_every_package_ships_the_same_text() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text.splitlines()[1]
    assert "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    for pkg in PACKAGES:
        assert (ROOT / "packages" / f"p2p-{pkg}" / "LICENSE").read_text(encoding="utf-8") == text
        project = _pyproject(pkg)
        assert project["license"] == "Apache-2.0"
        assert project["license-files"] == ["LICENSE"]


def test_the_four_packages_share_authors_urls_and_classifiers() -> None:
    first = _pyproject(PACKAGES[0])
    for key in ("authors", "urls", "classifiers", "requires-python", "version"):
        assert first.get(key), key
        for pkg in PACKAGES[1:]:
            assert _pyproject(pkg).get(key) == first[key], (pkg, key)
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(first["urls"])  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("hatchling", reason="building wheels offline needs hatchling installed")
    out = tmp_path_factory.mktemp("wheels")
    dists = [str(ROOT / "packages" / f"p2p-{pkg}") for pkg in PACKAGES]
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*cmd, "-w", str(out), *dists], check=True, timeout=300)
    found = {pkg: next(out.glob(f"p2p_{pkg}-*.whl")) for pkg in PACKAGES}
    return found


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pkg", PACKAGES)
def test_wheel_ships_license_and_metadata(pkg: str, wheels: dict[str, Path]) -> None:
    import trove_classifiers

    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    with zipfile.ZipFile(wheels[pkg]) as whl:
        names = whl.namelist()
        lic = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert lic, names
        assert whl.read(lic[0]).decode() == license_text
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(whl.read(meta_name).decode())
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Author"] or meta["Author-email"]
    urls = meta.get_all("Project-URL") or []
    assert any(u.startswith("Source, https://") for u in urls), urls
    classifiers = meta.get_all("Classifier") or []
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.11" in classifiers
    unknown = [c for c in classifiers if c not in trove_classifiers.classifiers]
    assert not unknown
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the expression
    assert f"p2p_{pkg}/py.typed" in names


BENCH_ONLY = ("rich", "matplotlib")


@pytest.mark.timeout(300)
def test_worker_wheel_puts_the_benchmark_libraries_in_the_bench_extra(
    wheels: dict[str, Path],
) -> None:
    with zipfile.ZipFile(wheels["worker"]) as whl:
        meta_name = next(n for n in whl.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(whl.read(meta_name).decode())
    assert meta.get_all("Provides-Extra") == ["bench"]
    requires = meta.get_all("Requires-Dist") or []
    for lib in BENCH_ONLY:
        entries = [r for r in requires if r.split(";")[0].strip().startswith(lib)]
        assert len(entries) == 1, (lib, requires)
        assert entries[0].replace("'", '"').endswith('extra == "bench"'), entries[0]


def test_only_the_benchmark_imports_the_bench_extra() -> None:
    src = ROOT / "packages" / "p2p-worker" / "src" / "p2p_worker"
    offenders = []
    for path in src.rglob("*.py"):
        if "bench" in path.relative_to(src).parts[:1]:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            offenders += [
                f"{path.relative_to(src)}: {n}" for n in names if n.split(".")[0] in BENCH_ONLY
            ]
    assert not offenders


def test_nox_sessions_install_the_bench_extra_with_p2p_worker() -> None:
    # Read, not executed: test_workflow.py registers the noxfile's sessions once per process.
    text = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    extras = next(
        ast.literal_eval(node.value)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Assign)
        and [getattr(t, "id", None) for t in node.targets] == ["EXTRAS"]
    )
    assert extras["worker"] == "[bench]"
    # Every session installs p2p-worker through install_stack or the shared venv, both of
    # which name the package by dist_req (demo and bench run p2p-bench; the shared venv
    # holds the worker's unit tests, integration, release tests and docs).
    assert 'args += ["-e", dist_req(pkg)]' in text
    assert '("-e", dist_req(p))' in text
    assert 'dist_dir("worker")' not in text
