from __future__ import annotations

import math

import pytest

from p2p_worker.bench._results import (
    Sample,
    geomean,
    ratios,
    samples_from_timings,
    summarize,
    summarize_ratios,
)
from p2p_worker.bench._spec import Cell


def cell(
    method: str, codec: str = "raw", link: str = "loopback", kind: str = "tensor", size: int = 1000
) -> Cell:
    return Cell(method, codec, link, kind, size)


def one(c: Cell, seconds: float, nbytes: int = 1000, wire: int | None = None) -> list[Sample]:
    return samples_from_timings(c, nbytes, [seconds], wire_bytes=wire)


def test_samples_and_throughput() -> None:
    s = samples_from_timings(cell("p2p"), 2_000_000, [0.5, 0.25])
    assert [x.rep for x in s] == [0, 1]
    assert [x.throughput for x in s] == [4e6, 8e6]
    d = s[0].to_dict()
    assert d["throughput_Bps"] == 4e6
    assert d["method"] == "p2p"
    assert d["wire_bytes"] is None
    assert Sample.from_dict(d) == s[0]


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_samples_reject_non_positive_times(bad: float) -> None:
    with pytest.raises(ValueError, match=r"seconds\[1\]"):
        samples_from_timings(cell("p2p"), 10, [1.0, bad])


def test_summarize_median_min_max_per_cell_in_first_seen_order() -> None:
    a, b = cell("gloo"), cell("p2p")
    samples = samples_from_timings(b, 100, [4.0, 1.0, 2.0], wire_bytes=40) + samples_from_timings(
        a, 100, [1.0, 3.0]
    )
    sb, sa = summarize(samples)
    assert sb.cell == b
    assert (sb.n, sb.median_s, sb.min_s, sb.max_s) == (3, 2.0, 1.0, 4.0)
    assert sb.throughput == 50.0
    assert sb.wire_ratio == 2.5
    assert sa.cell == a
    assert sa.median_s == 2.0
    assert sa.wire_ratio is None


def test_ratios_against_baselines_and_raw() -> None:
    sums = summarize(
        one(cell("gloo"), 1.0)
        + one(cell("ray"), 4.0)
        + one(cell("p2p"), 2.0)
        + one(cell("p2p", "lz4"), 1.0)
        + one(cell("p2p", "raw", "1gbit"), 8.0)
        + one(cell("p2p", "zstd", "1gbit"), 2.0)
    )
    got = {(r.series, r.against, r.link): r.value for r in ratios(sums)}
    assert got == {
        ("p2p raw", "torch.distributed gloo", "loopback"): 0.5,
        ("p2p raw", "Ray object store", "loopback"): 2.0,
        ("p2p lz4", "torch.distributed gloo", "loopback"): 1.0,
        ("p2p lz4", "Ray object store", "loopback"): 4.0,
        ("p2p lz4", "p2p raw", "loopback"): 2.0,
        ("p2p zstd @ 1gbit", "p2p raw @ 1gbit", "1gbit"): 4.0,
    }


def test_ratios_need_the_same_kind_and_size() -> None:
    sums = summarize(one(cell("gloo", size=1), 1.0) + one(cell("p2p", size=2), 1.0))
    assert ratios(sums) == []


def test_geomean() -> None:
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([3.0]) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="values"):
        geomean([])
    with pytest.raises(ValueError, match="positive"):
        geomean([1.0, 0.0])


def test_summarize_ratios_geomean_range_and_largest_size() -> None:
    samples = []
    for size, p2p_s in ((10, 1.0), (100, 0.5)):
        samples += one(cell("gloo", size=size), 1.0, nbytes=size)
        samples += one(cell("p2p", size=size), p2p_s, nbytes=size)
        samples += one(cell("gloo", kind="tensor_list", size=size), 1.0, nbytes=size)
        samples += one(cell("p2p", kind="tensor_list", size=size), 2.0, nbytes=size)
    (rs,) = summarize_ratios(ratios(summarize(samples)))
    assert (rs.series, rs.against, rs.n) == ("p2p raw", "torch.distributed gloo", 4)
    # values: tensor 1.0 and 2.0, tensor_list 0.5 and 0.5
    assert rs.geomean == pytest.approx((1.0 * 2.0 * 0.5 * 0.5) ** 0.25)
    assert (rs.low, rs.high) == (0.5, 2.0)
    assert rs.largest_size == 100
    assert rs.at_largest == pytest.approx(1.0)
