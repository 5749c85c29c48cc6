"""What a drawn figure shows, as data: the report embeds it beside each image."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure_data(fig: Figure) -> dict[str, Any]:
    """What a drawn figure shows, read back from its artists after layout: per visible
    panel its title, axis labels and scales, the tick labels inside the view, every
    labelled line's and marker set's points, and the pixel boxes of its text labels (in the
    pixels of its last drawing: the report's image, where ``figure_png`` drew it).

    The HTML report embeds this beside each image, so a test (or a reader's script)
    can check units, scales, point counts and overlapping labels without reading pixels.
    """
    import numpy as np
    from matplotlib.collections import PathCollection
    from matplotlib.container import BarContainer
    from matplotlib.text import Annotation

    if fig.stale:  # changed since its last drawing, or never drawn: lay it out now
        fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]

    def ticks(axis: Any, lo: float, hi: float) -> list[str]:
        low, high = min(lo, hi), max(lo, hi)
        span = (high - low) * 1e-9
        return [t.get_text() for t, v in zip(axis.get_ticklabels(), axis.get_ticklocs(), strict=False)
                if t.get_text() and low - span <= v <= high + span]

    def points(xy: Any) -> list[list[float]]:
        arr = np.asarray(xy, dtype=float).reshape(-1, 2)
        return [[float(x), float(y)] for x, y in arr if np.isfinite(x) and np.isfinite(y)]

    panels = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        series: list[dict[str, Any]] = [{"kind": "line", "label": str(line.get_label()), "points": points(line.get_xydata())}
                  for line in ax.get_lines() if not str(line.get_label()).startswith("_")]
        series += [{"kind": "markers", "label": c.get_gid() or str(c.get_label()),
                    "points": points(c.get_offsets())}
                   for c in ax.collections if isinstance(c, PathCollection)]
        series += [{"kind": "bars", "label": str(bars.get_label()),
                    "points": [[p.get_x() + p.get_width() / 2, p.get_height()] for p in bars.patches]}
                   for bars in ax.containers if isinstance(bars, BarContainer)]
        labels = []
        for text in ax.texts:
            if isinstance(text, Annotation) and text.get_visible() and text.get_text():
                box = text.get_window_extent(renderer)
                labels.append({"text": text.get_text(), "box": [box.x0, box.y0, box.x1, box.y1]})
        panels.append({
            "title": ax.get_title(), "xlabel": ax.get_xlabel(), "ylabel": ax.get_ylabel(),
            "xscale": ax.get_xscale(), "yscale": ax.get_yscale(),
            "xticks": ticks(ax.xaxis, *ax.get_xlim()), "yticks": ticks(ax.yaxis, *ax.get_ylim()),
            "ylim": [float(v) for v in ax.get_ylim()], "series": series, "labels": labels,
        })
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""  # type: ignore[attr-defined]
    return {"title": title, "panels": panels}
