"""The report's figure of a configuration search (search.parquet, one row per point): with two
objectives, every point against both and the Pareto front joined; with one, every point's value
against the GPU-seconds the search had spent when it was told, and the best so far as a step line.
Points that broke a constraint are hollow; points without a value (failed, or no capacity in the
range) are listed under the figure, not drawn."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweeper.analysis.plot_kit import PlotNotApplicable, PlotUnavailable, new_figure

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure


def _objective(text: str) -> tuple[str, str]:
    direction, _, column = str(text).partition(" ")
    return direction, column


def plot_search(points: pd.DataFrame | None) -> Figure:
    if points is None or points.empty:
        raise PlotNotApplicable("no configuration search (the sweep file's search block)")
    searches = list(points["search_id"].unique())
    fig = new_figure(6.4 * len(searches), 4.4)
    axes = fig.subplots(1, len(searches), squeeze=False)[0]
    for ax, search in zip(axes, searches, strict=True):
        df = points[points["search_id"] == search].sort_values("search_step")
        if df["objective_2"].notna().any():
            _pareto(ax, df)
        else:
            _best_so_far(ax, df)
        ax.grid(True, alpha=0.3)
    return fig


def _valued(df: pd.DataFrame, *columns: str) -> pd.DataFrame:
    out = df.dropna(subset=list(columns))
    if out.empty:
        raise PlotUnavailable("no point of the search has a value for its objective(s) (see search.parquet's error)")
    return out


def _pareto(ax: Any, df: pd.DataFrame) -> None:
    (d1, c1), (d2, c2) = _objective(df["objective"].iloc[0]), _objective(df["objective_2"].iloc[0])
    shown = _valued(df, "value", "value_2")
    feasible = shown["feasible"].fillna(False).astype(bool)
    ax.scatter(shown.loc[feasible, "value"], shown.loc[feasible, "value_2"], s=36, color="tab:blue",
               label="a point", zorder=3)
    ax.scatter(shown.loc[~feasible, "value"], shown.loc[~feasible, "value_2"], s=36, facecolors="none",
               edgecolors="tab:gray", label="broke a constraint", zorder=3)
    front = shown[shown["best"].fillna(False).astype(bool)].sort_values("value")
    ax.plot(front["value"], front["value_2"], "-o", color="tab:red", lw=1.4, ms=7, label="Pareto front", zorder=4)
    for _, row in front.iterrows():
        ax.annotate(f"step {int(row['search_step'])}", (row["value"], row["value_2"]), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel(f"{c1} ({d1})")
    ax.set_ylabel(f"{c2} ({d2})")
    ax.set_title(f"search {df['search_id'].iloc[0]}: {len(df)} point(s)", fontsize=10)
    ax.legend(fontsize=8)


def _best_so_far(ax: Any, df: pd.DataFrame) -> None:
    import numpy as np

    direction, column = _objective(df["objective"].iloc[0])
    spent = df["gpu_s"].fillna(0.0).cumsum()
    shown = _valued(df.assign(spent_gpu_s=spent), "value")
    feasible = shown["feasible"].fillna(False).astype(bool)
    ax.scatter(shown.loc[feasible, "spent_gpu_s"], shown.loc[feasible, "value"], s=30, color="tab:blue",
               label="a point", zorder=3)
    ax.scatter(shown.loc[~feasible, "spent_gpu_s"], shown.loc[~feasible, "value"], s=30, facecolors="none",
               edgecolors="tab:gray", label="broke a constraint", zorder=3)
    values = shown["value"].where(feasible).to_numpy(dtype=float)
    best = np.fmin.accumulate(values) if direction == "minimize" else np.fmax.accumulate(values)
    ax.step(shown["spent_gpu_s"], best, where="post", color="tab:red", lw=1.6, label="best so far")
    ax.set_xlabel("GPU-seconds spent by the search")
    ax.set_ylabel(f"{column} ({direction})")
    ax.set_title(f"search {df['search_id'].iloc[0]}: {len(df)} point(s)", fontsize=10)
    ax.legend(fontsize=8)
