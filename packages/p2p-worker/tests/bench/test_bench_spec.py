from __future__ import annotations

import pytest

from p2p_worker.bench._spec import (
    KINDS,
    LINK_PROFILES,
    Cell,
    build_matrix,
    estimated_wire_seconds,
    format_size,
    job_blocks,
    parse_codecs,
    parse_kinds,
    parse_links,
    parse_size,
    parse_sizes,
    series_name,
)

LOOP = LINK_PROFILES["loopback"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("64KiB", 65536),
        ("64k", 65536),
        ("64 K", 65536),
        ("1M", 1 << 20),
        ("1mib", 1 << 20),
        ("1.5MiB", 3 << 19),
        ("2G", 2 << 30),
        ("2kB", 2000),
        ("3MB", 3_000_000),
        ("1GB", 10**9),
        ("12B", 12),
    ],
)
def test_parse_size_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1X", "-1K", "0", "5GiB", "1.2.3M", "K"])
def test_parse_size_rejects_with_the_value_named(text: str) -> None:
    with pytest.raises(ValueError, match="size") as info:
        parse_size(text)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("text", ["1M", "1MB", "64K", "64kB", "1.5MiB", "2G", "3GB", "4096"])
def test_parse_size_is_the_stack_wide_rule(text: str) -> None:
    """p2p-bench --sizes and p2p-compress advise --size read a size the same way."""
    import p2p_compress.internal

    assert parse_size(text) == p2p_compress.internal.parse_size(text)


def test_parse_sizes_sorts_dedups_and_accepts_lists() -> None:
    assert parse_sizes("1MiB,64KiB, 1M ,64k") == [65536, 1 << 20]
    assert parse_sizes(["8M", "1M,2M"]) == [1 << 20, 2 << 20, 8 << 20]
    with pytest.raises(ValueError, match="sizes"):
        parse_sizes(" , ")


def test_format_size_round_trips_the_ladder() -> None:
    for text in ("64 KiB", "1 MiB", "8 MiB", "32 MiB", "1 GiB", "300 B", "1.5 MiB"):
        assert format_size(parse_size(text.replace(" ", ""))) == text


def test_parse_choices_keep_canonical_order_and_reject_unknown() -> None:
    assert parse_kinds("object,tensor-list,tensor") == ["tensor", "tensor_list", "object"]
    assert parse_kinds("all") == list(KINDS)
    assert parse_codecs("zstd,raw,zstd") == ["raw", "zstd"]
    assert [p.name for p in parse_links("100mbit,loopback")] == ["loopback", "100mbit"]
    assert [p.name for p in parse_links("all")] == list(LINK_PROFILES)
    with pytest.raises(ValueError, match=r"kinds: got 'tensr'; allowed: tensor, "):
        parse_kinds("tensor,tensr")
    with pytest.raises(ValueError, match="codecs: got 'gzip'"):
        parse_codecs("gzip")
    with pytest.raises(ValueError, match="link: got '5gbit'"):
        parse_links("5gbit")


def test_series_names() -> None:
    assert series_name("p2p", "raw") == "p2p raw"
    assert series_name("p2p", "lz4", "1gbit") == "p2p lz4 @ 1gbit"
    assert series_name("gloo", "raw") == "torch.distributed gloo"
    assert Cell("ray", "raw", "loopback", "tensor", 1).series == "Ray object store"


def test_matrix_order_baselines_first_then_one_block_per_codec_and_link() -> None:
    cells, skipped = build_matrix(
        [1 << 20, 65536],
        ["object", "tensor"],
        ["raw", "zstd"],
        [LOOP, LINK_PROFILES["1gbit"]],
        reps=3,
        object_size=0,
    )
    # ray.util.collective moves tensors only: its object cell is skipped, with the reason
    assert [(s.what, s.reason) for s in skipped] == [
        ("ray.util.collective object", "ray.util.collective sends tensors only")
    ]
    blocks = [(m, c, lk, len(cs)) for m, c, lk, cs in job_blocks(cells)]
    assert blocks == [
        ("gloo", "raw", "loopback", 3),
        ("ray", "raw", "loopback", 3),
        ("raycoll", "raw", "loopback", 2),
        ("p2p", "raw", "loopback", 3),
        ("p2p", "zstd", "loopback", 3),
        ("p2p", "raw", "1gbit", 3),
        ("p2p", "zstd", "1gbit", 3),
    ]
    # within a block: kinds in canonical order, sizes ascending, object once at its size
    first = [(c.kind, c.size) for c in cells[:3]]
    assert first == [("tensor", 65536), ("tensor", 1 << 20), ("object", 0)]
    assert len(set(cells)) == len(cells)


def test_matrix_without_baselines_and_validation() -> None:
    cells, _ = build_matrix(
        [1], ["tensor"], ["lz4"], [LOOP], reps=1, object_size=0, baselines=False
    )
    assert [c.method for c in cells] == ["p2p"]
    with pytest.raises(ValueError, match="reps: got 0"):
        build_matrix([1], ["tensor"], ["raw"], [LOOP], reps=0, object_size=0)
    with pytest.raises(ValueError, match="kinds: got an empty list"):
        build_matrix([1], [], ["raw"], [LOOP], reps=1, object_size=0)


def test_matrix_skips_emulated_cells_over_the_budget_and_says_why() -> None:
    slow = LINK_PROFILES["100mbit"]
    # 32 MiB at 100 Mbit/s is ~2.7 s per transfer: far over a 4 s budget with 5 reps
    assert estimated_wire_seconds(32 << 20, slow, 5) > 4
    assert estimated_wire_seconds(32 << 20, LOOP, 5) == 0
    cells, skipped = build_matrix(
        [65536, 32 << 20], ["tensor"], ["raw"], [LOOP, slow], reps=5, object_size=0
    )
    assert Cell("p2p", "raw", "100mbit", "tensor", 32 << 20) not in cells
    assert Cell("p2p", "raw", "100mbit", "tensor", 65536) in cells
    assert Cell("p2p", "raw", "loopback", "tensor", 32 << 20) in cells
    assert len(skipped) == 1
    assert skipped[0].what == "p2p raw @ 100mbit tensor 32 MiB"
    assert "100mbit" in skipped[0].reason
    assert "budget" in skipped[0].reason
