"""The p2p-compress command: advise on synthetic kinds and on a torch.save file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from p2p_compress import parse_tensor_compression
from p2p_compress._advice._cli import main

FAST = ["--repeat", "1", "--lz4-accelerations", "1", "--zstd-levels", "1"]


def _scalar(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if text.startswith("["):
        return [v.strip() for v in text.strip("[]").split(",") if v.strip()]
    return int(text) if text.isdigit() else text


def recommended_block(text: str) -> dict[str, Any] | None:
    """The printed cluster.collective mapping (the block is plain YAML; check both ways)."""
    block = text.split("Recommended configuration:\n", 1)[1]
    lines = [ln for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert lines[:2] == ["cluster:", "  collective:"]
    section: dict[str, Any] = {}
    for line in lines[3:]:
        key, _, value = line.strip().partition(": ")
        section[key] = _scalar(value)
    collective = {"tensor_compression": section} if len(lines) > 2 else None
    try:
        import yaml
    except ImportError:
        return collective
    assert yaml.safe_load(block)["cluster"]["collective"] == collective
    return collective


def test_advise_synthetic_table(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "advise",
            "--synthetic",
            "bool_mask",
            "--synthetic",
            "random_float32",
            "--size",
            "64KiB",
            *FAST,
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    header = out.splitlines()[0].split()
    assert header[:5] == ["tensor", "dtype", "shape", "MiB", "codec"]
    assert "ratio" in header
    assert "comp" in header
    assert "bool_mask" in out
    assert "random_float32" in out
    assert "lz4 acceleration=1" in out
    assert "zstd level=1" in out
    collective = recommended_block(out)
    if collective is None:  # the advice depends on the measured speeds
        assert "omit the section" in out
    else:  # the block parses with the real parser
        assert parse_tensor_compression(collective["tensor_compression"]) is not None


def test_advise_json_and_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "payload.pt"
    torch.save(
        {
            "ids": torch.randint(0, 100, (20_000,), generator=torch.Generator().manual_seed(0)),
            "nested": {"mask": torch.arange(50_000) % 200 < 150, "tiny": torch.ones(3)},
            "list": [torch.zeros(10_000, dtype=torch.bfloat16)],
            "meta": "not a tensor",
        },
        path,
    )
    code = main(["advise", str(path), "--json", *FAST])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    names = {m["tensor"] for m in doc["measurements"]}
    assert names == {"ids", "nested.mask", "list[0]"}  # "tiny" is below min_bytes
    assert doc["not_measured"] == {"below_min_bytes": 1, "beyond_max_tensors": 0}
    for m in doc["measurements"]:
        assert m["ratio"] == pytest.approx(m["raw_bytes"] / m["compressed_bytes"], rel=1e-3)
        assert m["compress_mb_s"] > 0
        assert m["decompress_mb_s"] > 0
    mask = next(m for m in doc["measurements"] if m["tensor"] == "nested.mask")
    assert mask["dtype"] == "bool"
    assert mask["shape"] == [50_000]
    assert mask["ratio"] > 5
    assert set(doc["estimated_ms"]) == {"lz4 acceleration=1", "zstd level=1"}
    rec = doc["recommended"]
    if rec is not None:
        assert parse_tensor_compression(rec) is not None


def test_advise_recommends_raw_for_a_fast_link(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "advise",
            "--synthetic",
            "random_float32",
            "--size",
            "64KiB",
            "--link-gbps",
            "100000",
            *FAST,
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "omit the section" in out
    assert recommended_block(out) is None


def test_advise_recommends_compression_for_a_slow_link(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "advise",
            "--synthetic",
            "bool_mask",
            "--size",
            "256KiB",
            "--link-gbps",
            "0.01",
            "--codecs",
            "zstd",
            "--zstd-levels",
            "1,3",
            "--repeat",
            "1",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    collective = recommended_block(out)
    assert collective is not None
    section = collective["tensor_compression"]
    assert isinstance(section, dict)
    cfg = parse_tensor_compression(section)
    assert cfg is not None
    assert cfg.codec_name == "zstd"
    assert torch.bool not in cfg.excluded_dtypes


def test_advise_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(tmp_path / "missing.pt")]) == 2
    assert "cannot read" in capsys.readouterr().err
    empty = tmp_path / "empty.pt"
    torch.save({"x": 1}, empty)
    assert main(["advise", str(empty)]) == 2
    assert "no dense tensors" in capsys.readouterr().err
    assert main(["advise", "--codecs", "gzip"]) == 2
    assert "--codecs" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        main(["advise", "--zstd-levels", "0"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        main(["advise", "--synthetic", "nope"])
    with pytest.raises(SystemExit):
        main([])


def test_advise_size_uses_the_shared_rule(capsys: pytest.CaptureFixture[str]) -> None:
    """--size 64K is 65,536 bytes (binary), --size 64kB is 64,000 (decimal)."""
    for text, expected in (("64K", 65536), ("64KiB", 65536), ("64kB", 64000)):
        args = ["advise", "--synthetic", "int64_token_ids", "--size", text, "--min-bytes", "0"]
        assert main([*args, *FAST, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert {m["raw_bytes"] for m in doc["measurements"]} == {expected}


@pytest.mark.parametrize("text", ["0", "-1", "-1K", "abc", "1X", "1.5", ""])
def test_advise_refuses_bad_sizes(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["advise", "--synthetic", "repeated", f"--size={text}", *FAST])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"--size: got {text!r}" in err
    assert "allowed:" in err


def test_console_script_runs() -> None:
    exe = shutil.which("p2p-compress", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("p2p-compress console script not installed in this environment")
    result = subprocess.run(
        [exe, "advise", "--synthetic", "repeated", "--size", "32KiB", *FAST],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Recommended configuration:" in result.stdout
    help_text = subprocess.run(
        [exe, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert "advise" in help_text.stdout


def _garbage_files(tmp: Path) -> dict[str, Path]:
    """Real files a user might pass by mistake, each unreadable as tensors."""
    good = tmp / "good.pt"
    torch.save({"w": torch.arange(4096)}, good)
    data = good.read_bytes()
    files = {
        "random_bytes": (tmp / "garbage.pt", bytes(range(256)) * 64),
        "text": (tmp / "notes.txt", b"these are not tensors\nline two\n"),
        "truncated_zip": (tmp / "truncated.pt", data[: len(data) // 2]),
        "zip_not_torch": (tmp / "other.zip", b"PK\x05\x06" + b"\x00" * 18),
        "empty": (tmp / "empty.pt", b""),
        "pickle_of_code": (tmp / "evil.pt", b"cos\nsystem\n(S'true'\ntR."),
    }
    for path, content in files.values():
        path.write_bytes(content)
    out = {name: path for name, (path, _) in files.items()}
    out["missing"] = tmp / "does-not-exist.pt"
    out["directory"] = tmp
    return out


@pytest.mark.parametrize(
    "case",
    [
        "random_bytes",
        "text",
        "truncated_zip",
        "zip_not_torch",
        "empty",
        "pickle_of_code",
        "missing",
        "directory",
    ],
)
def test_advise_unreadable_input_is_one_line_and_exit_2(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _garbage_files(tmp_path)[case]
    assert main(["advise", str(path), *FAST]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"p2p-compress advise: cannot read {path}: ")
    assert "Traceback" not in captured.err


def test_console_script_unreadable_input_has_no_traceback(tmp_path: Path) -> None:
    exe = shutil.which("p2p-compress", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("p2p-compress console script not installed in this environment")
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"\x80\x02garbage" * 100)
    result = subprocess.run(
        [exe, "advise", str(garbage)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert f"cannot read {garbage}:" in result.stderr
