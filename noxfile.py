"""Every developer and CI task of the p2p monorepo is a nox session; CI only calls them."""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nox

ROOT = Path(__file__).resolve().parent
CONSTRAINTS = str(ROOT / "constraints" / "cpu.txt")
# The GPU job: the same pins, but torch resolves to a CUDA build (see the file's header).
CUDA_CONSTRAINTS = str(ROOT / "constraints" / "cuda.txt")
# What integration(device='cuda') runs: the GPU checks and the GPU worker tests.
GPU_TESTS = ("tests/gpu", "packages/p2p-worker/tests/test_worker_gpu.py")

# Ordered bottom-up: each package may depend on the ones before it.
PACKAGES = ("asyncwork", "compress", "collective", "worker")
# Optional extras installed wherever a session installs the package: p2p-worker's `bench`
# (rich, matplotlib) is what p2p-bench, its tests and mypy over p2p_worker.bench need.
EXTRAS = {"worker": "[bench]"}
# Sessions run on the interpreter that runs nox; `nox --force-python 3.12 ...` picks another
# one from the supported range (requires-python >=3.10,<3.14).

nox.options.default_venv_backend = "venv"  # pip, not uv: uv cannot see the local torch build
nox.options.error_on_missing_interpreters = False
nox.options.sessions = ["ci"]
nox.options.reuse_existing_virtualenvs = True

# numpy: torch warns at import without it, and pytest turns warnings into errors.
TEST_TOOLS = ["pytest", "pytest-timeout", "hypothesis", "numpy"]


def dist_dir(pkg: str) -> str:
    return str(ROOT / "packages" / f"p2p-{pkg}")


def dist_req(pkg: str) -> str:
    """The package's directory with its extras, as pip takes it (``.../p2p-worker[bench]``)."""
    return dist_dir(pkg) + EXTRAS.get(pkg, "")


# pip byte-compiles every installed module by default; for torch that is most of the
# install time (measured here: torch+lz4+zstandard+numpy into a fresh venv, 142 s with,
# 69 s without). Modules are compiled on first import instead, only those used.
PIP_INSTALL = ("--no-compile",)
# ...which only pays if Python may write the compiled files. These machines export
# PYTHONDONTWRITEBYTECODE=1, and then every process compiles torch, Ray and p2p from source
# again: 5.3 s of CPU per `import p2p_worker` against 2.3 s from cached bytecode, paid by
# every Ray actor and spawned peer the tests start (the worker suite: 13-14 min -> 7.5 min
# on 2 cores). The venvs are ours, so every session writes bytecode; the variable is
# dropped here, before any session runs, and everything the sessions start inherits that.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def install(session: nox.Session, *args: str, constraints: str = CONSTRAINTS) -> None:
    """pip install under the CPU constraints (torch==2.13.0 is the on-disk CPU build)."""
    session.install(*PIP_INSTALL, "-c", constraints, *args)


def install_stack(
    session: nox.Session, top: str, *extra: str, constraints: str = CONSTRAINTS
) -> None:
    """Install ``top`` and every p2p package below it, as editable installs, with extras.

    Siblings are not on PyPI, so all of them go into one pip command.
    """
    upto = PACKAGES[: PACKAGES.index(top) + 1]
    args: list[str] = []
    for pkg in upto:
        args += ["-e", dist_req(pkg)]
    install(session, *args, *extra, constraints=constraints)


PRUNE_ENV = "P2P_NOX_PRUNE_VENVS"


def pruned(func: Callable[..., None]) -> Callable[..., None]:
    """Delete the session's virtualenv when the session ends, if ``P2P_NOX_PRUNE_VENVS=1``.

    Each session's venv holds its own torch (about 1 GB). The ci session sets the variable so
    that a full run needs disk for one venv at a time instead of a dozen (about 12 GB).
    """

    @functools.wraps(func)
    def run(session: nox.Session, *args: Any, **kwargs: Any) -> None:
        try:
            func(session, *args, **kwargs)
        finally:
            location = getattr(session.virtualenv, "location", None)
            if os.environ.get(PRUNE_ENV) == "1" and location and Path(location).is_dir():
                shutil.rmtree(location, ignore_errors=True)
                session.log(f"removed {location} ({PRUNE_ENV}=1)")

    return run


def short_tmp_env() -> dict[str, str]:
    """Environment for sessions that start Ray: loopback only, short socket paths."""
    tmp = "/tmp/p2pray"
    os.makedirs(tmp, exist_ok=True)
    return {
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "P2P_RAY_TMPDIR": tmp,
        "RAY_USAGE_STATS_ENABLED": "0",
        "GLOO_SOCKET_IFNAME": "lo",
        "PYTHONUNBUFFERED": "1",
    }


# Where isolation does not matter -- the worker's unit tests and types, the CPU integration
# and release tests, the multi-node suite and the docs all need the whole stack anyway --
# the sessions share one venv instead of installing torch and Ray into one each (minutes
# per venv on a 2-core CI machine). Sessions that prove isolation keep their own venv:
# typecheck(package=...) and tests(package=...) of the lower three, compress_alone.
SHARED_STACK = ROOT / ".nox" / "_shared-stack"
SHARED_TOOLS = (*TEST_TOOLS, "hatchling", "nox", "sphinx", "furo", "mypy")


def shared_stack(session: nox.Session) -> Callable[..., Any]:
    """Create or update the shared venv (editable stack + tools); return a runner for it.

    The venv is rebuilt when the constraints, a package's pyproject.toml or the tool list
    change (a stamp file holds their hash); sources are editable, so edits need nothing.
    The runner takes a program name from the venv's ``bin`` and the arguments.
    """
    bin_dir = SHARED_STACK / "bin"
    inputs = [Path(CONSTRAINTS), *(Path(dist_dir(p)) / "pyproject.toml" for p in PACKAGES)]
    digest = hashlib.sha256(repr((SHARED_TOOLS, EXTRAS)).encode())
    for path in inputs:
        digest.update(path.read_bytes())
    stamp = SHARED_STACK / ".p2p-installed"
    if not (stamp.is_file() and stamp.read_text() == digest.hexdigest()):
        if not (bin_dir / "python").exists():
            session.run(sys.executable, "-m", "venv", str(SHARED_STACK), external=True)
        editable = [arg for p in PACKAGES for arg in ("-e", dist_req(p))]
        python = str(bin_dir / "python")
        pip = [python, "-m", "pip", "install", *PIP_INSTALL, "-c", CONSTRAINTS]
        session.run(*pip, *editable, *SHARED_TOOLS, external=True)
        stamp.write_text(digest.hexdigest())
    venv_env = {
        "VIRTUAL_ENV": str(SHARED_STACK),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
    }

    def run(program: str, *args: str, env: dict[str, str] | None = None, **kw: Any) -> Any:
        merged = {**(env or {}), **venv_env}
        return session.run(str(bin_dir / program), *args, env=merged, external=True, **kw)

    return run


def prune_shared_stack(session: nox.Session) -> None:
    """Delete the shared venv when ``P2P_NOX_PRUNE_VENVS=1`` (the last user in ci calls it)."""
    if os.environ.get(PRUNE_ENV) == "1" and SHARED_STACK.is_dir():
        shutil.rmtree(SHARED_STACK, ignore_errors=True)
        session.log(f"removed {SHARED_STACK} ({PRUNE_ENV}=1)")


@nox.session
@pruned
def lint(session: nox.Session) -> None:
    """Ruff (check and format), import-linter layer contracts, module size and privacy checks."""
    install(session, "ruff", "import-linter")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    srcs = os.pathsep.join(str(Path(dist_dir(p)) / "src") for p in PACKAGES)
    session.run("lint-imports", "--config", "pyproject.toml", env={"PYTHONPATH": srcs})
    session.run("python", "tools/check_modules.py")


@nox.session
@nox.parametrize("package", list(PACKAGES))
@pruned
def typecheck(session: nox.Session, package: str) -> None:
    """mypy --strict on one package, in an env holding only it and what it declares."""
    paths = [str(Path(dist_dir(package)) / "src" / f"p2p_{package}")]
    # The worker's typed seam: the types Worker.send/recv/... must return, per async_op.
    paths += [str(p) for p in (ROOT / "tests" / "typing").glob(f"{package}_*.py")]
    args = ("--config-file", str(ROOT / "pyproject.toml"), *paths)
    if package == "worker":
        # The worker declares the whole stack, which the shared venv holds (+ tools, mypy
        # among them): one venv with torch and Ray fewer to build in ci.
        shared_stack(session)("mypy", *args)
        return
    install_stack(session, package, "mypy")
    session.run("mypy", *args)


@nox.session
@nox.parametrize("package", list(PACKAGES))
@pruned
def tests(session: nox.Session, package: str) -> None:
    """A package's unit tests in an env holding only it and what it declares."""
    paths = session.posargs or [str(Path(dist_dir(package)) / "tests")]
    if package == "worker":
        # The worker declares the whole stack: the shared venv holds exactly that (+ tools).
        shared_stack(session)("pytest", *paths, env=short_tmp_env())
        return
    install_stack(session, package, *TEST_TOOLS)
    session.run("pytest", *paths, env=short_tmp_env())
    if package == "collective" and not session.posargs:
        # Same-node groups use shared memory by default; run the suite again over gloo,
        # the transport between nodes.
        session.run("pytest", *paths, "-q", env={**short_tmp_env(), "P2P_TEST_TRANSPORT": "gloo"})


@nox.session
@pruned
def compress_alone(session: nox.Session) -> None:
    """p2p-compress as a user installs it: non-editable, only what it declares (no numpy added)."""
    install(session, dist_dir("asyncwork"), dist_dir("compress"))
    # A compress-only install must import and run without a single warning (torch warns
    # at import when numpy is missing; p2p-asyncwork and p2p-compress declare it).
    session.run("python", "-W", "error", "-c", "import p2p_compress")
    session.run("p2p-compress", "--help", env={"PYTHONWARNINGS": "error"}, silent=True)
    session.run(
        "python",
        "-c",
        "import importlib.util as u, sys; found = [m for m in ('ray', 'p2p_collective',"
        " 'p2p_worker') if u.find_spec(m)]; import p2p_compress as c;"
        " sys.exit(f'not a compress-only install: {found}' if found else"
        " ('site-packages' not in c.__file__ and f'not installed as a wheel: {c.__file__}'))",
    )
    install(session, *(t for t in TEST_TOOLS if t != "numpy"))
    paths = session.posargs or [str(Path(dist_dir("compress")) / "tests")]
    session.run("pytest", *paths, env=short_tmp_env())


@nox.session
@nox.parametrize("device", ["cpu", "cuda"])
@pruned
def integration(session: nox.Session, device: str) -> None:
    """All packages together: multi-process and Ray tests (cpu), or the GPU matrix (cuda)."""
    env = short_tmp_env()
    if device == "cuda":
        if not (shutil.which("nvidia-smi") or Path("/dev/nvidia0").exists()):
            # No NVIDIA driver at all: say so before spending minutes on a CUDA torch.
            msg = (
                "integration(device='cuda'): no NVIDIA driver here (no nvidia-smi, no /dev/nvidia0)"
            )
            if os.environ.get("P2P_REQUIRE_GPU") == "1":
                session.error(msg + " and P2P_REQUIRE_GPU=1 is set: failing")
            session.skip(msg + "; skipping the GPU tests (set P2P_REQUIRE_GPU=1 to fail instead)")
        install_stack(session, "worker", *TEST_TOOLS, constraints=CUDA_CONSTRAINTS)
        probe = session.run(
            "python",
            "-c",
            "import torch,sys; sys.stdout.write(f'{torch.version.cuda} "
            "{int(torch.cuda.is_available())} {torch.__version__}')",
            silent=True,
        )
        cuda, available, version = str(probe).split()[-3:]
        if available != "1":
            why = (
                "no CUDA GPU visible to torch"
                if cuda != "None"
                else f"torch {version} is a CPU build"
            )
            msg = f"integration(device='cuda'): {why} here"
            if os.environ.get("P2P_REQUIRE_GPU") == "1":
                session.error(msg + " and P2P_REQUIRE_GPU=1 is set: failing")
            session.skip(msg + "; skipping the GPU tests (set P2P_REQUIRE_GPU=1 to fail instead)")
        paths = session.posargs or list(GPU_TESTS)
        session.run("pytest", *paths, "-m", "gpu or multigpu", env=env)
        return
    # In the shared venv: tests/release needs hatchling (builds the four wheels offline)
    # and nox (lists the sessions the CI workflow names); both are in SHARED_TOOLS.
    paths = session.posargs or ["tests/integration", "tests/release"]
    shared_stack(session)("pytest", *paths, "-m", "not gpu and not multigpu", env=env)


@nox.session(python=False)
def multinode(session: nox.Session) -> None:
    """Ray nodes in Linux network namespaces on shaped veths: two joined directly, and a
    four-node module through a switch namespace (root; skips otherwise)."""
    skip = "multinode: cannot create network namespaces here: "
    if not sys.platform.startswith("linux"):
        session.skip(skip + f"they need Linux, this is {sys.platform}")
    if os.geteuid() != 0:
        session.skip(skip + f"it needs root, this runs as euid {os.geteuid()}")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            session.skip(skip + f"`{tool}` (iproute2) is not on PATH")
    run = shared_stack(session)
    # The harness's own probe makes and deletes a namespace pair with a veth link.
    probe = "import netns_cluster as n; print('NETNS:', n.check_support() or '')"
    out = run("python", "-c", probe, env={"PYTHONPATH": str(ROOT / "tools")}, silent=True)
    reason = str(out).rsplit("NETNS:", 1)[-1].strip()
    if reason:
        session.skip(skip + reason)
    paths = session.posargs or ["tests/multinode"]
    run("pytest", *paths, env=short_tmp_env())


@nox.session(python=False)
def peers(session: nox.Session) -> None:
    """Ray's and RLinf's own test files against p2p, only their imports changed."""
    # tools/peer_suites.py takes the files from ../shared/peer-suites or from peer
    # checkouts (--ray-checkout, --rlinf-checkout); ci passes --ci (a subset of Ray's).
    run = shared_stack(session)
    run("python", str(ROOT / "tools" / "peer_suites.py"), *session.posargs, env=short_tmp_env())


@nox.session
def demo(session: nox.Session) -> None:
    """The README's main job: p2p-bench on an embedded local Ray cluster, then p2p-bench rl."""
    install_stack(session, "worker")
    session.run("p2p-bench", *session.posargs, env=short_tmp_env())
    if not session.posargs:  # posargs replace the default: then only what they ask for
        session.run("p2p-bench", "rl", "--quick", env=short_tmp_env())


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmark suite under benchmarks/; each program prints ratios and writes a report."""
    install_stack(session, "worker")
    out = ROOT / "bench-out"
    out.mkdir(exist_ok=True)
    programs = session.posargs or sorted(str(p) for p in (ROOT / "benchmarks").glob("bench_*.py"))
    if not programs:
        session.log("no benchmark programs yet")
        return
    for prog in programs:
        session.run("python", prog, "--out", str(out), env=short_tmp_env())


@nox.session(python=False)
def docs(session: nox.Session) -> None:
    """Build the Sphinx site with warnings as errors."""
    run = shared_stack(session)
    build = ROOT / "docs" / "_build" / "html"
    if build.exists():
        shutil.rmtree(build)
    try:
        run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", str(build))
    finally:
        prune_shared_stack(session)  # docs is the last session of ci to use the shared venv


@nox.session(python=False)
def ci(session: nox.Session) -> None:
    """What .ci/run runs: lint, types, unit, compress-only, integration, multinode, peers, docs."""
    # Few venvs on disk at a time (see pruned and SHARED_STACK); P2P_NOX_PRUNE_VENVS=0 keeps
    # them for reuse.
    os.environ.setdefault(PRUNE_ENV, "1")
    # notify() takes one session per name, so every parametrization is named explicitly.
    names = ["lint"]
    names += [f"typecheck(package='{p}')" for p in PACKAGES]
    # compress_alone runs p2p-compress's unit tests in the compress-only install, so
    # tests(package='compress') would only repeat them.
    names += ["tests(package='asyncwork')", "compress_alone", "tests(package='collective')"]
    # These share one venv; docs comes last and removes it.
    names += ["tests(package='worker')", "integration(device='cpu')", "multinode", "peers"]
    names += ["docs"]
    for name in names:
        session.notify(name, posargs=["--ci"] if name == "peers" else None)
