"""``p2p-bench`` without the ``bench`` extra: a clear message naming the install, no work.

The subprocess runs the real command with ``rich`` and ``matplotlib`` made unimportable
(``sys.modules[name] = None`` makes ``import name`` raise ``ImportError``, as a missing
package does), so nothing in this test depends on which packages the venv holds.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from p2p_worker.bench._cli import INSTALL_HINT, missing_bench_extra

pytestmark = pytest.mark.timeout(120)

_RUN = (
    "import sys\n"
    "for name in {blocked!r}: sys.modules[name] = None\n"
    "from p2p_worker.bench import main\n"
    "sys.exit(main({argv!r}))\n"
)


def _bench(blocked: tuple[str, ...], argv: list[str]) -> subprocess.CompletedProcess[str]:
    code = _RUN.format(blocked=blocked, argv=argv)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=100, check=False
    )


@pytest.mark.parametrize(
    ("blocked", "named"),
    [
        (("rich", "matplotlib"), "rich and matplotlib, which are"),
        (("matplotlib",), "matplotlib, which is"),
    ],
)
def test_without_the_extra_p2p_bench_names_the_install_and_does_nothing(
    blocked: tuple[str, ...], named: str, tmp_path: object
) -> None:
    out = f"{tmp_path}/out"
    proc = _bench(blocked, ["--quick", "--out", out])
    assert proc.returncode == 2, proc.stderr
    assert f"needs {named} not installed" in proc.stderr
    assert INSTALL_HINT == "pip install 'p2p-worker[bench]'"
    assert INSTALL_HINT in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not os.path.exists(out)  # stopped before creating anything


def test_help_works_without_the_extra() -> None:
    proc = _bench(("rich", "matplotlib"), ["--help"])
    assert proc.returncode == 0, proc.stderr
    assert "usage: p2p-bench" in proc.stdout


def test_with_the_extra_nothing_is_missing() -> None:
    assert missing_bench_extra() == []
