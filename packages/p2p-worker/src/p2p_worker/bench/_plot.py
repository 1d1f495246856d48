"""The PNG plot: throughput against payload size, one panel per (link, payload kind).

The plot is the first thing a reader looks at, so it is built for reading: one
colour per method, the same in every panel and in one shared legend, log-scaled axes
with the measured sizes as tick labels, the emulated link's capacity drawn as a
line, and a title saying what "higher" means.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from p2p_worker.bench._payloads import DATA_DESCRIPTION
from p2p_worker.bench._results import Summary
from p2p_worker.bench._spec import LINK_PROFILES, TENSOR_KINDS, format_size, series_name

if TYPE_CHECKING:
    from matplotlib.lines import Line2D

STYLE: dict[str, dict[str, str]] = {
    series_name("gloo", "raw"): {"color": "#222222", "linestyle": "--", "marker": "s"},
    series_name("ray", "raw"): {"color": "#8c8c8c", "linestyle": ":", "marker": "D"},
    series_name("raycoll", "raw"): {"color": "#7a3fa0", "linestyle": "-.", "marker": "P"},
    series_name("p2p", "raw"): {"color": "#1f6fb4", "linestyle": "-", "marker": "o"},
    series_name("p2p", "lz4"): {"color": "#e8761a", "linestyle": "-", "marker": "^"},
    series_name("p2p", "zstd"): {"color": "#2a9d3a", "linestyle": "-", "marker": "v"},
    series_name("p2p", "lz4_whole"): {"color": "#e8761a", "linestyle": ":", "marker": "^"},
    series_name("p2p", "zstd_whole"): {"color": "#2a9d3a", "linestyle": ":", "marker": "v"},
    series_name("p2p", "lz4_auto"): {"color": "#b5179e", "linestyle": "-.", "marker": "^"},
    series_name("p2p", "zstd_auto"): {"color": "#7209b7", "linestyle": "-.", "marker": "v"},
    series_name("p2p", "auto"): {"color": "#d62828", "linestyle": "-", "marker": "*"},
}
_SHORT_DATA = {
    "tensor": "int64 token ids",
    "tensor_list": "4 bf16 weight shards",
    "tensor_dict": "ids + mask + sparse f32",
    "dataclass": "ids + logprobs + sparse f32",
}


def _layout(links: list[str], kinds: list[str]) -> tuple[int, int, list[tuple[str, str]]]:
    if len(links) == 1:
        ncols = 2 if len(kinds) > 1 else 1
        nrows = (len(kinds) + ncols - 1) // ncols
        return nrows, ncols, [(links[0], k) for k in kinds]
    # One row per kind, one column per link: each kind's links side by side.
    return len(kinds), len(links), [(lk, k) for k in kinds for lk in links]


def plot_throughput(
    summaries: Sequence[Summary],
    path: Path,
    title_note: str = "",
    footnote: str = "",
    real_link: str = "loopback",
) -> bool:
    """Draw the plot into ``path`` (PNG).

    Args:
        summaries: per-cell aggregates of the run.
        path: output file.
        title_note: extra text for the figure title (e.g. the machine).
        footnote: text under the panels (e.g. what could not be measured).
        real_link: how to name the unemulated link (``loopback`` or ``ip -> ip``).

    Returns:
        ``True`` when a plot was written, ``False`` when there was no sized data to draw
        (only ``object`` payloads, or no samples).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import (
        FixedLocator,
        FuncFormatter,
        LogLocator,
        NullFormatter,
        NullLocator,
    )

    sized = [s for s in summaries if s.cell.kind in TENSOR_KINDS]
    if not sized:
        return False
    links = list(dict.fromkeys(s.cell.link for s in sized))
    kinds = [k for k in TENSOR_KINDS if any(s.cell.kind == k for s in sized)]
    nrows, ncols, panels = _layout(links, kinds)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(5.6 * ncols, 3.9 * nrows + 1.2),
        squeeze=False,
        sharey=True,
        layout="constrained",
    )
    handles: dict[str, Line2D] = {}
    for idx, ax in enumerate(axes.flat):
        if idx >= len(panels):
            ax.set_visible(False)
            continue
        link, kind = panels[idx]
        here = [s for s in sized if s.cell.link == link and s.cell.kind == kind]
        series = list(dict.fromkeys(series_name(s.cell.method, s.cell.codec) for s in here))
        for name in series:
            pts = sorted(
                (s.nbytes, s.throughput / 1e6)
                for s in here
                if series_name(s.cell.method, s.cell.codec) == name
            )
            style = STYLE.get(name, {"marker": "o"})
            (line,) = ax.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                label=name,
                linewidth=2,
                markersize=6,
                **style,
            )
            handles.setdefault(name, line)
        profile = LINK_PROFILES.get(link)
        if profile is not None and profile.bandwidth_bps is not None:
            cap = profile.bandwidth_bps / 8e6
            ax.axhline(cap, color="#b22222", linewidth=1, alpha=0.6)
            ax.annotate(
                f"{link} link: {cap:.0f} MB/s",
                (0.02, cap),
                xycoords=("axes fraction", "data"),
                va="bottom",
                fontsize=8,
                color="#b22222",
            )
        sizes = sorted({s.nbytes for s in here})
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([format_size(n) for n in sizes], fontsize=8)
        link_text = real_link if link == "loopback" else f"emulated {link}, p2p only"
        ax.set_title(f"{kind} ({_SHORT_DATA.get(kind, '')}) — {link_text}", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        if idx % ncols == 0:
            ax.set_ylabel("throughput, MB/s (log)")
        if idx // ncols == nrows - 1 or idx + ncols >= len(panels):
            ax.set_xlabel("payload size (logical bytes)")
    title = "p2p-bench: throughput against payload size — higher is better"
    if title_note:
        title += f"\n{title_note}"
    legend = fig.legend(
        list(handles.values()),
        list(handles),
        loc="outside upper center",
        ncol=min(5, len(handles)),
        frameon=False,
        fontsize=10,
        title=title,
        title_fontsize=12,
    )
    legend.get_title().set_multialignment("center")
    if footnote:
        fig.supxlabel(footnote, fontsize=9, color="#8a4b00")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _plain_number(value: float, _pos: object = None) -> str:
    """Tick label without scientific notation: 0.1, 1, 10, 100, 1000."""
    return f"{value:g}" if value < 1e6 else f"{value:.0e}"


def data_caption() -> str:
    """One line per kind describing the data, for captions."""
    return "; ".join(f"{k}: {v}" for k, v in DATA_DESCRIPTION.items() if k in TENSOR_KINDS)
