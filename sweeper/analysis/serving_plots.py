"""The report's serving-mode figures: latency against achieved throughput, energy per
token and per request against the achieved rate with the saturation knee, goodput
against the offered rate. One line per configuration (every axis but the request
rate), one column of panels per model; a saturated trial is drawn as an ``x``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sweeper.analysis.plot_kit import (
    UNSTABLE_NOTE,
    PlotNotApplicable,
    new_figure,
    plottable,
    require,
    scatter_marked,
    series_label,
    set_log,
)
from sweeper.core.axes import AXES

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

SATURATED_NOTE = ("x: saturated (the engine fell behind the offered rate), inside a hollow ring where also "
                  "unstable; dotted line: the knee")


def serving_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The ok serving-mode trials, or PlotUnavailable when the sweep has none."""
    df = plottable(trials)
    if "mode" not in df.columns or not (df["mode"] == "serving").any():
        raise PlotNotApplicable("no serving-mode trials (workload.mode: serving)")
    return df[df["mode"] == "serving"]


def _series(df: pd.DataFrame) -> Iterator[tuple[int, str, pd.DataFrame]]:
    """Each configuration's trials, ordered by offered rate: (colour index, label, rows)."""
    keys = [k for k in AXES.config_columns() if k in df.columns and k not in ("model", "request_rate")]
    for j, (_, g) in enumerate(df.groupby(keys, sort=True, dropna=False)):
        label = series_label(g.iloc[0], df)
        conc = g.iloc[0].get("max_concurrency")
        if conc is not None and conc == conc:
            label += f" conc={int(conc)}"
        yield j, label, g.sort_values("request_rate")


def _panels(df: pd.DataFrame, rows: int, height_in: float = 3.4) -> tuple[Figure, Any, list[str]]:
    models = sorted(df["model"].unique())
    fig = new_figure(max(6.0, 4.8 * len(models)), height_in * rows + 0.6)
    return fig, fig.subplots(rows, len(models), squeeze=False), models


def _draw(ax: Any, x: Any, y: Any, g: pd.DataFrame, colour: str, label: str, style: str = "-") -> None:
    ax.plot(x, y, style, color=colour, lw=1.4, label=label)
    saturated = g["saturated"].fillna(False).to_numpy(dtype=bool) if "saturated" in g else x * 0 > 0
    unstable = g["unstable"].fillna(False).to_numpy(dtype=bool)
    scatter_marked(ax, x[~saturated], y[~saturated], unstable[~saturated], colour, series=label)
    if saturated.any():
        # Both marks where both hold: the unstable trial's hollow hatched ring around its x.
        both = saturated & unstable
        if both.any():
            scatter_marked(ax, x[both], y[both], unstable[both], colour, series=label)
        ax.scatter(x[saturated], y[saturated], marker="x", s=50, color=colour, zorder=4, gid=label)


def _finish(fig: Figure, axes: Any, title: str, notes: list[str]) -> Figure:
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.suptitle(title + "".join("\n" + note for note in notes), fontsize=10)
    return fig


def plot_serving_latency(trials: pd.DataFrame) -> Figure:
    """TTFT and TPOT (p50 solid, p99 dashed) against achieved output throughput."""
    df = serving_trials(trials)
    require(df, ("throughput_tok_s", "ttft_p50_s"), "no latency measured")
    fig, grid, models = _panels(df, 2)
    for c, model in enumerate(models):
        mdf = df[df["model"] == model]
        for r, metric in enumerate(("ttft", "tpot")):
            ax = grid[r][c]
            for j, label, g in _series(mdf):
                x = g["throughput_tok_s"].to_numpy(dtype=float)
                for q, style in (("p50", "-"), ("p99", "--")):
                    y = g[f"{metric}_{q}_s"].to_numpy(dtype=float) * 1e3
                    _draw(ax, x, y, g, f"C{j % 10}", f"{label} {q}", style)
            ax.set_xlabel("achieved output tokens / s")
            ax.set_ylabel(f"{metric.upper()} (ms)")
            ax.set_title(model, fontsize=10)
            values = df[f"{metric}_p99_s"].dropna().to_numpy(dtype=float)
            if len(values) and values.min() > 0 and values.max() / values.min() > 20:
                set_log(ax, "y")
    return _finish(fig, grid, "Latency vs achieved throughput (serving)", [SATURATED_NOTE, UNSTABLE_NOTE])


def knee_rate(g: pd.DataFrame) -> float | None:
    """The achieved rate at the first (lowest offered rate) saturated trial of a series."""
    saturated = g[g["saturated"].fillna(False).astype(bool)].sort_values("request_rate")
    if saturated.empty:
        return None
    value = saturated.iloc[0]["achieved_rate_req_s"]
    return float(value) if value == value else None


def plot_serving_energy(trials: pd.DataFrame) -> Figure:
    """J/token and J/request against the achieved request rate, the saturation knee marked."""
    df = serving_trials(trials)
    require(df, ("energy_per_token_j",), "no energy measured: CPU-only run?")
    fig, grid, models = _panels(df, 2)
    for c, model in enumerate(models):
        mdf = df[df["model"] == model]
        for r, (column, ylabel) in enumerate((("energy_per_token_j", "J / output token"),
                                              ("energy_per_request_j", "J / request"))):
            ax = grid[r][c]
            for j, label, g in _series(mdf):
                g = g[g[column].notna()]
                if g.empty:
                    continue
                colour = f"C{j % 10}"
                _draw(ax, g["achieved_rate_req_s"].to_numpy(dtype=float), g[column].to_numpy(dtype=float),
                      g, colour, label)
                knee = knee_rate(g)
                if knee is not None:
                    ax.axvline(knee, color=colour, ls=":", lw=1.2, gid=f"knee {label}")
            ax.set_xlabel("achieved requests / s")
            ax.set_ylabel(ylabel)
            ax.set_title(model, fontsize=10)
            values = mdf[column].dropna().to_numpy(dtype=float)
            if len(values) and values.min() > 0 and values.max() / values.min() > 20:
                set_log(ax, "y")
    return _finish(fig, grid, "Energy vs achieved request rate (serving)", [SATURATED_NOTE])


def plot_goodput(trials: pd.DataFrame) -> Figure:
    """Goodput (requests/s meeting every SLO bound) and the achieved rate against the
    offered rate; an infinite rate is drawn at the right end, labelled inf."""
    df = serving_trials(trials)
    require(df, ("goodput_req_s",), "no SLO in the sweep file (workload.slo)")
    finite = df["request_rate"][df["request_rate"].apply(lambda v: v == v and not math.isinf(v))]
    inf_at = 2.0 * float(finite.max()) if len(finite) else 1.0
    fig, grid, models = _panels(df, 1, 3.8)
    for c, model in enumerate(models):
        ax = grid[0][c]
        mdf = df[df["model"] == model]
        for j, label, g in _series(mdf):
            x = g["request_rate"].apply(lambda v: inf_at if math.isinf(v) else v).to_numpy(dtype=float)
            colour = f"C{j % 10}"
            _draw(ax, x, g["goodput_req_s"].to_numpy(dtype=float), g, colour, f"{label} goodput")
            ax.plot(x, g["achieved_rate_req_s"].to_numpy(dtype=float), ":", color=colour, lw=1.0,
                    label=f"{label} achieved")
        ticks = sorted(set(finite.tolist())) + ([inf_at] if (df["request_rate"] == math.inf).any() else [])
        if len(ticks) > 1 and ticks[-1] / max(ticks[0], 1e-9) >= 8:
            set_log(ax, "x")
        ax.set_xticks(ticks, [("inf" if t == inf_at and len(finite) < len(df["request_rate"].dropna()) else f"{t:g}")
                              for t in ticks])
        ax.set_xlabel("offered requests / s")
        ax.set_ylabel("requests / s")
        ax.set_title(model, fontsize=10)
    return _finish(fig, grid, "Goodput vs offered rate (serving)", [SATURATED_NOTE])
