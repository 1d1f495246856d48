"""``p2p-bench weights``: options, the Markdown report and the plot, from given records."""

from __future__ import annotations

from pathlib import Path

import pytest

from p2p_worker import PlacementError
from p2p_worker.bench._rl_placement import layout
from p2p_worker.bench._weights import (
    METHODS,
    QUICK,
    Record,
    job_config,
    options_from,
    plot,
    render_markdown,
)
from p2p_worker.bench._weights_report import delta_bound


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
    assert set(options_from([]).methods) == set(METHODS) - {"p2p-packed"}  # only when named
    assert options_from(["--methods", "p2p-packed,p2p-full"]).methods == ["p2p-packed", "p2p-full"]


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--targets", "0"], "--targets"),
        (["--links", "wifi"], "--links: got 'wifi'"),
        (["--methods", "carrier-pigeon"], "--methods"),
        (["--steps", "2", "--warmup", "2"], "must exceed --warmup"),
        (["--placement", "spread", "--links", "1gbit"], "--links: got 1gbit with --placement"),
        (["--links", "network"], "--links: got network with --placement one-node"),
        (["--link-mbps", "0"], "--link-mbps: got 0"),
    ],
)
def test_bad_options_name_the_flag(argv: list[str], fragment: str) -> None:
    with pytest.raises(SystemExit, match=fragment):
        options_from(argv)


def test_spread_crosses_the_real_network_and_knows_its_rate() -> None:
    assert options_from([]).placement == "one-node"
    assert options_from([]).link_mbps is None
    spread = options_from(["--placement", "spread", "--link-mbps", "1000", "--quick"])
    assert (spread.placement, spread.links, spread.link_mbps) == ("spread", ["network"], 1000.0)
    assert spread.methods == QUICK["methods"]
    assert "net_emulation" not in job_config("network")["cluster"]  # the real link


def test_spread_puts_target_i_on_node_1_plus_i_and_needs_a_second_node() -> None:
    # the layout p2p-bench weights uses: the trainer on node 0, the targets round the rest
    assert layout("spread", 1, 5, 4).rollouts == (1, 2, 3, 1, 2)
    assert layout("one-node", 1, 3, 4).rollouts == (0, 0, 0)
    with pytest.raises(PlacementError, match="--placement spread: the Ray cluster has 1 node"):
        layout("spread", 1, 3, 1)


def test_with_the_link_rate_the_report_holds_p2p_to_the_network() -> None:
    records = [
        Record("p2p-delta", 3, "network", 1e-6, 0.2, 100_000_000, 400_000_000, 0.1, True, 2),
        Record("p2p-full", 3, "network", 1e-6, 4.0, 400_000_000, 400_000_000, 0.1, True, 2),
        Record(
            "gloo-broadcast", 3, "network", 1e-6, 10.0, 1_200_000_000, 400_000_000, 0.1, True, 2
        ),
        Record(
            "ray-object-store", 3, "network", 1e-6, 8.0, 1_200_000_000, 400_000_000, 0.1, True, 2
        ),
    ]
    assert delta_bound(records[0], 1000.0) == pytest.approx(1.2)
    md = render_markdown(records, {"placement": "spread", "link_mbps": 1000.0})
    assert (
        "- 3 target(s): p2p-delta 0.200 s against 1.5 x 100.0 MB / 1000 Mbit/s = 1.200 s (within)"
        in md
    )
    assert (
        "- 3 target(s): p2p-full 4.000 s, 2.00x the speed of the fastest Ray method"
        " (ray-object-store, 8.000 s)" in md
    )
    assert "the fastest Ray method" not in render_markdown(records, {"placement": "spread"})


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


def test_the_report_module_s_docstring_example_runs() -> None:
    import doctest

    from p2p_worker.bench import _weights_report

    result = doctest.testmod(_weights_report)
    assert result.attempted > 0
    assert result.failed == 0
