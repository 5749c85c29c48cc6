"""The report's serving-mode figures: latency against achieved throughput, energy per
token and per request against the achieved rate with the saturation knee, goodput
against the offered rate, energy per request with prefix caching beside its hit rate.
One line per configuration (every axis but the request rate), one column of panels per
model; a saturated trial is drawn as an ``x``. Energy per conversation turn draws one
line per configuration at its rate, from requests.parquet (``Results.turn_energy``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sweeper.analysis.plot_kit import (
    UNSTABLE_NOTE,
    PlotNotApplicable,
    PlotUnavailable,
    load_label,
    log_if_wide,
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
    import textwrap

    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    # Notes wrapped to the figure's width (~13 characters an inch at 10 pt): one model's
    # column is 6 inches, narrower than a note, whose ends were cut off.
    chars = max(60, int(fig.get_figwidth() * 13))
    fig.suptitle(title + "".join("\n" + textwrap.fill(note, chars) for note in notes), fontsize=10)
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


def _rate_panel(ax: Any, mdf: pd.DataFrame, column: str, ylabel: str, scale: float = 1.0,
                energy: bool = True) -> None:
    """``column`` (times ``scale``) of each configuration of one model against its achieved
    request rate. ``energy``: mark each configuration's knee and go log over a wide span; a
    share (a hit rate) keeps its linear axis, where 0 % is a value to see."""
    for j, label, g in _series(mdf):
        g = g[g[column].notna()]
        if g.empty:
            continue
        colour = f"C{j % 10}"
        _draw(ax, g["achieved_rate_req_s"].to_numpy(dtype=float), g[column].to_numpy(dtype=float) * scale,
              g, colour, label)
        knee = knee_rate(g) if energy else None
        if knee is not None:
            ax.axvline(knee, color=colour, ls=":", lw=1.2, gid=f"knee {label}")
    ax.set_xlabel("achieved requests / s")
    ax.set_ylabel(ylabel)
    ax.set_title(str(mdf["model"].iloc[0]), fontsize=10)
    values = mdf[column].dropna().to_numpy(dtype=float)
    if energy and len(values) and values.min() > 0 and values.max() / values.min() > 20:
        set_log(ax, "y")


def plot_serving_energy(trials: pd.DataFrame) -> Figure:
    """J/token and J/request against the achieved request rate, the saturation knee marked."""
    df = serving_trials(trials)
    require(df, ("energy_per_token_j",), "no energy measured: CPU-only run?")
    fig, grid, models = _panels(df, 2)
    for c, model in enumerate(models):
        mdf = df[df["model"] == model]
        _rate_panel(grid[0][c], mdf, "energy_per_token_j", "J / output token")
        _rate_panel(grid[1][c], mdf, "energy_per_request_j", "J / request")
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


# -- prefix caching ------------------------------------------------------------------------


def caching_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The ok serving trials with a prefix-cache hit rate, of the models that have something to
    compare: two configurations or more (cache on and off, block sizes, engines) with a hit
    rate, one of them above 0. PlotNotApplicable where no model has."""
    df = serving_trials(trials)
    if "prefix_cache_hit_rate" not in df.columns:
        raise PlotNotApplicable("no prefix_cache_hit_rate column (results aggregated before it existed)")
    # A trial whose engine does not say what it took from its cache (null) cannot be placed on
    # the hit-rate axis: the comparison is between configurations that each report one.
    df = df[df["prefix_cache_hit_rate"].notna()]
    compared = [model for model, mdf in df.groupby("model", sort=True)
                if (mdf["prefix_cache_hit_rate"] > 0).any() and sum(1 for _ in _series(mdf)) > 1]
    if not compared:
        raise PlotNotApplicable("no model has two serving configurations with a prefix-cache hit rate, "
                                "one of them above 0")
    return df[df["model"].isin(compared)]


def plot_prefix_caching(trials: pd.DataFrame) -> Figure:
    """J/request against the achieved request rate, one line per configuration, above the
    share of prompt tokens each trial took from the prefix cache at the same rates."""
    df = caching_trials(trials)
    require(df, ("energy_per_request_j",), "no energy measured: CPU-only run?")
    fig, grid, models = _panels(df, 2)
    for c, model in enumerate(models):
        mdf = df[df["model"] == model]
        _rate_panel(grid[0][c], mdf, "energy_per_request_j", "J / request")
        _rate_panel(grid[1][c], mdf, "prefix_cache_hit_rate", "prefix-cache hit rate (%)", 100.0, energy=False)
        grid[1][c].set_ylim(-4.0, 104.0)
    return _finish(fig, grid, "Energy per request with prefix caching (serving)", [SATURATED_NOTE])


# -- energy per conversation turn ------------------------------------------------------------

TURN_NOTE = "x: a configuration with a saturated trial; hollow markers: one with an unstable trial"


def _any(g: pd.DataFrame, flag: str) -> bool:
    return flag in g.columns and bool(g[flag].fillna(False).astype(bool).any())


def turn_energy(trials: pd.DataFrame, turns: pd.DataFrame | None) -> pd.DataFrame:
    """The mean energy of a conversation's request at each turn, per configuration.

    ``turns``: ``Results.turn_energy()`` (per trial and turn, the requests measured and their
    energy summed). One row per model, configuration (every axis but the repeat: the
    repeats' requests are pooled, so each mean is over every request behind it) and turn:
    ``series`` (its label), ``colour`` (its index among the model's configurations), ``turn``,
    ``n_requests``, ``energy_per_request_j``, and whether a trial of the configuration was
    ``saturated`` or ``unstable``. A turn none of whose requests was measured has no row.
    PlotNotApplicable: no ok serving trial has a request that is a conversation's turn;
    PlotUnavailable: none of those requests has an attributed energy.
    """
    import pandas as pd

    if turns is None or turns.empty:
        raise PlotNotApplicable("no request is a turn of a conversation (requests.parquet turn)")
    df = serving_trials(trials)
    df = df[df["trial_id"].isin(set(turns["trial_id"]))]
    if df.empty:
        raise PlotNotApplicable("no ok serving trial replayed conversations")
    turns = turns[turns["trial_id"].isin(set(df["trial_id"]))]
    if not (turns["n_requests"] > 0).any():
        raise PlotUnavailable("no completed request of a conversation has an attributed energy in its trial's "
                              "steady window (no GPU energy measured: CPU-only run?)")
    keys = [k for k in AXES.config_columns() if k in df.columns and k != "model"]
    parts = []
    for model, mdf in df.groupby("model", sort=True):
        for j, (_, g) in enumerate(mdf.groupby(keys, sort=True, dropna=False)):
            per_turn = (turns[turns["trial_id"].isin(set(g["trial_id"]))]
                        .groupby("turn", sort=True)[["n_requests", "energy_sum_j"]].sum())
            per_turn = per_turn[per_turn["n_requests"] > 0]
            parts.append(pd.DataFrame({
                "model": model, "series": f"{series_label(g.iloc[0], mdf)} {load_label(g.iloc[0])}", "colour": j,
                "turn": per_turn.index.to_numpy(dtype="int64"),
                "n_requests": per_turn["n_requests"].to_numpy(dtype="int64"),
                "energy_per_request_j": (per_turn["energy_sum_j"] / per_turn["n_requests"]).to_numpy(dtype=float),
                "saturated": _any(g, "saturated"), "unstable": _any(g, "unstable")}))
    return pd.concat(parts, ignore_index=True)


def plot_energy_per_turn(trials: pd.DataFrame, turns: pd.DataFrame | None) -> Figure:
    """Mean J per request against the turn of a conversation (0: its first request), one line
    per configuration at its rate; below, how many requests each mean is over (later turns
    are reached by fewer conversations)."""
    from matplotlib.ticker import MaxNLocator

    data = turn_energy(trials, turns)
    fig, grid, models = _panels(data, 2)
    for c, model in enumerate(models):
        mdf = data[data["model"] == model]
        for (j, label), g in mdf.groupby(["colour", "series"], sort=True):
            x = g["turn"].to_numpy(dtype=float)
            _draw(grid[0][c], x, g["energy_per_request_j"].to_numpy(dtype=float), g, f"C{j % 10}", label)
            grid[1][c].plot(x, g["n_requests"].to_numpy(dtype=float), "o-", color=f"C{j % 10}", lw=1.0, ms=3,
                            label=label)
        for ax, ylabel in ((grid[0][c], "J / request (mean)"), (grid[1][c], "requests measured")):
            ax.set_xlabel("turn (0: a conversation's first request)")
            ax.set_ylabel(ylabel)
            ax.set_title(str(model), fontsize=10)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        grid[1][c].set_ylim(bottom=0)
        log_if_wide(grid[0][c], mdf["energy_per_request_j"], "y")
    return _finish(fig, grid, "Energy per request vs conversation turn (serving)", [TURN_NOTE])
