"""The report page as records (``Table``, ``Plot``, ``Report``) and its two renderings.

``render_html`` writes one self-contained page: the plots are embedded as PNG
data URIs, so the file can be mailed or attached to a CI run on its own.
``render_markdown`` links the PNG files written beside it. Both lay the page out
the same way: the header lines, the best-configuration table, the plots and the
notes on the plots left out, then the remaining tables.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Plot:
    title: str
    filename: str
    png: bytes
    caption: str = ""
    data: dict[str, Any] = field(default_factory=dict)  # what the figure shows (figure_data.figure_data)


@dataclass
class Report:
    path: Path  # index.html or report.md
    directory: Path
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line per plot left out
    tables: list[Table] = field(default_factory=list)
    header: list[str] = field(default_factory=list)


# -- HTML ------------------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: .2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
ul.meta { color: #555; list-style: none; padding: 0; } .note { color: #8a6d3b; }
table { border-collapse: collapse; font-size: 13px; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; } tr.unstable td { background: #fff6e0; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
.caption { color: #666; font-size: 13px; }
"""


# Marks each figure with the size its image decoded to, once the page has loaded: a
# browser-rendered page says which plots it actually drew.
_ON_LOAD = """
window.addEventListener("load", () => {
  for (const f of document.querySelectorAll("figure.plot")) {
    const img = f.querySelector("img");
    f.dataset.renderedWidth = img.complete ? img.naturalWidth : 0;
    f.dataset.renderedHeight = img.complete ? img.naturalHeight : 0;
  }
  document.body.dataset.loaded = "1";
});
"""


def _html_table(table: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in table.headers)
    body = []
    for row in table.rows:
        cls = ' class="unstable"' if any("unstable" in c for c in row) and "Unstable" not in table.title else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    caption = f'<p class="caption">{e(table.caption)}</p>' if table.caption else ""
    rows = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>" if table.rows else ""
    return f"<h2>{e(table.title)}</h2>{caption}{rows}"


def render_html(report: Report) -> str:
    e = html.escape
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>sweeper report</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>sweeper report</h1>",
             '<ul class="meta">' + "".join(f"<li>{e(line)}</li>" for line in report.header) + "</ul>"]
    parts.append(_html_table(report.tables[0]))
    parts.append("<h2>Plots</h2>")
    for plot in report.plots:
        image = base64.b64encode(plot.png).decode("ascii")
        # "</" cannot end the script element early: JSON allows "<\/" for "</".
        data = json.dumps(plot.data, separators=(",", ":")).replace("</", "<\\/")
        parts.append(f'<figure class="plot" data-file="{e(plot.filename)}">'
                     f'<img alt="{e(plot.title)}" src="data:image/png;base64,{image}">'
                     f"<figcaption><b>{e(plot.title)}</b> ({e(plot.filename)})"
                     + (f": {e(plot.caption)}" if plot.caption else "") + "</figcaption>"
                     f'<script type="application/json" class="plot-data">{data}</script></figure>')
    parts += [f'<p class="note">{e(note)}</p>' for note in report.notes]
    parts += [_html_table(t) for t in report.tables[1:]]
    parts.append(f"<script>{_ON_LOAD}</script>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


# -- Markdown --------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> list[str]:
    lines = [f"## {table.title}", ""]
    if table.caption:
        lines += [table.caption, ""]
    if table.rows:
        lines.append("| " + " | ".join(table.headers) + " |")
        lines.append("|" + " --- |" * len(table.headers))
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
        lines.append("")
    return lines


def render_markdown(report: Report) -> str:
    lines = ["# sweeper report", ""] + [f"- {line}" for line in report.header] + [""]
    lines += _md_table(report.tables[0])
    lines += ["## Plots", ""]
    for plot in report.plots:
        lines += [f"![{plot.title}]({plot.filename})", ""]
        if plot.caption:
            lines += [f"*{plot.title}*: {plot.caption}", ""]
    lines += [f"> {note}" + "\n" for note in report.notes]
    for table in report.tables[1:]:
        lines += _md_table(table)
    return "\n".join(lines).rstrip() + "\n"


# -- terminal --------------------------------------------------------------------------------

# Columns of the best-configuration table that are text (left-aligned); the rest are numbers.
TEXT_HEADERS = frozenset({"model", "backend", "precision", "in/out", "criterion", "trial"})
# Cells that may wrap at their spaces: prose, and a figure with its [interval] under it. Every
# other cell stays on one line: a trial id is copied from the terminal into `sweeper query`.
_WRAPPING = frozenset({"criterion", "tok/s", "J/token"})
# What a console too narrow for the whole table leaves out, first to last; any column not
# named here or in _KEPT (the budget's prices) goes right after MBU.
_DROP_ORDER = ("MBU", "repeats", "in/out", "TTFT ms", "TPOT ms", "backend")
_KEPT = frozenset({"model", "precision", "batch / rate", "tok/s", "J/token", "criterion", "trial"})
# Shorter headers for a narrow console.
_NARROW_HEADERS = {"batch / rate": "bs/rate"}


def _widths(text: str, wraps: bool) -> tuple[int, int]:
    """(narrowest, widest) ``text`` can be laid out in, in terminal cells."""
    from rich.cells import cell_len

    widest = max((cell_len(line) for line in text.splitlines()), default=0)
    return (max((cell_len(word) for word in text.split()), default=0) if wraps else widest), widest


def _rules(n: int, narrow: bool) -> int:
    """Cells taken by rules and padding around ``n`` columns (without vertical rules: narrow)."""
    return 2 * (n - 1) if narrow else 3 * n + 1


class _ConsoleLayout:
    """The column widths of one table on a console ``width`` cells wide (``console_table``)."""

    def __init__(self, table: Table, width: int) -> None:
        self.table, self.width = table, width
        self.columns = [i for i, _ in enumerate(table.headers) if any(row[i] for row in table.rows)]
        self.cells = {i: [_widths(row[i], table.headers[i] in _WRAPPING) for row in table.rows]
                      for i in self.columns}
        self.most = {i: max(c[1] for c in self.cells[i]) for i in self.columns}  # headers may wrap, cells need not
        self.headers = {i: table.headers[i] for i in self.columns}
        self.least = self._narrowest()
        self.narrow = self._total(self.least, narrow=False) > width
        if self.narrow:
            self.headers = {i: _NARROW_HEADERS.get(h, h) for i, h in self.headers.items()}
            self.least = self._narrowest()
        self.dropped = self._drop()
        self.widths, self.folded = dict(self.least), set[int]()
        room = self._grow(width - self._total(self.least, self.narrow))
        self._fold(room)

    def _narrowest(self) -> dict[int, int]:
        return {i: max([_widths(self.headers[i], True)[0], *(c[0] for c in self.cells[i])]) for i in self.columns}

    def _total(self, widths: dict[int, int], narrow: bool) -> int:
        return sum(widths[i] for i in self.columns) + _rules(len(self.columns), narrow)

    def _drop(self) -> list[str]:
        """Columns leave in ``_DROP_ORDER`` (the prices after MBU) while the narrow table is too wide."""
        headers = self.table.headers

        def rank(i: int) -> int:
            return 2 * _DROP_ORDER.index(headers[i]) if headers[i] in _DROP_ORDER else 1

        dropped = []
        for i in sorted((i for i in self.columns if headers[i] not in _KEPT), key=rank):
            if not self.narrow or self._total(self.least, narrow=True) <= self.width:
                break
            self.columns.remove(i)
            dropped.append(headers[i])
        return dropped

    def _grow(self, room: int) -> int:
        """The room left goes first to the cells (those that need least first, so that the most
        rows stay on one line), then to the headers; returns what is left (negative: too wide)."""
        whole_headers = {i: max(self.most[i], _widths(self.headers[i], True)[1]) for i in self.columns}
        for target in (self.most, whole_headers):
            for i in sorted(self.columns, key=lambda i: target[i] - self.widths[i]):
                grow = max(0, min(room, target[i] - self.widths[i]))
                self.widths[i] += grow
                room -= grow
        return room

    def _fold(self, room: int) -> None:
        """Still too wide (several repeats' [intervals] on a narrow console): the intervals give
        way down to their medians, then the widest columns but the trial id's; folded, not cut."""
        headers, rows = self.table.headers, self.table.rows
        medians = {i: max(_widths(row[i].split(" [")[0], False)[1] for row in rows) for i in self.columns}
        while room < 0:
            give = ([j for j in self.columns if headers[j] in ("tok/s", "J/token") and self.widths[j] > medians[j]]
                    or [j for j in self.columns if headers[j] != "trial" and self.widths[j] > 1])
            if not give:
                return
            i = max(give, key=lambda j: self.widths[j])
            self.widths[i] -= 1
            self.folded.add(i)
            room += 1


def console_table(table: Table, width: int, title: str | None = None) -> Any:
    """``table`` as a rich Table for a console ``width`` cells wide (the end of ``sweeper run``).

    Columns with nothing in them are left out. Where every column fits at its narrowest it is
    drawn with rules; otherwise it is drawn without vertical rules and shorter headers and, while
    still too wide, columns leave in ``_DROP_ORDER``, named in the caption. The column widths
    are laid out here (``_ConsoleLayout``), not by rich, so that only cells of ``_WRAPPING`` wrap
    (at their spaces) and no cell is cut: a trial id is always whole, on one line (on a console
    at least 16 cells wide); where even the kept columns are too wide, the others fold.
    """
    from rich import box
    from rich.table import Table as RichTable
    from rich.text import Text

    layout = _ConsoleLayout(table, width)
    caption = (f"left out at {width} columns: {', '.join(layout.dropped)} (a wider terminal or `sweeper report` "
               "shows them)") if layout.dropped else None
    out = RichTable(title=Text(title or table.title), title_justify="left", caption=caption and Text(caption),
                    caption_justify="left")
    if layout.narrow:
        out.box, out.show_edge, out.pad_edge, out.collapse_padding = box.SIMPLE_HEAD, False, False, True
    for i in layout.columns:
        name = table.headers[i]
        out.add_column(Text(layout.headers[i], no_wrap=False), width=layout.widths[i],
                       no_wrap=name not in _WRAPPING and i not in layout.folded,
                       overflow="fold" if i in layout.folded else "ellipsis",
                       justify="left" if name in TEXT_HEADERS else "right")
    for row in table.rows:
        out.add_row(*(Text(row[i]) for i in layout.columns))
    return out
