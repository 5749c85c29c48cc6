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
