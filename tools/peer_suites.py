"""Run the peers' own test files against p2p, changing only their import lines.

Two peers claim a drop-in: Ray's ``ray.util.collective`` (its single-node CPU tests) and
RLinf's scheduler (``tests/unit_tests/test_worker.py``, ``test_channel.py``,
``test_comm.py``). Their files are not in this repository. The runner takes them from
``../shared/peer-suites`` beside the clone (byte-for-byte copies with provenance), or from
a peer checkout (``--ray-checkout``, ``--rlinf-checkout``), copies them to a temporary
folder, rewrites only the import lines (each rewrite is printed), makes the one printed
fixture edit RLinf's ``test_channel.py`` needs, supplies the Ray fixtures the files expect
but Ray's wheel does not ship (``peer_suites_plugin.py``, loaded with ``-p``), runs
pytest there against the installed p2p packages and prints per-file counts next to the
peer's own.

Usage::

    python tools/peer_suites.py                    # both suites, every case
    python tools/peer_suites.py ray --subset functions  # the first case of each test function
    python tools/peer_suites.py ray --subset files      # the first runnable case of each file
    python tools/peer_suites.py rlinf --check      # exit 1 if an unexpected case fails
    python tools/peer_suites.py --ci               # what `nox -s ci` runs (see CI_SUBSETS)

What the suites are and what is expected of them is in ``peer_suites_spec.py``.
``--check`` fails the run when a case fails that is not listed in ``KNOWN_FAILURES`` (the
cases that fail on the peer itself, or that read a peer-private attribute, each with its
reason), and when a listed case passes unexpectedly is only reported.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from peer_suites_spec import (
    CI_SUBSETS,
    FIXTURE_EDITS,
    KNOWN_FAILURES,
    SUITES,
    Suite,
    known_reason,
)

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "peer-suites"
PLUGIN = Path(__file__).resolve().parent / "peer_suites_plugin.py"


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
    shutil.copyfile(PLUGIN, dest / "_p2p_peer_plugin.py")
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


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The runner's options; what follows ``--`` goes to pytest as ``pytest_args``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # Checked below, not with choices=: Python 3.11's argparse checks an empty nargs="*"
    # positional against choices as one value ([] or a default list is not a choice) and
    # refused a bare run, which is what `nox -s ci` makes.
    choices = [*SUITES, "all"]
    parser.add_argument(
        "suites", nargs="*", metavar="{" + ",".join(choices) + "}", help="default: all"
    )
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
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.pytest_args = extra  # after --: more pytest arguments
    unknown = [s for s in args.suites if s not in choices]
    if unknown:
        parser.error(f"argument suites: invalid choice: {unknown[0]!r} (choose from {choices})")
    if args.reruns is None:
        args.reruns = 1 if args.ci else 0
    every = not args.suites or "all" in args.suites
    args.suites = list(SUITES) if every else list(dict.fromkeys(args.suites))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    names = args.suites
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
