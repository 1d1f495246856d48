"""Sphinx directive that shows the committed benchmark reports on the Performance page.

``.. p2p-bench-reports:: performance`` renders every ``*.md`` file of that folder (relative
to the docs source folder), sorted by name. The reports are Markdown as ``p2p-bench`` and
the programs under ``benchmarks/`` write them; this directive understands the subset they
use -- headings, paragraphs, bullet lists, pipe tables, fenced code and images -- and
builds docutils nodes directly, so no report text is ever parsed as reStructuredText and a
report cannot break the ``-W`` build with stray markup. Headings become rubrics, so the
reports do not add entries to the table of contents.

When the folder holds no report, the directive says so and names the commands that
produce one; it never shows numbers that are not in a committed report.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

_TABLE_SEPARATOR = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")
_IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)\s*$")
_INLINE = re.compile(r"(?P<code>`[^`]+`)|(?P<strong>\*\*[^*]+\*\*)|(?P<link>\[[^\]]+\]\([^)\s]+\))")
_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<url>[^)\s]+)\)")


def inline(text: str) -> list[nodes.Node]:
    """Split Markdown inline markup (code, bold, links) into docutils nodes."""
    out: list[nodes.Node] = []
    pos = 0
    for match in _INLINE.finditer(text):
        if match.start() > pos:
            out.append(nodes.Text(text[pos : match.start()]))
        token = match.group(0)
        if match.group("code"):
            out.append(nodes.literal(token[1:-1], token[1:-1]))
        elif match.group("strong"):
            out.append(nodes.strong(token[2:-2], token[2:-2]))
        else:
            link = _LINK.match(token)
            assert link is not None
            url = link.group("url")
            if "://" in url:
                out.append(nodes.reference(link.group("text"), link.group("text"), refuri=url))
            else:  # a relative link into the repository: show the text and the target
                out.append(nodes.Text(f"{link.group('text')} ({url})"))
        pos = match.end()
    if pos < len(text):
        out.append(nodes.Text(text[pos:]))
    return out


def _cells(line: str) -> list[str]:
    stripped = line.strip()
    if stripped.startswith("|"):
        stripped = stripped[1:]
    if stripped.endswith("|"):
        stripped = stripped[:-1]
    return [cell.strip() for cell in stripped.split("|")]


def _table(header: list[str], rows: list[list[str]]) -> nodes.table:
    width = max(len(header), *(len(r) for r in rows)) if rows else len(header)
    table = nodes.table(classes=["p2p-bench-table"])
    group = nodes.tgroup(cols=width)
    table += group
    for _ in range(width):
        group += nodes.colspec(colwidth=1)

    def row(cells: list[str]) -> nodes.row:
        r = nodes.row()
        for i in range(width):
            entry = nodes.entry()
            entry += nodes.paragraph("", "", *inline(cells[i] if i < len(cells) else ""))
            r += entry
        return r

    head = nodes.thead()
    head += row(header)
    body = nodes.tbody()
    for cells in rows:
        body += row(cells)
    group += head
    group += body
    return table


def markdown_to_nodes(text: str, image_base: str) -> list[nodes.Node]:
    """Convert the Markdown subset of the benchmark reports into docutils nodes.

    Args:
        text: the report.
        image_base: folder of the report relative to the docs source folder, with a
            leading slash (``/performance``); relative image paths resolve against it.
    """
    lines = text.splitlines()
    out: list[nodes.Node] = []
    paragraph: list[str] = []
    bullets: nodes.bullet_list | None = None

    def flush() -> None:
        nonlocal bullets
        if paragraph:
            out.append(nodes.paragraph("", "", *inline(" ".join(paragraph))))
            paragraph.clear()
        if bullets is not None:
            out.append(bullets)
            bullets = None

    i = 0
    in_comment = False
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if in_comment or stripped.startswith("<!--"):
            in_comment = "-->" not in stripped
            i += 1
            continue
        if stripped.startswith("```"):
            flush()
            language = stripped[3:].strip() or "text"
            code: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                code.append(lines[i])
                i += 1
            block = nodes.literal_block("\n".join(code), "\n".join(code))
            block["language"] = language if language in {"console", "bash", "yaml"} else "text"
            out.append(block)
            i += 1
            continue
        if not stripped:
            flush()
            i += 1
            continue
        heading = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", stripped)
        if heading:
            flush()
            out.append(nodes.rubric("", "", *inline(heading.group(2))))
            i += 1
            continue
        image = _IMAGE.match(stripped)
        if image:
            flush()
            src = image.group("src")
            uri = src if "://" in src or src.startswith("/") else f"{image_base}/{src}"
            out.append(nodes.image(uri=uri, alt=image.group("alt")))
            i += 1
            continue
        if stripped.startswith("|") and i + 1 < len(lines) and _TABLE_SEPARATOR.match(lines[i + 1]):
            flush()
            header = _cells(stripped)
            rows: list[list[str]] = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            out.append(_table(header, rows))
            continue
        item = re.match(r"^[-*+]\s+(.*)$", stripped)
        if item:
            if paragraph:
                out.append(nodes.paragraph("", "", *inline(" ".join(paragraph))))
                paragraph.clear()
            if bullets is None:
                bullets = nodes.bullet_list()
            entry = nodes.list_item()
            entry += nodes.paragraph("", "", *inline(item.group(1)))
            bullets += entry
            i += 1
            continue
        if bullets is not None and line.startswith((" ", "\t")):  # continuation of an item
            last = bullets.children[-1].children[-1]
            last += nodes.Text(" " + stripped)
            i += 1
            continue
        if bullets is not None:
            flush()
        paragraph.append(stripped)
        i += 1
    flush()
    return out


class BenchReports(SphinxDirective):
    """``.. p2p-bench-reports:: <folder>``: every committed ``*.md`` report in ``folder``."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        folder_rel = self.arguments[0].strip("/")
        folder = Path(self.env.srcdir) / folder_rel
        self.env.note_dependency(str(folder))
        reports = sorted(folder.glob("*.md")) if folder.is_dir() else []
        if not reports:
            note = nodes.paragraph(
                "",
                "",
                nodes.Text("No benchmark report is committed in "),
                nodes.literal("", f"docs/{folder_rel}/"),
                nodes.Text(
                    " yet, so this page shows no numbers. The commands above produce"
                    " the reports; copy a report's Markdown file and its plot there to"
                    " publish it."
                ),
            )
            return [note]
        out: list[nodes.Node] = []
        for report in reports:
            self.env.note_dependency(str(report))
            container = nodes.container(classes=["p2p-bench-report"])
            container["support_smartquotes"] = False  # keep "--quick" as written
            source = nodes.literal("", f"docs/{folder_rel}/{report.name}")
            container += nodes.paragraph("", "", nodes.Text("Report: "), source)
            for node in markdown_to_nodes(report.read_text(encoding="utf-8"), f"/{folder_rel}"):
                container += node
            out.append(container)
        return out


class MarkdownFile(SphinxDirective):
    """``.. p2p-markdown:: <file.md>``: one Markdown file of the repository, rendered in place.

    The path is relative to the page that holds the directive. The file's first heading is
    dropped when it repeats the page's own title (the page gives the title); every other
    heading becomes a rubric. Used for the drafts under ``docs/operations/`` and
    ``docs/performance-bench.md``, which stay Markdown files of their owners.
    """

    required_arguments = 1
    option_spec: ClassVar[dict[str, Callable[[str], Any]]] = {"skip-title": directives.flag}

    def run(self) -> list[nodes.Node]:
        page_dir = (Path(self.env.srcdir) / self.env.docname).parent
        path = (page_dir / self.arguments[0]).resolve()
        self.env.note_dependency(str(path))
        if not path.is_file():
            raise self.error(f"p2p-markdown: no such file: {self.arguments[0]}")
        text = path.read_text(encoding="utf-8")
        if "skip-title" in self.options:
            lines = text.splitlines()
            if lines and lines[0].startswith("# "):
                text = "\n".join(lines[1:])
        rel = path.parent.relative_to(Path(self.env.srcdir).resolve()).as_posix()
        container = nodes.container(classes=["p2p-markdown"])
        container["support_smartquotes"] = False
        for node in markdown_to_nodes(text, f"/{rel}" if rel != "." else ""):
            container += node
        return [container]


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("p2p-bench-reports", BenchReports)
    app.add_directive("p2p-markdown", MarkdownFile)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
