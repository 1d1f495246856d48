"""Run the peers' own test files against p2p, changing only their import lines.

Two peers claim a drop-in: Ray's ``ray.util.collective`` (its single-node CPU tests) and
RLinf's scheduler (``tests/unit_tests/test_worker.py``, ``test_channel.py``,
``test_comm.py``). Their files are not in this repository. The runner takes them from
``../shared/peer-suites`` beside the clone (byte-for-byte copies with provenance), or from
a peer checkout (``--ray-checkout``, ``--rlinf-checkout``), copies them to a temporary
folder, rewrites only the import lines (each rewrite is printed), makes the one printed
fixture edit RLinf's ``test_channel.py`` needs (see ``FIXTURE_EDITS``), supplies the Ray
fixtures the files expect but Ray's wheel does not ship (``_p2p_peer_plugin.py``, loaded
with ``-p``), runs pytest there against the installed p2p packages and prints per-file
counts next to the peer's own.

Usage::

    python tools/peer_suites.py                    # both suites, every case
    python tools/peer_suites.py ray --subset functions  # the first case of each test function
    python tools/peer_suites.py ray --subset files      # the first runnable case of each file
    python tools/peer_suites.py rlinf --check      # exit 1 if an unexpected case fails
    python tools/peer_suites.py --ci               # what `nox -s ci` runs (see CI_SUBSETS)

``--check`` fails the run when a case fails that is not listed in ``KNOWN_FAILURES`` (the
cases that fail on the peer itself, or that read a peer-private attribute, each with its
reason), and when a listed case passes unexpectedly is only reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "peer-suites"


@dataclass(frozen=True)
class Suite:
    """Where a peer keeps its files and how the runner lays them out."""

    name: str
    files: tuple[str, ...]  # paths relative to the suite's folder, copied as they are laid
    shared_dir: str  # folder under ../shared/peer-suites
    checkout_dir: str  # folder inside a checkout of the peer's repository
    peer_passes: int  # cases the peer itself passes on a 2-core CPU machine
    peer_total: int
    rewrites: tuple[tuple[str, str], ...]  # (regex on one import line, replacement)


# Ray's conftest.py is not laid out: it imports Ray's NCCL module at the top, which needs
# CuPy, and the one fixture these files take from it (``ray_start_single_node``: a local
# ``ray.init(num_cpus=8)``, shut down after the case) comes from the runner's plugin.
RAY_FILES = (
    "cpu_util.py",
    *(
        f"single_node_cpu_tests/test_{n}.py"
        for n in (
            "allgather",
            "allreduce",
            "basic_apis",
            "broadcast",
            "gloo_group_isolation",
            "reduce",
            "reducescatter",
            "sendrecv",
        )
    ),
)

SUITES = {
    "ray": Suite(
        name="ray",
        files=RAY_FILES,
        shared_dir="ray-collective",
        checkout_dir="python/ray/util/collective/tests",
        peer_passes=157,
        peer_total=159,
        rewrites=(
            (
                r"^(\s*)import ray\.util\.collective as (\w+)\s*$",
                r"\1import p2p_worker.compat as \2",
            ),
            (
                r"^(\s*)from ray\.util\.collective\.types import",
                r"\1from p2p_worker.compat.types import",
            ),
            # cpu_util.py sits beside the tests' folder in the copy (Ray's wheel lacks it).
            (
                r"^(\s*)from ray\.util\.collective\.tests\.cpu_util import",
                r"\1from cpu_util import",
            ),
        ),
    ),
    "rlinf": Suite(
        name="rlinf",
        files=("test_worker.py", "test_channel.py", "test_comm.py"),
        shared_dir="rlinf-scheduler",
        checkout_dir="tests/unit_tests",
        peer_passes=143,
        peer_total=143,
        rewrites=(
            (
                r"^(\s*)from rlinf\.scheduler\.collective(\.[\w.]+)? import",
                r"\1from p2p_collective import",
            ),
            (r"^(\s*)from rlinf\.scheduler(\.[\w.]+)? import", r"\1from p2p_worker import"),
        ),
    ),
}

# The one edit that is not an import line: RLinf's module-scoped ``channel`` fixture asks
# for both channels, so every case builds the distributed one (three channel workers on
# one node, through RLinf's private ``Channel._initialize``). The edit asks for the
# distributed channel only in the cases that use it. Printed by the runner.
FIXTURE_EDITS = {
    "test_channel.py": (
        "def channel(channel_type, regular_channel, distributed_channel):\n"
        '    """Select channel based on channel_type parameter from test function."""\n'
        '    if channel_type == "distributed":\n'
        "        return distributed_channel\n",
        "def channel(channel_type, regular_channel, request):\n"
        '    """Select channel based on channel_type parameter from test function."""\n'
        '    if channel_type == "distributed":\n'
        '        return request.getfixturevalue("distributed_channel")\n',
    ),
}

_RLINF_MCPG = "test_comm.py::TestMultiChannelProcessGroupFailures::"

# Cases expected to fail on p2p, with the reason. ``--check`` fails on any other failure.
KNOWN_FAILURES = {
    "ray": {
        "test_basic_apis.py::test_destroy_group": (
            "fails on Ray too: re-initialises the group with the default backend (NCCL), "
            "which needs a GPU"
        ),
        "test_gloo_group_isolation.py::test_failure_when_initializing": (
            "fails on Ray too: calls ray.init() while the module's shared Ray is up"
        ),
        "test_gloo_group_isolation.py::test_two_groups_in_one_cluster": (
            "checks isinstance against Ray's internal TorchGLOOGroup and reads its private "
            "gloo context; see docs/concepts/ray-collective.rst"
        ),
    },
    "rlinf": {
        _RLINF_MCPG + "test_recv_propagates_process_group_failure": (
            "builds MultiChannelProcessGroup with object.__new__ and plants fake torch process "
            "groups in RLinf's private _recv_gloo_process_groups; p2p's channels are p2p pair "
            "groups (sizes checked, peer death seen), not lists of torch process groups. The "
            "behaviour it checks (a failure is logged once and raised unchanged) is p2p's "
            "too: packages/p2p-collective/tests/test_multi_channel.py"
        ),
        _RLINF_MCPG + "test_recv_propagates_synchronous_wait_failure": (
            "as test_recv_propagates_process_group_failure: plants a fake torch process group "
            "in RLinf's private _recv_gloo_process_groups"
        ),
        "test_channel.py::TestChannel::test_distributed_channel_creation": (
            "RLinf's distributed channel (one channel worker per node, keys routed by rank "
            "0's ensure_key_replica), built through its private Channel() / _initialize / "
            "_channel_actors_by_rank: p2p has no channel over several channel workers (a "
            "ChannelWorker group of more than one is refused); see docs/migration-rlinf.rst. "
            "The same cases' regular-channel twins pass"
        ),
        "test_channel.py::TestChannel::test_channel_worker_routing": (
            "as test_distributed_channel_creation: RLinf's distributed channel"
        ),
        "test_channel.py::TestChannel::test_channel_worker_isolation": (
            "as test_distributed_channel_creation: RLinf's distributed channel"
        ),
        "test_channel.py::TestChannel::test_channel_worker_rank_assignment": (
            "as test_distributed_channel_creation: RLinf's distributed channel"
        ),
        "test_channel.py::TestChannel::test_channel_worker_selection": (
            "as test_distributed_channel_creation: RLinf's distributed channel"
        ),
        # Every parametrization of a test whose channel_type is "distributed" (the regular
        # twin of each, same test and parameters otherwise, is expected to pass).
        "test_channel.py::TestChannel::*[*distributed]": (
            "the distributed variant of a channel test: RLinf's distributed channel (several "
            "channel workers, built through its private Channel._initialize), which p2p "
            "does not have; the regular variant of the same case runs and passes"
        ),
    },
}

# What ``--ci`` runs (``nox -s ci``), per suite: RLinf's three files whole, and of Ray's
# 159 cases the first case of each file that is not a known failure (7 cases: allgather,
# allreduce, init, broadcast, reduce, reducescatter, send/recv, each on read-only arrays
# from Ray's object store). Each Ray case starts a Ray of its own (15-20 s on a 2-core
# machine), so the whole suite (about 50 minutes there) stays out of ci; `nox -s peers`
# runs it.
CI_SUBSETS: dict[str, str | None] = {"ray": "files", "rlinf": None}

PLUGIN = '''"""Fixtures Ray's collective tests take from Ray's test utilities (not in its wheel).

Written by p2p's tools/peer_suites.py. Everything binds to loopback with a short temp dir.
"""

import os

import pytest
import ray

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

_ray_init = ray.init


def _loopback_init(*args, **kwargs):
    # A local cluster binds to loopback; the peer's own calls are unchanged otherwise.
    if not args and kwargs.get("address") in (None, "local"):
        kwargs.setdefault("_node_ip_address", "127.0.0.1")
    return _ray_init(*args, **kwargs)


ray.init = _loopback_init


@pytest.fixture
def ray_start_single_node():
    info = ray.init(num_cpus=8)
    yield info
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_start_regular_shared():
    info = ray.init(num_cpus=4)
    yield info
    ray.shutdown()


@pytest.fixture
def shutdown_only():
    yield None
    ray.shutdown()


def pytest_collection_modifyitems(config, items):
    subset = os.environ.get("P2P_PEER_SUBSET")
    if subset not in ("functions", "files"):
        return
    known = set(filter(None, os.environ.get("P2P_PEER_KNOWN", "").split(",")))
    seen = set()
    kept, dropped = [], []
    for item in items:
        name = getattr(item, "originalname", item.name)
        key = (item.path.name, name) if subset == "functions" else item.path.name
        if subset == "files" and f"{item.path.name}::{name}" in known:
            dropped.append(item)  # a known failure does not stand for its file
            continue
        (dropped if key in seen else kept).append(item)
        seen.add(key)
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)
'''


@dataclass
class Counts:
    """Outcomes of one file's cases."""

    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)  # (case id, first line)
    kinds: dict[str, str] = field(default_factory=dict)  # case id -> "failed" or "error"
    flaky: list[str] = field(default_factory=list)  # failed, then passed on a rerun

    @property
    def total(self) -> int:
        """Every case of the file."""
        return self.passed + self.failed + self.errors + self.skipped


def suite_source(suite: Suite, checkout: str | None) -> Path:
    """The folder holding the suite's files: a peer checkout, or the shared copies."""
    src = Path(checkout).resolve() / suite.checkout_dir if checkout else SHARED / suite.shared_dir
    missing = [f for f in suite.files if not (src / f).is_file()]
    if missing:
        where = "--" + suite.name + "-checkout" if checkout else str(SHARED)
        raise SystemExit(f"peer_suites: {suite.name}: missing under {src} ({where}): {missing}")
    return src


def rewrite(suite: Suite, name: str, text: str) -> tuple[str, list[str]]:
    """Swap the import lines (and the fixture edit); return the text and what changed."""
    changes: list[str] = []
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        for pattern, repl in suite.rewrites:
            new = re.sub(pattern, repl, line.rstrip("\n"))
            if new != line.rstrip("\n"):
                changes.append(f"{name}:{i + 1}: {line.strip()}  ->  {new.strip()}")
                lines[i] = new + "\n"
                break
    out = "".join(lines)
    edit = FIXTURE_EDITS.get(Path(name).name) if suite.name == "rlinf" else None
    if edit is not None:
        old, new = edit
        if old not in out:
            raise SystemExit(f"peer_suites: {name}: the fixture to edit was not found")
        out = out.replace(old, new)
        changes.append(f"{name}: fixture edit: `channel` takes distributed_channel lazily")
    return out, changes


def lay_out(suite: Suite, src: Path, dest: Path, unchanged: bool) -> list[str]:
    """Copy the suite's files into ``dest`` with their imports swapped (unless ``unchanged``)."""
    changes: list[str] = []
    for rel in suite.files:
        text = (src / rel).read_text(encoding="utf-8")
        if unchanged:
            # Only cpu_util's import path: the wheel does not ship Ray's tests package.
            text, changed = rewrite(
                dataclasses.replace(suite, rewrites=suite.rewrites[-1:]), rel, text
            )
        else:
            text, changed = rewrite(suite, rel, text)
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        changes += changed
    (dest / "_p2p_peer_plugin.py").write_text(PLUGIN, encoding="utf-8")
    return changes


def first_line(message: str | None) -> str:
    """The first line of a failure message, cut to 200 characters."""
    # JUnit XML spells the terminal's colour escapes as "#x1B[..m"; drop them.
    plain = re.sub(r"(\x1b|#x1B)\[[0-9;]*m", "", message or "")
    return plain.strip().split("\n", 1)[0][:200]


def parse_junit(path: Path) -> dict[str, Counts]:
    """Per-file outcomes from pytest's JUnit XML."""
    per_file: dict[str, Counts] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        module = classname.split(".")
        # classname is "folder.test_x" or "folder.test_x.TestClass"
        file_name = next((m + ".py" for m in module if m.startswith("test_")), classname)
        counts = per_file.setdefault(file_name, Counts())
        rest = module[module.index(file_name[:-3]) + 1 :] if file_name[:-3] in module else []
        case_id = f"{file_name}::" + "::".join([*rest, case.get("name", "")])
        failure = case.find("failure")
        error = case.find("error")
        if case.find("skipped") is not None:
            counts.skipped += 1
        elif failure is not None:
            counts.failed += 1
            counts.failures.append((case_id, first_line(failure.get("message"))))
            counts.kinds[case_id] = "failed"
        elif error is not None:
            counts.errors += 1
            counts.failures.append((case_id, first_line(error.get("message"))))
            counts.kinds[case_id] = "error"
        else:
            counts.passed += 1
    return per_file


def known_reason(suite: Suite, case_id: str) -> str | None:
    """The reason a failing case is expected to fail, if it is listed.

    A key without ``[`` names a test with all its parametrizations; a key with ``[`` is
    an ``fnmatch`` pattern over the whole case id (``*[*distributed]``).
    """
    base = case_id.split("[", 1)[0]
    table = KNOWN_FAILURES[suite.name]
    if base in table:
        return table[base]
    for key, reason in table.items():
        if "[" in key and fnmatch.fnmatchcase(case_id, key.replace("[", "[[]", 1)):
            return reason
    return None


def run_suite(suite: Suite, args: argparse.Namespace) -> tuple[dict[str, Counts], list[str]]:
    """Lay the suite out in a temporary folder, run pytest there, return per-file counts."""
    src = suite_source(suite, getattr(args, f"{suite.name}_checkout"))
    work = Path(tempfile.mkdtemp(prefix=f"p2p-peers-{suite.name}-"))
    try:
        if args.unchanged and suite.name != "ray":
            raise SystemExit("peer_suites: --unchanged needs the peer installed: Ray only")
        changes = lay_out(suite, src, work, args.unchanged)
        print(f"== {suite.name}: files from {src}, laid out in {work}")
        for line in changes:
            print("   " + line)
        junit = work / "junit.xml"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(work), os.environ.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
        }
        env.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        tmp = env.setdefault("P2P_RAY_TMPDIR", "/tmp/p2pray")
        env.setdefault("RAY_TMPDIR", tmp)
        os.makedirs(tmp, exist_ok=True)
        subset = subset_of(suite, args)
        if subset:
            env["P2P_PEER_SUBSET"] = subset
            env["P2P_PEER_KNOWN"] = ",".join(k for k in KNOWN_FAILURES[suite.name] if "[" not in k)
        else:
            env.pop("P2P_PEER_SUBSET", None)
        targets = [f for f in suite.files if Path(f).name.startswith("test_")]
        if args.files:
            targets = [
                f for f in targets if Path(f).stem in args.files or Path(f).name in args.files
            ]
        cmd = [
            args.python,
            "-m",
            "pytest",
            *targets,
            "-p",
            "_p2p_peer_plugin",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=",
            f"--junitxml={junit}",
            f"--timeout={args.case_timeout}",
            "-q",
            "-rfE",
            *(["-k", args.k] if args.k else []),
            *args.pytest_args,
        ]
        print("   $ " + " ".join(cmd))
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=work, env=env, check=False)
        print(
            f"== {suite.name}: pytest exit {proc.returncode} in {time.monotonic() - started:.0f} s"
        )
        if not junit.is_file():
            raise SystemExit(
                f"peer_suites: {suite.name}: pytest wrote no report (exit {proc.returncode})"
            )
        per_file = parse_junit(junit)
        if args.reruns:
            rerun_failures(suite, per_file, cmd[:3], cmd[3 + len(targets) :], work, env)
        return per_file, changes
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"   kept {work}")


def rerun_failures(
    suite: Suite,
    per_file: dict[str, Counts],
    pytest_cmd: list[str],
    options: list[str],
    work: Path,
    env: dict[str, str],
) -> None:
    """Run each failing case that is not a known failure once more, in a pytest of its own.

    A case that passes then counts as passed and is printed as flaky (a Ray node that did
    not start in time on a loaded machine is the usual cause); one that fails again stays
    failed. ``per_file`` is updated in place.
    """
    paths = {Path(f).name: f for f in suite.files}
    for name, counts in per_file.items():
        for case_id, message in list(counts.failures):
            if known_reason(suite, case_id) or name not in paths:
                continue
            node = paths[name] + case_id[len(name) :]
            junit = work / "rerun.xml"
            junit.unlink(missing_ok=True)
            opts = [o for o in options if not o.startswith("--junitxml=")]
            cmd = [*pytest_cmd, node, *opts, f"--junitxml={junit}"]
            subprocess.run(cmd, cwd=work, env=env, check=False, capture_output=True)
            again = parse_junit(junit) if junit.is_file() else {}
            if again.get(name) and again[name].passed == 1 and again[name].total == 1:
                counts.failures.remove((case_id, message))
                if counts.kinds.pop(case_id, "failed") == "error":
                    counts.errors -= 1
                else:
                    counts.failed -= 1
                counts.passed += 1
                counts.flaky.append(case_id)
                print(f"  flaky   {case_id}: failed ({message[:120]}), passed on rerun")


def subset_of(suite: Suite, args: argparse.Namespace) -> str | None:
    """The subset of ``suite`` this run takes (``--ci`` decides per suite)."""
    return CI_SUBSETS[suite.name] if args.ci else args.subset


def report(suite: Suite, per_file: dict[str, Counts], subset: str | None) -> tuple[int, list[str]]:
    """Print the per-file table; return our passes and the unexpected failures."""
    print(f"\n{suite.name}: per file (ours)")
    print(f"  {'file':<34} {'cases':>5} {'pass':>5} {'fail':>5} {'error':>5} {'skip':>5}")
    total = Counts()
    for name in sorted(per_file):
        c = per_file[name]
        print(f"  {name:<34} {c.total:>5} {c.passed:>5} {c.failed:>5} {c.errors:>5} {c.skipped:>5}")
        total.passed += c.passed
        total.failed += c.failed
        total.errors += c.errors
        total.skipped += c.skipped
    t = total
    print(f"  {'total':<34} {t.total:>5} {t.passed:>5} {t.failed:>5} {t.errors:>5} {t.skipped:>5}")
    scope = f" (subset {subset!r}: the peer's figure is for every case)" if subset else ""
    peer = f"{suite.name} itself passes {suite.peer_passes} of {suite.peer_total}"
    print(f"  {peer}; p2p passes {total.passed}{scope}")
    unexpected: list[str] = []
    for name in sorted(per_file):
        for case_id, message in per_file[name].failures:
            reason = known_reason(suite, case_id)
            if reason:
                print(f"  known   {case_id}: {reason}")
            else:
                print(f"  FAILED  {case_id}: {message}")
                unexpected.append(case_id)
    return total.passed, unexpected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suites", nargs="*", choices=[*SUITES, "all"], default=["all"])
    parser.add_argument(
        "--ray-checkout", help="a checkout of ray-project/ray to take Ray's files from"
    )
    parser.add_argument(
        "--rlinf-checkout", help="a checkout of RLinf/RLinf to take RLinf's files from"
    )
    parser.add_argument(
        "--subset",
        choices=["functions", "files"],
        help="functions: the first case of each test function; files: the first case of each "
        "file that is not a known failure",
    )
    parser.add_argument(
        "--ci", action="store_true", help="both suites as CI_SUBSETS says, with --check"
    )
    parser.add_argument("--files", nargs="*", help="only these test files (stem or name)")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--python", default=sys.executable, help="interpreter with p2p installed")
    parser.add_argument(
        "--case-timeout", type=int, default=300, help="seconds per case (pytest-timeout)"
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 on a failure not in KNOWN_FAILURES"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument(
        "--reruns",
        type=int,
        choices=[0, 1],
        help="run each unexpected failure once more on its own (default: 1 with --ci, else 0)",
    )
    parser.add_argument("--json", type=Path, help="write the counts here")
    parser.add_argument(
        "--unchanged",
        action="store_true",
        help="run the files against the peer itself (no import swap; Ray only: it is installed)",
    )
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.pytest_args = extra  # after --: more pytest arguments
    if args.reruns is None:
        args.reruns = 1 if args.ci else 0
    names = list(SUITES) if "all" in args.suites else list(dict.fromkeys(args.suites))
    results: dict[str, object] = {}
    bad: list[str] = []
    for name in names:
        suite = SUITES[name]
        per_file, changes = run_suite(suite, args)
        passed, unexpected = report(suite, per_file, subset_of(suite, args))
        bad += unexpected
        results[name] = {
            "peer_passes": suite.peer_passes,
            "peer_total": suite.peer_total,
            "passed": passed,
            "subset": subset_of(suite, args),
            "changes": changes,
            "files": {
                f: {
                    "cases": c.total,
                    "passed": c.passed,
                    "failed": c.failed,
                    "errors": c.errors,
                    "skipped": c.skipped,
                    "failures": [case for case, _ in c.failures],
                    "flaky": c.flaky,
                }
                for f, c in per_file.items()
            },
        }
    if args.json:
        args.json.write_text(json.dumps(results, indent=2), encoding="utf-8")
    if (args.check or args.ci) and bad:
        print(f"\npeer_suites: {len(bad)} case(s) failed that are not known failures")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
