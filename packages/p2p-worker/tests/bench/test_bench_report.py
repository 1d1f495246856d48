from __future__ import annotations

import json
from pathlib import Path

import pytest

from p2p_worker.bench._cli import resolve_options, write_outputs
from p2p_worker.bench._report import (
    RunResult,
    mbps,
    render_markdown,
    render_rich_tables,
    table_rows,
)
from p2p_worker.bench._results import samples_from_timings
from p2p_worker.bench._spec import (
    DEFAULT_REPS,
    QUICK_REPS,
    Cell,
    Skipped,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_result() -> RunResult:
    """Timings chosen so every ratio is a round number."""
    r = RunResult(meta={"command": "p2p-bench --quick", "cpus": 2, "wall_s": 12.0})
    for size in (65536, 1 << 20):
        for kind in ("tensor", "dataclass"):
            base = size / 1e8  # 100 MB/s for gloo
            for method, codec, link, factor, wire in (
                ("gloo", "raw", "loopback", 1.0, None),
                ("ray", "raw", "loopback", 4.0, None),
                ("p2p", "raw", "loopback", 2.0, size + 64),
                ("p2p", "lz4", "loopback", 2.0, size // 2),
                ("p2p", "raw", "1gbit", 8.0, size + 64),
                ("p2p", "lz4", "1gbit", 4.0, size // 2),
            ):
                cell = Cell(method, codec, link, kind, size)
                secs = [base * factor * m for m in (1.0, 1.1, 0.9)]
                r.samples += samples_from_timings(cell, size, secs, wire_bytes=wire)
    obj = Cell("p2p", "raw", "loopback", "object", 0)
    r.samples += samples_from_timings(obj, 641, [0.001, 0.002])
    r.samples += samples_from_timings(Cell("gloo", "raw", "loopback", "object", 0), 641, [0.002])
    r.unavailable.append(Skipped("link 100mbit", "no pacing in this p2p_collective"))
    r.skipped.append(Skipped("p2p raw @ 1gbit tensor 1 GiB", "over budget"))
    r.compression = {"lz4": {"codec": "lz4", "excluded_dtypes": []}}
    return r


def test_mbps_formatting() -> None:
    assert mbps(100e6) == "100"
    assert mbps(12.345e6) == "12.3"


def test_table_rows_one_column_per_series_per_link() -> None:
    result = fake_result()
    header, rows = table_rows(result.summaries(), "loopback")
    assert header == [
        "kind",
        "size",
        "torch.distributed gloo",
        "Ray object store",
        "p2p raw",
        "p2p lz4",
    ]
    assert rows[0][:2] == ["tensor", "64 KiB"]
    assert rows[0][2].startswith("100 (")
    assert rows[0][3].startswith("25.0 (2.62 ms)")
    assert "wire:2.00x" in rows[0][5]
    assert "wire" not in rows[0][4]
    assert rows[-1][:2] == ["object", "641 B"]
    assert rows[-1][3] == "-"
    header, rows = table_rows(result.summaries(), "1gbit")
    assert header == ["kind", "size", "p2p raw @ 1gbit", "p2p lz4 @ 1gbit"]
    assert len(rows) == 4


def test_markdown_has_plot_headlines_gaps_data_tables_and_ratio_lines() -> None:
    md = render_markdown(fake_result())
    assert md.startswith("# p2p-bench report")
    assert "![throughput against payload size](p2p-bench.png)" in md
    # 4 sized points at 0.5x and the small object at 1.33x (median 1.5 ms against 2 ms)
    g = (0.5**4 * (0.002 / 0.0015)) ** 0.2
    assert f"**p2p raw** vs **torch.distributed gloo**: {g:.2f}x (geometric mean of 5" in md
    assert "range 0.50x to 1.33x; 0.50x at 1 MiB)" in md
    assert "**p2p raw** vs **Ray object store**: 2.00x (geometric mean of 4 points" in md
    assert "**p2p lz4 @ 1gbit** vs **p2p raw @ 1gbit**: 2.00x" in md
    assert "- **link 100mbit**: unavailable — no pacing in this p2p_collective" in md
    assert "- p2p raw @ 1gbit tensor 1 GiB: skipped — over budget" in md
    assert "| tensor_list | list of 4 bfloat16 weight shards" in md
    assert '- lz4: `{"codec": "lz4", "excluded_dtypes": []}`' in md
    assert "## Results: loopback (real link, no emulation)" in md
    assert "## Results: emulated 1gbit (125 MB/s, 0.1 ms delay per message)" in md
    assert "| kind | size | torch.distributed gloo | Ray object store | p2p raw | p2p lz4 |" in md
    assert "- tensor 64 KiB (loopback): p2p raw = 0.50x torch.distributed gloo" in md
    assert "- dataclass 1 MiB (1gbit): p2p lz4 @ 1gbit = 2.00x p2p raw @ 1gbit" in md
    assert "- object 641 B (loopback): p2p raw = 1.33x torch.distributed gloo" in md


def test_markdown_without_p2p_says_there_is_no_ratio() -> None:
    r = RunResult()
    r.samples = samples_from_timings(Cell("gloo", "raw", "loopback", "tensor", 8), 8, [1.0])
    md = render_markdown(r, plot_name=None)
    assert "no ratio" in md
    assert "![" not in md
    assert "| tensor | 8 B | 8e-06 (1.00 s) |" in md


def test_rich_tables_render_compact() -> None:
    from rich.console import Console

    result = fake_result()
    result.meta["reps"] = 3
    console = Console(record=True, width=100)
    for table in render_rich_tables(result):
        console.print(table)
    text = console.export_text()
    assert "MB/s (median of 3) — loopback" in text
    assert "MB/s (median of 3) — emulated 1gbit" in text
    assert "Ray store" in text
    assert "p2p lz4" in text
    assert "@" not in text  # the link is in the title, not in every column
    assert "wire:" not in text


def test_write_outputs_json_markdown_and_a_real_png(tmp_path: Path) -> None:
    paths = write_outputs(fake_result(), tmp_path / "out")
    assert set(paths) == {"json", "markdown", "plot"}
    assert paths["plot"].read_bytes()[:8] == PNG_MAGIC
    assert paths["plot"].stat().st_size > 20_000
    doc = json.loads(paths["json"].read_text())
    assert doc["schema"] == "p2p-bench/1"
    assert len(doc["samples"]) == 2 * 2 * 6 * 3 + 3
    assert {s["method"] for s in doc["samples"]} == {"p2p", "gloo", "ray"}
    assert all(s["throughput_Bps"] > 0 for s in doc["samples"])
    assert doc["unavailable"] == [
        {"what": "link 100mbit", "reason": "no pacing in this p2p_collective"}
    ]
    assert doc["data"]["tensor"].startswith("one int64 tensor of token ids")
    assert any(r["against"] == "Ray object store" for r in doc["ratios"])
    assert "p2p-bench.png" in paths["markdown"].read_text()


def test_write_outputs_without_sized_data_skips_the_plot(tmp_path: Path) -> None:
    r = RunResult()
    r.samples = samples_from_timings(Cell("p2p", "raw", "loopback", "object", 0), 600, [0.01])
    paths = write_outputs(r, tmp_path)
    assert "plot" not in paths
    assert not (tmp_path / "p2p-bench.png").exists()
    assert "![" not in paths["markdown"].read_text()


def test_options_defaults_quick_and_overrides() -> None:
    o = resolve_options([])
    assert o.sizes == [65536, 1 << 20, 8 << 20, 32 << 20]
    assert [lk.name for lk in o.links] == ["loopback", "1gbit"]
    assert o.reps == DEFAULT_REPS
    assert o.codecs == ["raw", "lz4", "zstd"]
    assert str(o.out) == "p2p-bench-out"
    assert o.address is None
    assert o.baselines
    q = resolve_options(["--quick", "--out", "/tmp/x"])
    assert q.sizes == [65536, 1 << 20]
    assert q.reps == QUICK_REPS
    assert [lk.name for lk in q.links] == ["loopback"]
    assert q.argv == ["--quick", "--out", "/tmp/x"]
    c = resolve_options(
        [
            "--quick",
            "--sizes",
            "4k",
            "--reps",
            "7",
            "--link",
            "all",
            "--kinds",
            "object",
            "--codecs",
            "zstd",
            "--address",
            "10.0.0.1:6379",
            "--no-baselines",
        ]
    )
    assert c.sizes == [4096]
    assert c.reps == 7
    assert len(c.links) == 4
    assert c.kinds == ["object"]
    assert c.codecs == ["zstd"]
    assert c.address == "10.0.0.1:6379"
    assert not c.baselines


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "12Q"], "--sizes: got '12Q'"),
        (["--reps", "0"], "--reps: got 0"),
        (["--kinds", "tensors"], "kinds: got 'tensors'"),
        (["--link", "wifi"], "link: got 'wifi'"),
        (["--timeout", "0"], "--timeout: got 0.0"),
    ],
)
def test_bad_options_exit_2_naming_the_value(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        resolve_options(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err
