"""The report's accuracy figure: what a configuration answers right against what it costs.

Left, each scored trial's accuracy (its Wilson 95 % interval as a bar) against its mean J per
request, the trials no other trial of the model beats on both (more accurate and cheaper)
joined and labelled. Right, J per correct answer of each configuration and load: energy and
accuracy in one number, where a precision that saves energy per request but answers less can
come out dearer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.analysis.plot_kit import (
    UNSTABLE_NOTE,
    PlotNotApplicable,
    PlotUnavailable,
    load_label,
    log_if_wide,
    new_figure,
    plottable,
    scatter_marked,
    series_label,
)
from sweeper.analysis.plots import pareto_mask

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

MARKERS = "osD^v<>pPX*"


def accuracy_frontier(trials: pd.DataFrame) -> pd.DataFrame:
    """The ok scored trials with energy, with an ``on_frontier`` column per model (most accurate
    for the fewest J per request)."""
    df = plottable(trials)
    if "accuracy" not in df.columns or not df["accuracy"].notna().any():
        raise PlotNotApplicable("no scored trials (a sweep file's scoring: block)")
    df = df[df["accuracy"].notna() & df["energy_per_request_j"].notna()].copy()
    if df.empty:
        raise PlotUnavailable("replies were scored, but no GPU energy per request (a CPU-only run): "
                              "nothing to draw accuracy against")
    df["on_frontier"] = False
    for _, g in df.groupby("model"):
        df.loc[g.index, "on_frontier"] = pareto_mask(g["energy_per_request_j"], -g["accuracy"])
    return df


def plot_accuracy(trials: pd.DataFrame) -> Figure:
    df = accuracy_frontier(trials)
    precisions = sorted(df["precision"].dropna().unique())
    fig = new_figure(12.4, 4.8)
    left, right = fig.subplots(1, 2)
    for m, (model, g) in enumerate(df.groupby("model", sort=True)):
        colour = f"C{m % 10}"
        for precision, p in g.groupby("precision"):
            x, y = p["energy_per_request_j"].to_numpy(), p["accuracy"].to_numpy()
            low = y - p["accuracy_ci95_low"].fillna(p["accuracy"]).to_numpy()
            high = p["accuracy_ci95_high"].fillna(p["accuracy"]).to_numpy() - y
            left.errorbar(x, y, yerr=np.vstack([low, high]), fmt="none", ecolor=colour, alpha=0.5, lw=1)
            scatter_marked(left, x, y, p["unstable"].to_numpy(), colour,
                           marker=MARKERS[precisions.index(precision) % len(MARKERS)], label=f"{model} {precision}")
        on = g[g["on_frontier"]].sort_values("energy_per_request_j")
        left.step(on["energy_per_request_j"], on["accuracy"], where="post", color=colour, lw=1.2, alpha=0.7)
        for k, (_, row) in enumerate(on.iterrows()):
            left.annotate(f"{series_label(row, df)} {load_label(row)}".strip(),
                          (row["energy_per_request_j"], row["accuracy"]), fontsize=7,
                          xytext=(5, 4 if k % 2 == 0 else -10), textcoords="offset points")
    log_if_wide(left, df["energy_per_request_j"], "x")
    left.set_ylim(-0.02, 1.02)
    left.set_xlabel("J / request (lower is better)")
    left.set_ylabel("accuracy, Wilson 95 % interval (higher is better)")
    left.set_title("Accuracy vs energy per request", fontsize=10)
    left.grid(True, alpha=0.3, which="both")
    left.legend(fontsize=7, loc="best")
    _per_correct(right, df)
    note = "lines join each model's non-dominated trials (labelled)"
    if df["unstable"].any():
        note += f"; {UNSTABLE_NOTE}"
    fig.suptitle(f"Accuracy beside energy\n{note}", fontsize=11)
    return fig


def _per_correct(ax: Any, df: pd.DataFrame) -> None:
    """J per correct answer of each trial, grouped by model and precision; none where nothing was right."""
    rows = df.sort_values(["model", "precision", "energy_per_request_j"])
    labels = [f"{series_label(r, df, with_model=df['model'].nunique() > 1)} {load_label(r)}".strip()
              for _, r in rows.iterrows()]
    values = rows["energy_per_correct_j"].to_numpy(dtype=float)
    models = sorted(df["model"].unique())
    colours = [f"C{models.index(m) % 10}" for m in rows["model"]]
    ypos = np.arange(len(rows))
    ax.barh(ypos, np.nan_to_num(values, nan=0.0), color=colours, alpha=0.8)
    for y, value in zip(ypos, values, strict=True):
        ax.annotate("no correct answer" if np.isnan(value) else f"{value:.3g} J", (0 if np.isnan(value) else value, y),
                    fontsize=7, xytext=(3, -3), textcoords="offset points")
    ax.set_yticks(ypos, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("J / correct answer (lower is better)")
    ax.set_title("Energy per correct answer", fontsize=10)
    ax.grid(True, axis="x", alpha=0.3)
