"""What every plot module shares: figures on an explicit canvas, the reasons a plot is left
out, series labels, hollow markers for unstable trials, log axes.

The plot collections (``plots``, ``serving_plots``, ``quality_plots``, ``stage_plots``)
draw with these; none of them borrows another's private helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweeper.analysis.tables import ok_trials

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd
    from matplotlib.figure import Figure

UNSTABLE_NOTE = "hollow markers: unstable trials"
# Offline generate calls' phases, and a serving run's (its steady-state window and either side).
PHASE_COLOURS = {"prefill": "tab:orange", "decode": "tab:blue",
                  "ramp": "tab:olive", "steady": "tab:cyan", "drain": "tab:purple"}


class PlotUnavailable(Exception):
    """The data a plot needs is absent or all null; the message says which."""


class PlotNotApplicable(PlotUnavailable):
    """The plot is for the other workload mode (per-batch plots of a serving sweep, serving
    plots of an offline one): left out without a note."""


# -- helpers ---------------------------------------------------------------------


def try_plot(make: Any, *args: Any, **kwargs: Any) -> Figure | None:
    """``make(*args)``, or None after printing why the plot is left out (for notebooks)."""
    try:
        return make(*args, **kwargs)
    except PlotUnavailable as exc:
        print(f"{make.__name__}: left out: {exc}")
        return None


def new_figure(width_in: float, height_in: float) -> Figure:
    """A figure on its own Agg canvas (no pyplot, no global backend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def usable(df: pd.DataFrame, *columns: str) -> bool:
    return all(c in df.columns and df[c].notna().any() for c in columns)


def require(df: pd.DataFrame, columns: tuple[str, ...], why: str) -> None:
    missing = [c for c in columns if c not in df.columns or not df[c].notna().any()]
    if missing:
        raise PlotUnavailable(f"{', '.join(missing)} missing or all null ({why})")


def plottable(trials: pd.DataFrame) -> pd.DataFrame:
    """The ok trials, or PlotUnavailable when there is none (every trial failed or was skipped)."""
    df = ok_trials(trials)
    if df.empty:
        raise PlotUnavailable("no ok trials (see the failed and skipped trials)")
    return df


def varies(df: pd.DataFrame, column: str) -> bool:
    return column in df.columns and df[column].nunique(dropna=False) > 1


def given(value: Any) -> bool:
    """Not None, NaN or pandas' NA."""
    import pandas as pd

    return value is not None and not bool(pd.isna(value))


def load_label(row: Any) -> str:
    """What loads a trial: ``bs=8`` offline; ``rate=24/s`` in serving mode (``rate=inf``: all
    requests at once), with ``conc=16`` where the engine's concurrency is capped."""
    rate = row.get("request_rate")
    if given(rate):
        conc = row.get("max_concurrency")
        text = "rate=inf" if rate == float("inf") else f"rate={float(rate):g}/s"
        return text + (f" conc={int(conc)}" if given(conc) else "")
    batch = row.get("batch_size")
    return f"bs={int(batch)}" if given(batch) else ""


def series_label(row: Any, df: pd.DataFrame, with_model: bool = False) -> str:
    """A short label naming only the axes that vary in ``df``."""
    parts = [str(row["model"])] if with_model else []
    if varies(df, "backend"):
        parts.append(str(row["backend"]))
    parts.append(str(row["precision"]))
    if varies(df, "backend_options") or varies(df, "tensor_parallel"):
        from sweeper.core.trial import row_variant

        tp = row.get("tensor_parallel")
        variant = row_variant(str(row["backend"]), row.get("backend_options"),
                                int(tp) if tp is not None and tp == tp else 1)
        if variant:
            parts.append(variant)
    if varies(df, "input_len") or varies(df, "output_len"):
        parts.append(f"in{row['input_len']}/out{row['output_len']}")
    return " ".join(parts)


def scatter_marked(ax: Any, x: Any, y: Any, unstable: Any, colour: Any, marker: str = "o",
                    size: float = 36, label: str | None = None, series: str | None = None) -> None:
    """Filled markers for stable trials, hollow (hatched) ones for unstable trials.

    ``series`` names the markers' series in ``figure_data`` when ``label`` (the
    legend's) is left to the series' line.
    """
    stable = ~unstable
    gid = series or label
    if stable.any():
        ax.scatter(x[stable], y[stable], s=size, color=colour, marker=marker, zorder=3, label=label, gid=gid)
    if unstable.any():
        ax.scatter(x[unstable], y[unstable], s=size * 1.6, facecolors="none", edgecolors=colour,
                   hatch="////", linewidths=1.4, marker=marker, zorder=3,
                   label=None if stable.any() else label, gid=gid)


def log_if_wide(ax: Any, values: Any, axis: str) -> None:
    """Log scale when the values span more than ~a decade and a half (see ``set_log``)."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    if len(values) and values.max() / values.min() > 20:
        set_log(ax, axis)


def set_log(ax: Any, axis: str) -> None:
    """A log axis whose ticks read as numbers: 1-2-5 steps in every decade, labelled plainly
    (``0.2``, ``500``, never ``10^-1``), so even a span of one decade shows several labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())
    _snap_to_labels(ax, axis)


def _snap_to_labels(ax: Any, axis: str) -> None:
    """Widen a log axis drawn so far to the 1-2-5 labels around its data, so that a label
    stands above the highest point and below the lowest (points to 150 on an axis that
    stopped at 160 had no label above 100)."""
    import math

    lo, hi = (ax.dataLim.y0, ax.dataLim.y1) if axis == "y" else (ax.dataLim.x0, ax.dataLim.x1)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi < lo:
        return

    def steps(v: float) -> list[float]:
        decade = 10.0 ** math.floor(math.log10(v))
        return [m * decade * f for f in (0.1, 1.0, 10.0) for m in (1.0, 2.0, 5.0)]

    below = max(t for t in steps(lo) if t <= lo * (1 + 1e-9))
    above = min(t for t in steps(hi) if t >= hi * (1 - 1e-9))
    current = ax.get_ylim() if axis == "y" else ax.get_xlim()
    limits = (min(below, current[0]), max(above, current[1]))
    (ax.set_ylim if axis == "y" else ax.set_xlim)(*limits)


def batch_axis(ax: Any, batches: Any) -> None:
    batches = sorted({int(b) for b in batches})
    if len(batches) > 1 and batches[-1] / max(batches[0], 1) >= 8:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_minor_locator(null_locator())
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")


def null_locator() -> Any:
    from matplotlib.ticker import NullLocator

    return NullLocator()


def arr(values: list[Any]) -> Any:
    import numpy as np

    return np.asarray(values)
