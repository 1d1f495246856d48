"""What a benchmark run measures: sizes, payload kinds, codecs, link profiles, the matrix.

Everything here is pure (no Ray): parsing the command-line values and expanding them
into the list of :class:`Cell` s the runner executes, in the order it executes them.
Sizes follow the stack's one size rule, :func:`p2p_compress.internal.parse_size`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from p2p_compress.internal import parse_size as _parse_size

KINDS: Final = ("tensor", "tensor_list", "tensor_dict", "dataclass", "object")
"""Payload kinds of seed 004 / 000, in report order."""

TENSOR_KINDS: Final = ("tensor", "tensor_list", "tensor_dict", "dataclass")
"""Kinds whose size follows the ladder; ``object`` is a small control message of fixed size."""

CODECS: Final = (
    "raw",
    "lz4",
    "zstd",
    "lz4_whole",
    "zstd_whole",
    "lz4_auto",
    "zstd_auto",
    "auto",
)
"""Modes of the p2p method. ``lz4`` / ``zstd`` are the job defaults (large frames go in
compressed chunks, pipelined with the wire); ``*_whole`` turn chunking off
(``compression_pipeline.chunk_bytes: 0``: each tensor compressed whole before it is sent);
``auto`` is adaptive (``compression_pipeline.adaptive: true``: per link raw, lz4, zstd
or sparse, whichever is predicted fastest from the link's own traffic); ``*_auto`` are
adaptive with that one codec only (``adaptive: {codecs: [...]}``: raw or that codec)."""

DEFAULT_CODECS: Final = ("raw", "lz4", "zstd")
"""What ``--codecs`` runs when not given."""

METHODS: Final = ("p2p", "gloo", "ray", "raycoll")
"""``p2p``: Worker.send/recv; ``gloo``: plain torch.distributed; ``ray``: Ray object store;
``raycoll``: ``ray.util.collective`` send/recv (gloo backend)."""

BASELINES: Final = ("gloo", "ray", "raycoll")

METHOD_LABELS: Final = {
    "p2p": "p2p Worker.send",
    "gloo": "torch.distributed gloo",
    "ray": "Ray object store",
    "raycoll": "ray.util.collective",
}

TENSORS_ONLY: Final = ("raycoll",)
"""Baselines that move tensors only: the ``object`` kind is skipped for them."""


@dataclass(frozen=True)
class LinkProfile:
    """A link the transfers run over.

    Attributes:
        name: profile name used on the command line and in the report.
        bandwidth_bps: emulated bandwidth in bits per second, ``None`` for the real
            loopback link (no emulation).
        latency_s: emulated one-way latency in seconds added per message.
    """

    name: str
    bandwidth_bps: float | None
    latency_s: float = 0.0

    @property
    def emulated(self) -> bool:
        """Whether the profile needs ``cluster.net_emulation``."""
        return self.bandwidth_bps is not None


LINK_PROFILES: Final = {
    "loopback": LinkProfile("loopback", None),
    "10gbit": LinkProfile("10gbit", 10e9, 50e-6),
    "1gbit": LinkProfile("1gbit", 1e9, 100e-6),
    "100mbit": LinkProfile("100mbit", 100e6, 1e-3),
}

DEFAULT_SIZES: Final = ("64KiB", "1MiB", "8MiB", "32MiB")
QUICK_SIZES: Final = ("64KiB", "1MiB")
DEFAULT_LINKS: Final = ("loopback", "1gbit")
QUICK_LINKS: Final = ("loopback",)
DEFAULT_REPS: Final = 5
QUICK_REPS: Final = 3
EMULATED_CELL_BUDGET_S: Final = 4.0
"""Largest estimated wire time of one emulated-link cell (all repetitions) that still runs."""

MAX_SIZE: Final = 4 * 1024**3


def parse_size(text: str) -> int:
    """Parse one payload size such as ``64KiB``, ``1M``, ``8MiB``, ``2GB`` or ``4096``.

    The one size rule of the stack, :func:`p2p_compress.internal.parse_size`: ``K``/``KiB``,
    ``M``/``MiB``, ``G``/``GiB`` are powers of 1024; ``kB``/``MB``/``GB`` are powers of
    1000; a bare number is bytes. Case is ignored. A payload is 1 byte to 4 GiB.

    Args:
        text: the size as written on the command line.

    Returns:
        The size in bytes.

    Raises:
        ValueError: the text is not a size, or it is below 1 byte or above 4 GiB.

    Example:
        >>> parse_size("64KiB"), parse_size("1M"), parse_size("2kB")
        (65536, 1048576, 2000)
    """
    return _parse_size(text, minimum=1, maximum=MAX_SIZE, name="--sizes")


def parse_sizes(text: str | Sequence[str]) -> list[int]:
    """Parse a comma-separated list of sizes into a sorted list without duplicates.

    Args:
        text: ``"64KiB,1MiB"`` or a sequence of such items.

    Returns:
        Sizes in bytes, ascending.

    Raises:
        ValueError: an item is not a size, or the list is empty.

    Example:
        >>> parse_sizes("1MiB,64KiB,1M")
        [65536, 1048576]
    """
    items = _split(text)
    if not items:
        raise ValueError(f"sizes: got {text!r}; allowed: one or more sizes, e.g. 64KiB,1MiB")
    return sorted({parse_size(item) for item in items})


def format_size(nbytes: int) -> str:
    """Format a byte count the way the report prints it (``64 KiB``, ``8 MiB``, ``300 B``).

    Example:
        >>> format_size(65536), format_size(3 * 1024**2 // 2), format_size(300)
        ('64 KiB', '1.5 MiB', '300 B')
    """
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            value = nbytes / scale
            text = f"{value:.0f}" if value == int(value) else f"{value:.3g}"
            return f"{text} {unit}"
    return f"{nbytes} B"


def _split(text: str | Sequence[str]) -> list[str]:
    parts = [text] if isinstance(text, str) else list(text)
    return [item.strip() for part in parts for item in part.split(",") if item.strip()]


def _parse_choices(text: str | Sequence[str], allowed: Iterable[str], name: str) -> list[str]:
    allowed = list(allowed)
    items = _split(text)
    if not items:
        raise ValueError(f"{name}: got {text!r}; allowed: one or more of {', '.join(allowed)}")
    out: list[str] = []
    for item in items:
        key = item.lower().replace("-", "_")
        if key not in allowed:
            raise ValueError(f"{name}: got {item!r}; allowed: {', '.join(allowed)}")
        if key not in out:
            out.append(key)
    return sorted(out, key=allowed.index)


def parse_kinds(text: str | Sequence[str]) -> list[str]:
    """Parse ``--kinds`` (comma-separated payload kinds; ``all`` for every kind).

    Raises:
        ValueError: an unknown kind.

    Example:
        >>> parse_kinds("object,tensor")
        ['tensor', 'object']
    """
    if _split(text) == ["all"]:
        return list(KINDS)
    return _parse_choices(text, KINDS, "kinds")


def parse_codecs(text: str | Sequence[str]) -> list[str]:
    """Parse ``--codecs`` (names from :data:`CODECS`; ``all`` for every one).

    Raises:
        ValueError: an unknown codec.

    Example:
        >>> parse_codecs("zstd,raw")
        ['raw', 'zstd']
    """
    if _split(text) == ["all"]:
        return list(CODECS)
    return _parse_choices(text, CODECS, "codecs")


def parse_links(text: str | Sequence[str]) -> list[LinkProfile]:
    """Parse ``--link`` (profile names from :data:`LINK_PROFILES`; ``all`` for every one).

    Raises:
        ValueError: an unknown profile.

    Example:
        >>> [p.name for p in parse_links("1gbit,loopback")]
        ['loopback', '1gbit']
    """
    if _split(text) == ["all"]:
        return list(LINK_PROFILES.values())
    names = _parse_choices(text, LINK_PROFILES, "link")
    return [LINK_PROFILES[name] for name in names]


@dataclass(frozen=True)
class Cell:
    """One point of the matrix: a method moving one payload kind of one size over a link.

    Attributes:
        method: ``p2p``, ``gloo`` or ``ray`` (see :data:`METHODS`).
        codec: ``raw``, ``lz4`` or ``zstd``; always ``raw`` for the baselines.
        link: link profile name.
        kind: payload kind (see :data:`KINDS`).
        size: nominal payload size in bytes (the ladder value; ``object`` uses its own).
    """

    method: str
    codec: str
    link: str
    kind: str
    size: int

    @property
    def series(self) -> str:
        """The plot/table series this cell belongs to, e.g. ``p2p lz4`` or ``Ray object store``."""
        return series_name(self.method, self.codec, self.link)

    def key(self) -> tuple[str, str, str, str, int]:
        """A hashable, JSON-friendly identity."""
        return (self.method, self.codec, self.link, self.kind, self.size)


def series_name(method: str, codec: str, link: str = "loopback") -> str:
    """Name of a series: ``p2p <codec>`` (plus ``@ <link>`` off loopback) or the baseline label.

    Example:
        >>> series_name("p2p", "zstd", "1gbit"), series_name("gloo", "raw")
        ('p2p zstd @ 1gbit', 'torch.distributed gloo')
    """
    base = f"p2p {codec}" if method == "p2p" else METHOD_LABELS[method]
    return base if link == "loopback" else f"{base} @ {link}"


@dataclass(frozen=True)
class Skipped:
    """A part of the requested matrix that did not run, and why (goes into the report)."""

    what: str
    reason: str


def estimated_wire_seconds(size: int, link: LinkProfile, reps: int) -> float:
    """Time one cell's uncompressed bytes need on ``link`` (0 for loopback)."""
    if link.bandwidth_bps is None:
        return 0.0
    return (reps + 1) * (size * 8 / link.bandwidth_bps + 2 * link.latency_s)


def build_matrix(
    sizes: Sequence[int],
    kinds: Sequence[str],
    codecs: Sequence[str],
    links: Sequence[LinkProfile],
    *,
    reps: int,
    object_size: int,
    baselines: bool = True,
    cell_budget_s: float = EMULATED_CELL_BUDGET_S,
) -> tuple[list[Cell], list[Skipped]]:
    """Expand the options into the cells to run, grouped so each job config runs once.

    Order: the baselines first (loopback only: they have no emulated link), then one
    block per (link, codec), because a codec or a link is a job-level setting that
    needs its own worker launch. Within a block: kinds in :data:`KINDS` order, sizes
    ascending. ``object`` runs once per block at ``object_size``. Emulated-link cells
    whose raw bytes would need more than ``cell_budget_s`` on the wire are left out
    and listed in the second return value.

    Args:
        sizes: payload sizes in bytes.
        kinds: payload kinds.
        codecs: codecs for the p2p method.
        links: link profiles for the p2p method.
        reps: timed repetitions per cell (>= 1).
        object_size: the nominal size of the ``object`` payload.
        baselines: whether to include the baselines (gloo, Ray object store,
            ``ray.util.collective``).
        cell_budget_s: wire-time budget of one emulated cell.

    Returns:
        ``(cells, skipped)``.

    Raises:
        ValueError: ``reps`` below 1, or an empty sizes/kinds/codecs/links list.

    Example:
        >>> cells, _ = build_matrix([1024], ["tensor"], ["raw"], [LINK_PROFILES["loopback"]],
        ...                         reps=1, object_size=512)
        >>> [c.series for c in cells]
        ['torch.distributed gloo', 'Ray object store', 'ray.util.collective', 'p2p raw']
    """
    if reps < 1:
        raise ValueError(f"reps: got {reps}; allowed: an integer >= 1")
    for name, seq in (("sizes", sizes), ("kinds", kinds), ("codecs", codecs), ("link", links)):
        if not seq:
            raise ValueError(f"{name}: got an empty list; allowed: at least one value")
    kinds = [k for k in KINDS if k in kinds]
    cells: list[Cell] = []
    skipped: list[Skipped] = []

    def block(method: str, codec: str, link: LinkProfile) -> None:
        for kind in kinds:
            if method in TENSORS_ONLY and kind not in TENSOR_KINDS:
                skipped.append(
                    Skipped(
                        f"{series_name(method, codec, link.name)} {kind}",
                        "ray.util.collective sends tensors only",
                    )
                )
                continue
            ladder = sorted(set(sizes)) if kind in TENSOR_KINDS else [object_size]
            for size in ladder:
                need = estimated_wire_seconds(size, link, reps)
                if need > cell_budget_s:
                    skipped.append(
                        Skipped(
                            f"{series_name(method, codec, link.name)} {kind} {format_size(size)}",
                            f"needs ~{need:.0f} s on the emulated {link.name} link "
                            f"(budget {cell_budget_s:.0f} s per cell)",
                        )
                    )
                    continue
                cells.append(Cell(method, codec, link.name, kind, size))

    if baselines:
        for method in BASELINES:
            block(method, "raw", LINK_PROFILES["loopback"])
    for link in links:
        for codec in codecs:
            block("p2p", codec, link)
    return cells, skipped


def job_blocks(cells: Sequence[Cell]) -> list[tuple[str, str, str, list[Cell]]]:
    """Group consecutive cells by ``(method, codec, link)``, keeping order.

    Example:
        >>> cells = [Cell("p2p", "raw", "loopback", "tensor", 1),
        ...          Cell("p2p", "raw", "loopback", "tensor", 2),
        ...          Cell("p2p", "lz4", "loopback", "tensor", 1)]
        >>> [(m, c, n, len(cs)) for m, c, n, cs in job_blocks(cells)]
        [('p2p', 'raw', 'loopback', 2), ('p2p', 'lz4', 'loopback', 1)]
    """
    out: list[tuple[str, str, str, list[Cell]]] = []
    for cell in cells:
        if out and out[-1][:3] == (cell.method, cell.codec, cell.link):
            out[-1][3].append(cell)
        else:
            out.append((cell.method, cell.codec, cell.link, [cell]))
    return out


def link_groups(cells: Sequence[Cell]) -> list[tuple[str, list[Cell]]]:
    """Group cells by link (first-seen order) and interleave the methods within a group.

    All methods of one link are measured side by side: for every (kind, size), each
    series in turn, so a baseline and the series compared with it are measured
    seconds apart, not minutes (on a shared machine the load drifts).

    Example:
        >>> cells = [Cell("gloo", "raw", "loopback", "tensor", 1),
        ...          Cell("gloo", "raw", "loopback", "tensor", 2),
        ...          Cell("p2p", "raw", "loopback", "tensor", 1),
        ...          Cell("p2p", "raw", "loopback", "tensor", 2),
        ...          Cell("p2p", "raw", "1gbit", "tensor", 1)]
        >>> [(link, [(c.method, c.size) for c in cs]) for link, cs in link_groups(cells)]
        [('loopback', [('gloo', 1), ('p2p', 1), ('gloo', 2), ('p2p', 2)]), ('1gbit', [('p2p', 1)])]
    """
    groups: dict[str, list[Cell]] = {}
    for cell in cells:
        groups.setdefault(cell.link, []).append(cell)
    out = []
    for link, group in groups.items():
        series = list(dict.fromkeys((c.method, c.codec) for c in group))
        group.sort(key=lambda c: (KINDS.index(c.kind), c.size, series.index((c.method, c.codec))))
        out.append((link, group))
    return out
