"""``p2p-bench weights``: options, the Markdown report and the plot, from given records."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2p_worker.bench._weights import (
    METHODS,
    QUICK,
    Record,
    job_config,
    options_from,
    plot,
    render_markdown,
)


def _record(method: str, targets: int, seconds: float, exact: bool = True) -> Record:
    full = 1_000_000_000
    return Record(
        method,
        targets,
        "loopback",
        1e-6,
        seconds,
        full * targets,
        full,
        0.02,
        exact,
        3,
        [seconds] * 3,
    )


def test_quick_and_explicit_options() -> None:
    quick = options_from(["--quick"])
    assert quick.model == QUICK["model"]
    assert quick.targets == [1, 3]
    assert quick.steps > quick.warmup
    opts = options_from(
        [
            "--targets",
            "2,4",
            "--links",
            "1gbit",
            "--methods",
            "sends",
            "--steps",
            "3",
            "--warmup",
            "1",
        ]
    )
    assert (opts.targets, opts.links, opts.methods, opts.steps) == ([2, 4], ["1gbit"], ["sends"], 3)
    assert set(options_from([]).methods) == set(METHODS)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--targets", "0"], "--targets"),
        (["--links", "wifi"], "--links: got 'wifi'"),
        (["--methods", "carrier-pigeon"], "--methods"),
        (["--steps", "2", "--warmup", "2"], "must exceed --warmup"),
    ],
)
def test_bad_options_name_the_flag(argv: list[str], fragment: str) -> None:
    with pytest.raises(SystemExit, match=fragment):
        options_from(argv)


def test_the_emulated_link_shares_one_egress_per_process() -> None:
    assert "net_emulation" not in job_config("loopback")["cluster"]
    net = job_config("1gbit")["cluster"]["net_emulation"]
    assert net == {"bandwidth_mbps": 1000.0, "egress": "process"}


def test_report_compares_every_method_with_sends(tmp_path: Path) -> None:
    records = [
        _record("sends", 1, 2.0),
        _record("sends", 3, 6.0),
        _record("ray-object-store", 3, 3.0, exact=False),
    ]
    md = render_markdown(records, {"model": "small", "out": str(tmp_path)})
    assert "## loopback, lr 1e-06" in md
    sends = "| 2.000 s (0.50 GB/s, wire 1.00x model) | 6.000 s (0.50 GB/s, wire 3.00x model) |"
    assert f"| sends {sends} True |" in md
    store = "| - | 3.000 s (1.00 GB/s, wire 3.00x model, 2.00x the speed of sends) |"
    assert f"| ray-object-store {store} False |" in md
    assert records[1].gbps == pytest.approx(0.5)
    assert plot(records, tmp_path / "w.png")
    assert (tmp_path / "w.png").stat().st_size > 1000
