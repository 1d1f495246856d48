"""tools/peer_suites.py's command line: what `nox -s peers` and `nox -s ci` pass it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

from peer_suites import parse_args  # noqa: E402
from peer_suites_spec import SUITES  # noqa: E402


def test_a_bare_run_and_ci_take_every_suite() -> None:
    # Python 3.11's argparse refused a bare run when the positional had a default list;
    # `nox -s ci` passes only --ci, so this is the line CI depends on.
    bare = parse_args([])
    assert bare.suites == list(SUITES)
    assert (bare.ci, bare.reruns) == (False, 0)
    ci = parse_args(["--ci"])
    assert ci.suites == list(SUITES)
    assert (ci.ci, ci.reruns) == (True, 1)
    assert parse_args(["all"]).suites == list(SUITES)


def test_named_suites_keep_their_order_once_and_pytest_args_follow_the_dashes() -> None:
    args = parse_args(["rlinf", "ray", "rlinf", "--reruns", "0", "--", "-x", "-k", "send"])
    assert args.suites == ["rlinf", "ray"]
    assert args.reruns == 0
    assert args.pytest_args == ["-x", "-k", "send"]


def test_an_unknown_suite_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["nccl"])
    assert exc.value.code == 2
    assert "invalid choice: 'nccl'" in capsys.readouterr().err
