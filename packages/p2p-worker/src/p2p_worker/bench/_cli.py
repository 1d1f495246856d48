"""``p2p-bench``: the transfer benchmark and demo of the p2p stack.

With no arguments it starts an embedded local Ray cluster, measures every payload kind
over a ladder of sizes with every codec, over loopback and an emulated 1 Gbit/s link,
measures raw torch.distributed (gloo), Ray's object store and ray.util.collective
send/recv between two actors in the same run, and writes ``p2p-bench.json``,
``p2p-bench.md`` and ``p2p-bench.png`` into ``./p2p-bench-out``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from p2p_worker.bench._plot import plot_throughput
from p2p_worker.bench._report import (
    JSON_NAME,
    MARKDOWN_NAME,
    PLOT_NAME,
    RunResult,
    ratio_line,
    render_markdown,
    render_rich_tables,
    write_json,
)
from p2p_worker.bench._results import Sample, summarize_ratios
from p2p_worker.bench._rl import main as rl_main
from p2p_worker.bench._runner import Options, run_matrix
from p2p_worker.bench._spec import (
    CODECS,
    DEFAULT_CODECS,
    DEFAULT_LINKS,
    DEFAULT_REPS,
    DEFAULT_SIZES,
    KINDS,
    LINK_PROFILES,
    QUICK_LINKS,
    QUICK_REPS,
    QUICK_SIZES,
    Cell,
    format_size,
    parse_codecs,
    parse_kinds,
    parse_links,
    parse_sizes,
)
from p2p_worker.bench._weights import main as weights_main

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import TaskID

DEFAULT_OUT = "p2p-bench-out"
BENCH_EXTRA = ("rich", "matplotlib")
"""What ``p2p-worker[bench]`` adds: the live progress and tables, and the plot."""
INSTALL_HINT = "pip install 'p2p-worker[bench]'"


def missing_bench_extra() -> list[str]:
    """The libraries of the ``bench`` extra that cannot be imported here (empty: all there).

    Example:
        >>> missing_bench_extra()  # with p2p-worker[bench] installed
        []
    """
    missing = []
    for name in BENCH_EXTRA:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``p2p-bench``."""
    parser = argparse.ArgumentParser(
        prog="p2p-bench",
        description=(
            "Measure p2p Worker.send/recv transfers (raw, lz4, zstd; loopback and emulated"
            " links) against raw torch.distributed gloo, Ray's object store and"
            " ray.util.collective send/recv, on an"
            " embedded local Ray cluster or an existing one. Writes a JSON of every sample,"
            " a Markdown report and a PNG plot."
        ),
    )
    parser.add_argument(
        "--sizes",
        default=None,
        help=(
            "comma-separated payload sizes (K/KiB, M/MiB, G/GiB are 1024-based; kB/MB/GB"
            f" 1000-based) [default: {','.join(DEFAULT_SIZES)}; --quick: {','.join(QUICK_SIZES)}]"
        ),
    )
    parser.add_argument(
        "--kinds",
        default="all",
        help=f"payload kinds, comma-separated: {', '.join(KINDS)} [default: all]",
    )
    parser.add_argument(
        "--codecs",
        default=",".join(DEFAULT_CODECS),
        help=f"codec modes of the p2p method: {', '.join(CODECS)} (lz4/zstd send large"
        " frames in pipelined compressed chunks; *_whole compress each tensor whole; auto"
        " picks raw, lz4, zstd or sparse per link; *_auto pick raw or that codec), or all"
        f" [default: {','.join(DEFAULT_CODECS)}]",
    )
    parser.add_argument(
        "--link",
        default=None,
        help=(
            f"link profiles: {', '.join(LINK_PROFILES)}, or all"
            f" [default: {','.join(DEFAULT_LINKS)}; --quick: {','.join(QUICK_LINKS)}]"
        ),
    )
    parser.add_argument(
        "--reps",
        type=int,
        default=None,
        help=f"timed repetitions per cell [default: {DEFAULT_REPS}; --quick: {QUICK_REPS}]",
    )
    parser.add_argument(
        "--out", default=DEFAULT_OUT, help=f"output folder [default: ./{DEFAULT_OUT}]"
    )
    parser.add_argument(
        "--address",
        default=None,
        help="run on this existing Ray cluster (e.g. 10.0.0.1:6379, or auto) instead of an"
        " embedded local one [default: embedded, bound to 127.0.0.1]",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run (under a minute; the CI smoke test runs it)",
    )
    parser.add_argument(
        "--no-baselines", action="store_true", help="skip the gloo and Ray baselines"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds one step (a launch, a cell) may take before it fails [default: 180]",
    )
    return parser


def resolve_options(argv: Sequence[str]) -> Options:
    """Parse the command line into :class:`Options`.

    Raises:
        SystemExit: bad arguments (argparse prints the message, exit status 2).
    """
    parser = build_parser()
    ns = parser.parse_args(list(argv))
    try:
        sizes = parse_sizes(ns.sizes or (QUICK_SIZES if ns.quick else DEFAULT_SIZES))
        kinds = parse_kinds(ns.kinds)
        codecs = parse_codecs(ns.codecs)
        links = parse_links(ns.link or (QUICK_LINKS if ns.quick else DEFAULT_LINKS))
        reps = ns.reps if ns.reps is not None else (QUICK_REPS if ns.quick else DEFAULT_REPS)
        if reps < 1:
            raise ValueError(f"--reps: got {reps}; allowed: an integer >= 1")
        if not ns.timeout > 0:
            raise ValueError(f"--timeout: got {ns.timeout}; allowed: a number of seconds > 0")
    except ValueError as exc:
        parser.error(str(exc))
    return Options(
        sizes=sizes,
        kinds=kinds,
        codecs=codecs,
        links=links,
        reps=reps,
        out=Path(ns.out),
        address=ns.address,
        timeout=ns.timeout,
        baselines=not ns.no_baselines,
        argv=list(argv),
    )


def check_out_dir(out: Path) -> str | None:
    """Make sure the results can be written to ``out`` before any work starts.

    Creates the folder (and its parents) when missing and writes, then removes, a probe
    file in it, so a run never measures for minutes and then fails on its output.

    Returns:
        None when ``out`` is a writable folder now; otherwise the ``--out`` error message.
    """
    allowed = "a folder p2p-bench can create or write into"
    lead = f"--out: got {str(out)!r}; allowed: {allowed}"
    if out.exists() and not out.is_dir():
        return f"{lead} (it is an existing file, not a folder)"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        return f"{lead} (a parent of it is a file, not a folder)"
    except OSError as exc:
        return f"{lead} (cannot create it: {exc.strerror or exc})"
    try:
        fd, probe = tempfile.mkstemp(prefix=".p2p-bench-probe-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{lead} (cannot write into it: {exc.strerror or exc})"
    return None


class RichProgress:
    """Live progress bar over the matrix, with a line per block and per gap."""

    def __init__(self, console: Console) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = console
        self.t0 = time.monotonic()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"),
            console=console,
        )
        self.task: TaskID | None = None

    def __enter__(self) -> RichProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def start(self, total: int) -> None:
        """Create the bar."""
        self.task = self.progress.add_task("cells", total=total, last="")

    def block(self, text: str) -> None:
        """Print the block being started above the bar."""
        self.progress.console.print(f"[cyan]{time.monotonic() - self.t0:5.1f} s ▶ {text}")

    def cell_done(self, cell: Cell, samples: Sequence[Sample]) -> None:
        """Advance the bar and show the last cell's throughput."""
        last = f"{cell.series} {cell.kind} {format_size(cell.size) if cell.size else ''}"
        if samples:
            secs = sorted(s.seconds for s in samples)[len(samples) // 2]
            last += f": {samples[0].nbytes / secs / 1e6:.1f} MB/s"
        else:
            last += ": not run"
        if self.task is None:
            raise RuntimeError("RichProgress.cell_done: call start() first")
        self.progress.update(self.task, advance=1, last=last)

    def note(self, text: str) -> None:
        """Print a note above the bar."""
        self.progress.console.print(f"[yellow]! {text}")


def write_outputs(result: RunResult, out: Path) -> dict[str, Path]:
    """Write the JSON, the plot and the Markdown report into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / JSON_NAME, "markdown": out / MARKDOWN_NAME, "plot": out / PLOT_NAME}
    write_json(result, paths["json"])
    note = f"{result.meta.get('cluster', 'Ray')} · median of {result.meta.get('reps', '?')} reps"
    gaps = [u.what for u in result.unavailable] + [f.what for f in result.failures]
    footnote = f"not measured in this run: {', '.join(gaps)} (see the report)" if gaps else ""
    drew = plot_throughput(
        result.summaries(),
        paths["plot"],
        title_note=note,
        footnote=footnote,
        real_link=str(result.meta.get("real_link", "loopback")),
    )
    if not drew:
        del paths["plot"]
    paths["markdown"].write_text(
        render_markdown(result, PLOT_NAME if drew else None) + "\n", encoding="utf-8"
    )
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``p2p-bench`` console script.

    Args:
        argv: command-line arguments without the program name (default ``sys.argv[1:]``).

    Returns:
        The exit status: 0 when every requested part ran or is reported unavailable; 1
        when a part failed (the report is still written when the run got that far);
        2 for bad arguments, an ``--out`` that cannot be written among them, or a
        missing ``bench`` extra (checked before any work starts).

    Example:
        >>> main(["--quick", "--out", "/tmp/p2p-bench-out"])  # doctest: +SKIP
        0
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["weights"]:  # p2p-bench weights: the RL weight sync (its own options)
        return weights_main(args[1:])
    if args[:1] == ["rl"]:  # p2p-bench rl: the RL loop on p2p and on Ray (its own options)
        return rl_main(args[1:])
    options = resolve_options(args)
    missing = missing_bench_extra()
    if missing:
        print(
            f"p2p-bench: error: the benchmark needs {' and '.join(missing)}, which "
            f"{'is' if len(missing) == 1 else 'are'} not installed; they come with the "
            f"bench extra of p2p-worker: {INSTALL_HINT} (from a clone: "
            f"pip install './packages/p2p-worker[bench]' with its siblings)",
            file=sys.stderr,
        )
        return 2
    from rich.console import Console

    problem = check_out_dir(options.out)
    if problem is not None:
        print(f"p2p-bench: error: {problem}", file=sys.stderr)
        return 2
    console = Console()
    console.print(
        f"[bold]p2p-bench[/]: {len(options.kinds)} kinds x "
        f"{', '.join(format_size(s) for s in options.sizes)} x codecs "
        f"{', '.join(options.codecs)} x links {', '.join(lk.name for lk in options.links)}, "
        f"{options.reps} reps"
    )
    try:
        with RichProgress(console) as progress:
            result = run_matrix(options, progress)
    except KeyboardInterrupt:
        console.print("[red]interrupted")
        return 130
    except Exception as exc:
        console.print(f"[red]p2p-bench failed: {type(exc).__name__}: {exc}")
        console.print_exception(show_locals=False)
        return 1
    for table in render_rich_tables(result):
        console.print(table)
    for line in summarize_ratios(result.ratios()):
        console.print("• " + ratio_line(line).replace("**", ""))
    for gap in result.unavailable:
        console.print(f"[yellow]• {gap.what}: unavailable — {gap.reason}")
    for failure in result.failures:
        console.print(f"[red]• {failure.what}: FAILED — {failure.reason}")
    paths = write_outputs(result, options.out)
    console.print(f"wall time {result.meta.get('wall_s')} s; wrote:")
    for path in paths.values():
        console.print(f"  {path}")
    return 1 if result.failures else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
