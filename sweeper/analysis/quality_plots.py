"""The report's quality figure: what each precision keeps of the model (KL and top-1 agreement
to the reference, perplexity on the bundled text) against what it costs (J per output token,
J per response).

One point per configuration of weights (model, backend and its options, precision): quality
is measured once per loaded model, energy per trial, so a point sits at the configuration's
most efficient trial with a bar to its least efficient. J per response is the mean energy of
a request, which with natural reply lengths is what a user pays per answer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from sweeper.analysis.plot_kit import (
    PlotNotApplicable,
    PlotUnavailable,
    log_if_wide,
    new_figure,
    plottable,
    scatter_marked,
    series_label,
)
from sweeper.core.axes import AXES

if TYPE_CHECKING:
    import pandas as pd
    from matplotlib.figure import Figure

# (column, axis label) of each quality measure, drawn where a sweep measured it.
QUALITY = (
    ("fidelity_kl", "KL to reference (nats, lower is better)"),
    ("fidelity_top1", "top-1 agreement with reference"),
    ("perplexity", "perplexity, bundled text (lower is better)"),
)
ENERGY = (("energy_per_token_j", "J / output token"), ("energy_per_request_j", "J / response"))
MARKERS = "osD^v<>pPX*"


def plot_quality(trials: pd.DataFrame) -> Figure:
    df = plottable(trials)
    measures = [(c, label) for c, label in QUALITY if c in df.columns and df[c].notna().any()]
    if not measures or not any(c == "perplexity" or c == "fidelity_top1" for c, _ in measures):
        raise PlotNotApplicable("no perplexity or top-1 agreement measured (fidelity.perplexity, fidelity)")
    energies = [(c, label) for c, label in ENERGY if c in df.columns and df[c].notna().any()]
    if not energies:
        raise PlotUnavailable("quality was measured, but no GPU energy (a CPU-only run): nothing to draw it against")
    keys = ["model", *[k for k in AXES.series_columns() if k in df.columns]]
    groups = list(df.groupby(keys, sort=True, dropna=False))
    fig = new_figure(4.8 * len(energies) + 2.8, 3.0 * len(measures) + 0.6)
    axes = np.atleast_2d(fig.subplots(len(measures), len(energies), squeeze=False))
    models = sorted(df["model"].unique())
    for row, (measure, measure_label) in enumerate(measures):
        for col, (energy, energy_label) in enumerate(energies):
            ax = axes[row, col]
            _draw_configurations(ax, groups, df, models, measure, energy)
            log_if_wide(ax, df[energy].dropna(), "x")
            if measure != "fidelity_top1" and (df[measure].dropna() > 0).all():
                log_if_wide(ax, df[measure].dropna(), "y")
            ax.set_xlabel(energy_label, fontsize=8)
            ax.set_ylabel(measure_label, fontsize=8)
            ax.grid(True, alpha=0.3)
    fig.suptitle("Quality vs energy, per precision (point: best trial; bar: range over trials)", fontsize=11)
    _figure_legend(fig, axes)
    return fig


def _draw_configurations(ax: Any, groups: list[tuple[Any, pd.DataFrame]], df: pd.DataFrame, models: list[str],
                         measure: str, energy: str) -> None:
    """Each configuration's quality (its median) at its lowest energy, a bar over its range."""
    for k, (_, g) in enumerate(groups):
        g = g[g[energy].notna()]
        quality = g[measure].dropna()
        if g.empty or quality.empty:
            continue
        y = float(quality.median())
        low, high = float(g[energy].min()), float(g[energy].max())
        colour = f"C{models.index(g['model'].iloc[0]) % 10}"
        if high > low:
            ax.hlines(y, low, high, color=colour, lw=1.0, alpha=0.6)
        name = series_label(g.iloc[0], df, with_model=True)
        scatter_marked(ax, np.asarray([low]), np.asarray([y]), np.asarray([bool(g["unstable"].any())]),
                       colour, marker=MARKERS[k % len(MARKERS)], series=name, label=name)


def _figure_legend(fig: Figure, axes: Any) -> None:
    """One legend for the figure, each configuration once (the reference has no KL panel point),
    outside the panels: constrained layout keeps it inside the saved image."""
    legend: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), fontsize=7, loc="outside right upper")
