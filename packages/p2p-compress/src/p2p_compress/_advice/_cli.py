"""The ``p2p-compress`` command: ``p2p-compress advise`` measures codecs on your tensors."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from p2p_compress._advice._advise import (
    DEFAULT_CHUNK_BYTES,
    Measurement,
    Recommendation,
    measure,
    recommend,
    render_yaml,
    setting_label,
)
from p2p_compress._advice._sizes import SIZE_RULE, parse_size
from p2p_compress._advice._synthetic import SYNTHETIC_KINDS, make_synthetic_tensor
from p2p_compress._config import DEFAULT_MIN_BYTES, ZSTD_MAX_LEVEL, Lz4CodecConfig, ZstdCodecConfig
from p2p_compress._dtypes import dtype_name
from p2p_compress._errors import CompressionError


def _size_arg(option: str, minimum: int) -> Callable[[str], int]:
    """An argparse ``type=`` for a size option: :func:`parse_size`, message kept."""

    def parse(text: str) -> int:
        try:
            return parse_size(text, minimum=minimum, name=option)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _int_list(low: int, high: int | None) -> Callable[[str], list[int]]:
    def parse(text: str) -> list[int]:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        bad = not values or any(v < low or (high is not None and v > high) for v in values)
        if bad:
            span = f"{low} to {high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"{text!r}: want comma-separated integers {span}")
        return values

    return parse


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2p-compress", description="Tools for p2p-compress tensor codecs."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    adv = sub.add_parser(
        "advise",
        help="measure lz4 and zstd on your tensors and print a recommended config",
        description=(
            "Measure compression ratio and compress/decompress throughput of lz4 and zstd "
            "(a few accelerations and levels) per tensor of a torch.save file, or of "
            "built-in synthetic tensors, and print a recommended tensor_compression block."
        ),
    )
    adv.add_argument("path", nargs="?", help="a torch.save file of tensors (dict/list nesting)")
    adv.add_argument(
        "--synthetic",
        action="append",
        choices=[*SYNTHETIC_KINDS, "all"],
        help="built-in payload kind (repeatable; default: all kinds when no path is given)",
    )
    adv.add_argument(
        "--size",
        type=_size_arg("--size", 1),
        default=1 << 20,
        help=f"synthetic tensor size, {SIZE_RULE} [default: 1MiB]",
    )
    adv.add_argument("--codecs", default="lz4,zstd", help="codecs to try (default lz4,zstd)")
    adv.add_argument(
        "--lz4-accelerations", type=_int_list(1, None), default=[1, 4, 16], metavar="A,B"
    )
    adv.add_argument(
        "--zstd-levels", type=_int_list(1, ZSTD_MAX_LEVEL), default=[1, 3, 9], metavar="L,M"
    )
    adv.add_argument("--link-gbps", type=float, default=10.0, help="link bandwidth, Gbit/s")
    adv.add_argument(
        "--min-bytes",
        type=_size_arg("--min-bytes", 0),
        default=DEFAULT_MIN_BYTES,
        help="tensors below this stay raw and are not measured, as on the wire (the only"
        f" size rule: small frames are compressed too) [default: {DEFAULT_MIN_BYTES}]",
    )
    adv.add_argument(
        "--chunk-bytes",
        type=_size_arg("--chunk-bytes", 0),
        default=DEFAULT_CHUNK_BYTES,
        help="p2p-collective's compression_pipeline.chunk_bytes: tensors of two chunks or more"
        " overlap compressing, the wire and decoding; 0 estimates each tensor whole"
        f" [default: {DEFAULT_CHUNK_BYTES}]",
    )
    adv.add_argument("--max-tensors", type=int, default=32, help="measure the N largest")
    adv.add_argument("--repeat", type=int, default=3, help="timed runs per direction (best)")
    adv.add_argument("--json", action="store_true", help="print JSON instead of tables")
    return parser


def _collect(obj: object, prefix: str, out: list[tuple[str, torch.Tensor]]) -> None:
    if isinstance(obj, torch.Tensor):
        out.append((prefix or "tensor", obj))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            _collect(value, f"{prefix}.{key}" if prefix else str(key), out)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _collect(value, f"{prefix}[{i}]", out)


def _unreadable(path: str) -> str | None:
    """Why ``path`` cannot be a torch.save file, before torch tries it; None if it may be."""
    p = Path(path)
    if not p.exists():
        return "no such file"
    if p.is_dir():
        return "is a directory, not a torch.save file"
    if not p.is_file():
        return "not a regular file"
    if p.stat().st_size == 0:
        return "the file is empty, not a torch.save file"
    return None


def _one_line(exc: BaseException) -> str:
    """The first line of an exception's message, shortened, with its type."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if lines and lines[0].startswith("Weights only load failed"):
        # torch's weights_only refusal: its one useful line is what the unpickler met
        # (its advice to load with weights_only=False would run code from the file).
        marker = next((i for i, ln in enumerate(lines) if "WeightsUnpickler error" in ln), None)
        detail = lines[marker + 1 : marker + 2] if marker is not None else []
        lines = [f"the safe tensor loader refused it: {detail[0] if detail else 'unsupported'}"]
    first = lines[0] if lines else ""
    if len(first) > 200:
        first = first[:197] + "..."
    kind = type(exc).__name__
    hint = "not a torch.save file of tensors, or a damaged one"
    return f"{hint} ({kind}: {first})" if first else f"{hint} ({kind})"


def _load(path: str) -> list[tuple[str, torch.Tensor]]:
    obj = torch.load(path, map_location="cpu", weights_only=True)
    found: list[tuple[str, torch.Tensor]] = []
    _collect(obj, "", found)
    usable = []
    for name, t in found:
        if t.layout != torch.strided or t.is_quantized:
            continue
        usable.append((name, t.detach().resolve_conj().resolve_neg().contiguous()))
    return usable


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:,.0f}" if seconds > 0 else "inf"


def _print_report(results: list[Measurement], rec: Recommendation, skipped: str) -> None:
    rows = [["tensor", "dtype", "shape", "MiB", "codec", "ratio", "comp MB/s", "decomp MB/s"]]
    for m in results:
        rows.append(
            [
                m.tensor,
                dtype_name(m.dtype),
                "x".join(map(str, m.shape)) or "()",
                f"{m.raw_bytes / 2**20:.2f}",
                m.label,
                f"{m.ratio:.3f}",
                _rate(m.raw_bytes, m.compress_s),
                _rate(m.raw_bytes, m.decompress_s),
            ]
        )
    print(_table(rows))
    if skipped:
        print(skipped)
    totals = [["codec", "ratio (all)", "comp MB/s", "decomp MB/s", "est. ms/message"]]
    for label, est in rec.per_setting.items():
        sel = [m for m in results if setting_label(m.setting) == label]
        raw = sum(m.raw_bytes for m in sel)
        wire = sum(min(m.wire_bytes, m.raw_bytes) for m in sel)
        comp = sum(m.compress_s for m in sel)
        dec = sum(m.decompress_s for m in sel)
        totals.append(
            [
                label,
                f"{raw / wire:.3f}" if wire else "-",
                _rate(raw, comp),
                _rate(raw, dec),
                f"{est * 1e3:.3f}",
            ]
        )
    totals.append(["raw", "1.000", "-", "-", f"{rec.raw_s * 1e3:.3f}"])
    print()
    print(_table(totals))
    print()
    print("Recommended configuration:")
    print(render_yaml(rec), end="")


def _advise(args: argparse.Namespace) -> int:
    names = {c.strip() for c in args.codecs.split(",") if c.strip()}
    if not names or not names <= {"lz4", "zstd"}:
        print(
            f"p2p-compress advise: --codecs {args.codecs!r}: use lz4, zstd or both", file=sys.stderr
        )
        return 2
    if args.repeat < 1 or args.max_tensors < 1 or args.link_gbps <= 0:
        print(
            "p2p-compress advise: --repeat and --max-tensors must be >= 1, --link-gbps > 0",
            file=sys.stderr,
        )
        return 2
    tensors: list[tuple[str, torch.Tensor]] = []
    if args.path:
        problem = _unreadable(args.path)
        if problem is None:
            try:
                tensors = _load(args.path)
            except Exception as exc:  # any unreadable file is one line and exit 2, never a trace
                problem = _one_line(exc)
        if problem is not None:
            print(f"p2p-compress advise: cannot read {args.path}: {problem}", file=sys.stderr)
            return 2
        if not tensors:
            print(f"p2p-compress advise: {args.path} holds no dense tensors", file=sys.stderr)
            return 2
    kinds = args.synthetic or ([] if args.path else ["all"])
    if "all" in kinds:
        kinds = list(SYNTHETIC_KINDS)
    for kind in dict.fromkeys(kinds):
        tensors.append((kind, make_synthetic_tensor(kind, args.size)))
    small = [t for t in tensors if t[1].numel() * t[1].element_size() < args.min_bytes]
    big = sorted(
        (t for t in tensors if t not in small),
        key=lambda t: t[1].numel() * t[1].element_size(),
        reverse=True,
    )
    chosen, dropped = big[: args.max_tensors], big[args.max_tensors :]
    order = {name: i for i, (name, _) in enumerate(tensors)}
    chosen.sort(key=lambda t: order[t[0]])
    small_bytes = sum(t.numel() * t.element_size() for _, t in (*small, *dropped))
    settings: list[Lz4CodecConfig | ZstdCodecConfig] = []
    if "lz4" in names:
        settings += [Lz4CodecConfig(acceleration=a) for a in args.lz4_accelerations]
    if "zstd" in names:
        settings += [ZstdCodecConfig(level=lv) for lv in args.zstd_levels]
    try:
        results = measure(chosen, settings, repeat=args.repeat, chunk_bytes=args.chunk_bytes)
    except CompressionError as exc:
        print(f"p2p-compress advise: {exc}", file=sys.stderr)
        return 1
    rec = recommend(
        results,
        link_bytes_per_s=args.link_gbps * 1e9 / 8,
        small_bytes=small_bytes,
        min_bytes=args.min_bytes,
        chunk_bytes=args.chunk_bytes,
    )
    skipped = ""
    if small or dropped:
        skipped = (
            f"({len(small)} tensors below {args.min_bytes} bytes and {len(dropped)} beyond "
            f"--max-tensors were not measured; they count as raw)"
        )
    if args.json:
        doc = {
            "measurements": [m.as_dict() for m in results],
            "estimated_ms": {k: v * 1e3 for k, v in rec.per_setting.items()},
            "raw_ms": rec.raw_s * 1e3,
            "recommended": rec.config.to_dict() if rec.config is not None else None,
            "not_measured": {"below_min_bytes": len(small), "beyond_max_tensors": len(dropped)},
        }
        print(json.dumps(doc, indent=2))
    else:
        _print_report(results, rec, skipped)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``p2p-compress`` command line.

    Args:
        argv: arguments without the program name; default ``sys.argv[1:]``.

    Returns:
        The exit status: 0 success, 1 a codec failed, 2 bad usage or input.

    Example:
        >>> main(["advise", "--synthetic", "int64_token_ids", "--size", "64KiB",
        ...       "--repeat", "1", "--json"])  # doctest: +ELLIPSIS
        {...
        0
    """
    args = _build_parser().parse_args(argv)
    if args.command == "advise":
        return _advise(args)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
