"""The report's plots: one function per plot, pandas in, matplotlib ``Figure`` out.

Each function either returns a figure or raises ``PlotUnavailable`` with a
one-line reason (a CPU run has no energy, a sweep without layer profiling has no
layers), so the report and the notebooks leave a plot out with a note instead of
crashing. matplotlib is imported inside the functions, and figures are drawn on
an explicit Agg canvas rather than through pyplot: importing ``sweeper`` stays
cheap and no global backend state is touched (a notebook's inline display still
works, it renders any ``Figure``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sweeper.analysis.plot_kit import (
    PHASE_COLOURS,
    UNSTABLE_NOTE,
    PlotNotApplicable,
    PlotUnavailable,
    arr,
    batch_axis,
    load_label,
    log_if_wide,
    new_figure,
    plottable,
    require,
    scatter_marked,
    series_label,
    set_log,
    try_plot,
    usable,
)
from sweeper.analysis.tables import ok_trials
from sweeper.core.axes import AXES

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd
    from matplotlib.figure import Figure

# The plots, and what a notebook or the report reaches through this module besides them.
__all__ = [
    "LAYER_CV_LIMIT",
    "PlotNotApplicable",
    "PlotUnavailable",
    "layer_shares",
    "layer_verdict",
    "pareto_frontier",
    "pareto_latencies",
    "pareto_mask",
    "phase_spans",
    "plot_energy_per_token",
    "plot_fidelity",
    "plot_latency",
    "plot_layer_shares",
    "plot_pareto",
    "plot_power_timeline",
    "plot_throughput",
    "plot_weight_memory",
    "try_plot",
]

# -- per-configuration lines over batch size ----------------------------------------


def _per_batch(trials: pd.DataFrame, panels: list[tuple[str, str, float]], title: str, why: str) -> Figure:
    """One row of panels per metric ``(column, ylabel, scale)``, one column per model.

    Each series (backend, precision, variant, shape) gets one point per batch size:
    the median of its repeats, with a whisker over their range when there are
    several. A metric's panels share one scale (all log or all linear), decided
    from every model's values, so panels read alike.
    """
    df = _batched(trials, [c for c, _, _ in panels], why)
    panels = [p for p in panels if usable(df, p[0])]
    models = sorted(df["model"].unique())
    cols = min(len(models), 3)
    model_rows = -(-len(models) // cols)
    fig = new_figure(max(6.0, 4.6 * cols), (3.6 * model_rows) * len(panels) + 0.5)
    grid = fig.subplots(model_rows * len(panels), cols, squeeze=False)
    any_unstable = False
    for r, (column, ylabel, scale) in enumerate(panels):
        data = df[df[column].notna()]
        wide = _spans_decades(data[column], scale)
        for i, model in enumerate(models):
            ax = grid[r * model_rows + i // cols][i % cols]
            mdf = data[data["model"] == model]
            any_unstable |= _draw_series(ax, mdf, df, column, scale)
            batch_axis(ax, mdf["batch_size"] if len(mdf) else df["batch_size"])
            if wide:
                set_log(ax, "y")
            else:
                ax.set_ylim(bottom=0)
            ax.set_title(model, fontsize=10)
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            if len(mdf):
                ax.legend(fontsize=8)
        for k in range(len(models), model_rows * cols):
            grid[r * model_rows + k // cols][k % cols].set_visible(False)
    notes = []
    if (df.groupby([k for k in (*AXES.series_columns(), *AXES.shape_columns(), "model", "batch_size")
                    if k in df.columns], dropna=False).size() > 1).any():
        notes.append("points: median of repeats, whiskers: their range")
    if any_unstable:
        notes.append(UNSTABLE_NOTE)
    fig.suptitle(title + ("\n" + "; ".join(notes) if notes else ""), fontsize=11)
    return fig


def _batched(trials: pd.DataFrame, columns: list[str], why: str) -> pd.DataFrame:
    """The plottable offline trials (with a batch size); PlotNotApplicable for a serving sweep."""
    df = plottable(trials)
    if "mode" in df.columns and (df["mode"] == "serving").all():
        raise PlotNotApplicable("a serving sweep has no batch sizes (its trials are drawn against the request rate)")
    df = df[df["batch_size"].notna()] if "batch_size" in df.columns else df
    require(df, ("batch_size",), why)
    if not any(usable(df, c) for c in columns):
        require(df, tuple(columns), why)
    return df


def _spans_decades(values: pd.Series, scale: float) -> bool:
    """Whether a metric's positive values span more than 20x: its panels then share a log scale."""
    import numpy as np

    positive = values.to_numpy(dtype=float) * scale
    positive = positive[np.isfinite(positive) & (positive > 0)]
    return len(positive) > 0 and positive.max() / positive.min() > 20


def _draw_series(ax: Any, mdf: pd.DataFrame, df: pd.DataFrame, column: str, scale: float) -> bool:
    """One model's series on ``ax``: medians over repeats, whiskers over their range, unstable
    points marked; returns whether any point was unstable."""
    any_unstable = False
    keys = [k for k in (*AXES.series_columns(), *AXES.shape_columns()) if k in mdf.columns]
    for j, (_, g) in enumerate(mdf.groupby(keys, sort=True, dropna=False)):
        colour = f"C{j % 10}"
        per_batch = g.groupby("batch_size")
        median = per_batch[column].median() * scale
        low, high = per_batch[column].min() * scale, per_batch[column].max() * scale
        unstable = per_batch["unstable"].any()
        any_unstable |= bool(unstable.any())
        x = median.index.to_numpy()
        name = series_label(g.iloc[0], df)
        ax.plot(x, median.to_numpy(), color=colour, lw=1.5, label=name)
        repeated = (per_batch.size() > 1).to_numpy()
        if repeated.any():
            ax.vlines(x[repeated], low.to_numpy()[repeated], high.to_numpy()[repeated],
                      color=colour, lw=1.0, alpha=0.8)
        scatter_marked(ax, x, median.to_numpy(), unstable.to_numpy(), colour, series=name)
    return any_unstable


def plot_throughput(trials: pd.DataFrame) -> Figure:
    """Output tokens per second against batch size, one line per (backend, precision, shape)."""
    return _per_batch(trials, [("throughput_tok_s", "output tokens / s", 1.0)], "Throughput vs batch size",
                      "no throughput measured")


def plot_energy_per_token(trials: pd.DataFrame) -> Figure:
    """Joules per output token against batch size."""
    return _per_batch(trials, [("energy_per_token_j", "J / output token", 1.0)],
                      "Energy per token vs batch size", "no energy measured: CPU-only run?")


def plot_latency(trials: pd.DataFrame) -> Figure:
    """Time to first token and time per output token (ms) against batch size: on every device."""
    return _per_batch(trials, [("ttft_s", "TTFT (ms)", 1e3), ("tpot_s", "TPOT (ms)", 1e3)],
                      "Latency vs batch size", "no latency measured")


# -- Pareto frontier ---------------------------------------------------------------------


def pareto_mask(x: Any, y: Any) -> Any:
    """Boolean mask of the points no other point beats on both x and y (both minimised).

    A point is dominated when another is at least as good on both axes and
    strictly better on one; exact duplicates of a frontier point stay on it.
    """
    import numpy as np

    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.zeros(len(x), dtype=bool)
    order = np.lexsort((y, x))  # by x, then y
    best_y = np.inf
    last = (np.nan, np.nan)
    for i in order:
        if y[i] < best_y or (x[i], y[i]) == last:
            keep[i] = True
            best_y = min(best_y, y[i])
            last = (x[i], y[i])
    return keep


def pareto_frontier(trials: pd.DataFrame, latency: str = "tpot_s") -> pd.DataFrame:
    """The ok trials with energy and ``latency``, with an ``on_frontier`` column per model."""
    df = ok_trials(trials)
    df = df[df["energy_per_token_j"].notna() & df[latency].notna()].copy()
    df["on_frontier"] = False
    for _, g in df.groupby("model"):
        df.loc[g.index, "on_frontier"] = pareto_mask(g["energy_per_token_j"], g[latency])
    return df


def pareto_latencies(trials: pd.DataFrame, latencies: tuple[str, ...] = ("tpot_s", "ttft_s"),
                     percentile: int = 99) -> tuple[str, ...]:
    """The latency columns the Pareto plot draws: the means (``tpot_s``, ``ttft_s``), or, where
    any trial is a serving one, each at ``percentile`` (``tpot_p99_s``), the statistic the
    report's SLO bounds (--slo-percentile) judge by: a serving configuration is chosen for
    its tail, and offline trials beside it are read at the same percentile."""
    from sweeper.analysis.tables import STATISTICS

    statistic = f"p{percentile}"
    if statistic not in STATISTICS:
        raise ValueError(f"percentile must be one of 50, 90, 99, got {percentile}")
    if "mode" not in trials.columns or not (trials["mode"] == "serving").any():
        return latencies
    return tuple(f"{lat[:-2]}_{statistic}_s" if lat in ("tpot_s", "ttft_s") else lat for lat in latencies)


def _latency_name(column: str) -> str:
    """An axis' name for a latency column: ``TPOT`` (tpot_s), ``p99 TTFT`` (ttft_p99_s)."""
    metric, _, statistic = column.removesuffix("_s").partition("_")
    if metric not in ("tpot", "ttft"):
        return column
    return f"{statistic} {metric.upper()}" if statistic else metric.upper()


def plot_pareto(trials: pd.DataFrame, latencies: tuple[str, ...] = ("tpot_s", "ttft_s"),
                percentile: int = 99) -> Figure:
    """Latency (ms) against J/token per model; the non-dominated trials are joined and labelled
    with what loads them (``bs=8``, or ``rate=24/s`` in serving mode).

    The frontier is per model: a smaller model is usually cheaper and faster, so
    a frontier across models would only ever show the smallest one. With serving
    trials, latency is read at ``percentile`` (``pareto_latencies``), as the report's
    SLO bounds read it.
    """
    df = plottable(trials)
    require(df, ("energy_per_token_j",), "no energy measured: CPU-only run?")
    latencies = tuple(lat for lat in pareto_latencies(df, latencies, percentile) if usable(df, lat))
    if not latencies:
        raise PlotUnavailable("no TPOT or TTFT measured")
    markers = "osD^v<>pPX*"
    precisions = sorted(df["precision"].dropna().unique())
    fig = new_figure(6.2 * len(latencies), 4.8)
    axes = fig.subplots(1, len(latencies), squeeze=False).ravel()
    for ax, latency in zip(axes, latencies, strict=True):
        front = pareto_frontier(df, latency)
        for m, (model, g) in enumerate(front.groupby("model", sort=True)):
            colour = f"C{m % 10}"
            for precision, p in g.groupby("precision"):
                marker = markers[precisions.index(precision) % len(markers)]
                scatter_marked(ax, p["energy_per_token_j"].to_numpy(), p[latency].to_numpy() * 1e3,
                                p["unstable"].to_numpy(), colour, marker=marker,
                                label=f"{model} {precision}")
            on = g[g["on_frontier"]].sort_values("energy_per_token_j")
            ax.step(on["energy_per_token_j"], on[latency] * 1e3, where="post", color=colour,
                    lw=1.2, alpha=0.7)
            for k, (_, row) in enumerate(on.iterrows()):
                ax.annotate(f"{series_label(row, df)} {load_label(row)}".strip(),
                            (row["energy_per_token_j"], row[latency] * 1e3), fontsize=7,
                            xytext=(5, 4 if k % 2 == 0 else -10), textcoords="offset points")
        log_if_wide(ax, front["energy_per_token_j"], "x")
        log_if_wide(ax, front[latency], "y")
        ax.margins(x=0.1)  # room for the labels of the points at the edges
        name = _latency_name(latency)
        ax.set_xlabel("J / output token (lower is better)")
        ax.set_ylabel(f"{name} ms (lower is better)")
        ax.set_title(f"{name} vs energy per token", fontsize=10)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    note = "lines join each model's non-dominated trials (labelled)"
    if any(lat.endswith(f"_p{percentile}_s") for lat in latencies):
        note += f"; serving trials: latency at p{percentile}, as the SLO bounds read it"
    if df["unstable"].any():
        note += f"; {UNSTABLE_NOTE}"
    fig.suptitle(f"Pareto frontier: latency against energy\n{note}", fontsize=11)
    return fig


# -- memory, fidelity --------------------------------------------------------------------


def plot_weight_memory(trials: pd.DataFrame) -> Figure:
    """Model weight footprint per precision, grouped by model (in the report tables' unit)."""
    import numpy as np

    from sweeper.analysis.tables import memory_unit

    df = plottable(trials)
    require(df, ("weight_memory_bytes",), "no weight memory recorded")
    df = df[df["weight_memory_bytes"].notna()]
    if not (df["weight_memory_bytes"] > 0).any():
        raise PlotUnavailable("every weight_memory_bytes is 0 (the backend holds no weights, e.g. noop)")
    table = df.groupby(["model", "precision"])["weight_memory_bytes"].max().unstack("precision")
    unit, scale = memory_unit(df["weight_memory_bytes"])
    table = table / scale
    models, precisions = list(table.index), list(table.columns)
    fig = new_figure(max(5.0, 1.2 + 1.1 * len(models) * max(len(precisions), 1) * 0.6), 3.8)
    ax = fig.subplots()
    width = 0.8 / len(precisions)
    x = np.arange(len(models))
    for i, precision in enumerate(precisions):
        values = table[precision].to_numpy()
        bars = ax.bar(x + (i - (len(precisions) - 1) / 2) * width, np.nan_to_num(values), width,
                      label=precision, color=f"C{i % 10}")
        ax.bar_label(bars, labels=["" if np.isnan(v) else f"{v:.3g}" for v in values], fontsize=7)
    ax.set_xticks(x, models)
    ax.set_ylim(bottom=0)
    ax.margins(y=0.12)  # room for the bar labels
    ax.set_ylabel(f"weight memory ({unit})")
    ax.set_title("Weight memory per precision", fontsize=11)
    ax.legend(fontsize=8, title="precision", title_fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def plot_fidelity(trials: pd.DataFrame) -> Figure:
    """Fidelity (KL divergence to the reference precision) against J/token.

    Fidelity is measured once per configuration of weights (model, backend,
    precision, variant), not per batch size: each is one point, at the J/token
    of its most efficient batch size, with a bar to its least efficient one.
    Points are named in the legend, not by annotations that could overlap.
    """
    df = plottable(trials)
    if "fidelity_kl" not in df.columns or df["fidelity_kl"].isna().all():
        raise PlotUnavailable("no fidelity_kl values in trials.parquet (no fidelity measured)")
    require(df, ("fidelity_kl", "energy_per_token_j"), "both are needed")
    df = df[df["fidelity_kl"].notna() & df["energy_per_token_j"].notna()]
    keys = ["model", *[k for k in AXES.series_columns() if k in df.columns]]
    markers = "osD^v<>pPX*"
    fig = new_figure(7.4, 4.6)
    ax = fig.subplots()
    for m, (_, mdf) in enumerate(df.groupby("model", sort=True)):
        for k, (_, g) in enumerate(mdf.groupby(keys, sort=True, dropna=False)):
            kl = float(g["fidelity_kl"].median())
            low, high = float(g["energy_per_token_j"].min()), float(g["energy_per_token_j"].max())
            colour, marker = f"C{m % 10}", markers[k % len(markers)]
            if high > low:
                ax.hlines(kl, low, high, color=colour, lw=1.0, alpha=0.6)
            scatter_marked(ax, arr([low]), arr([kl]), arr([bool(g["unstable"].any())]), colour,
                            marker=marker, label=series_label(g.iloc[0], df, with_model=True))
    log_if_wide(ax, df["energy_per_token_j"], "x")
    if (df["fidelity_kl"] > 0).all():  # a log axis would hide exact zeros (identical outputs)
        log_if_wide(ax, df["fidelity_kl"], "y")
    ax.set_xlabel("J / output token (point: best batch size; bar: range over batch sizes)")
    ax.set_ylabel("KL divergence to reference (lower is better)")
    ax.set_title("Fidelity vs energy per token", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


# -- timeline and layers -------------------------------------------------------------------


def phase_spans(timeline: pd.DataFrame) -> list[tuple[str, float, float]]:
    """Contiguous runs of one phase as (phase, start_s, end_s), read from the samples' ``phase``.

    A run lasts from its first sample to the next sample of another phase (or
    its own last sample): samples are the only evidence of where a phase is.
    """
    if "phase" not in timeline.columns:
        return []
    per_t = (timeline.sort_values("t_s").groupby("t_s", sort=True)["phase"]
             .agg(lambda s: s.dropna().iloc[0] if s.notna().any() else None))
    spans: list[tuple[str, float, float]] = []
    # pandas turns the None of an all-null group into NaN: normalise to None.
    times, phases = list(per_t.index), [p if isinstance(p, str) else None for p in per_t.values]
    start: int | None = None  # index of the current run's first sample
    start_phase = ""
    for i, (t, phase) in enumerate(zip(times, phases, strict=True)):
        if start is not None and phase != start_phase:
            spans.append((start_phase, times[start], t))
            start = None
        if start is None and phase is not None:
            start, start_phase = i, phase
    if start is not None and times[start] < times[-1]:
        spans.append((start_phase, times[start], times[-1]))
    return spans


def plot_power_timeline(timeline: pd.DataFrame, trial: dict[str, Any] | None = None) -> Figure:
    """Power over time of one trial, per GPU (and their sum), prefill/decode shaded.

    ``timeline`` holds that trial's samples only; ``trial`` is its trials row
    (for the title and the measured window's end).
    """
    if timeline is None or timeline.empty:
        raise PlotUnavailable("no timeline samples for this trial")
    require(timeline, ("t_s", "power_w"), "no power sampled")
    tl = timeline[timeline["power_w"].notna()].sort_values("t_s")
    fig = new_figure(10.0, 4.0)
    ax = fig.subplots()
    gpus = sorted(tl["gpu_index"].dropna().unique()) if "gpu_index" in tl.columns else []
    for i, gpu in enumerate(gpus):
        g = tl[tl["gpu_index"] == gpu]
        ax.plot(g["t_s"], g["power_w"], lw=1.0, color=f"C{(i + 2) % 10}", label=f"GPU {int(gpu)}")
    if len(gpus) != 1:
        total = tl.groupby("t_s")["power_w"].sum()
        ax.plot(total.index, total.values, lw=1.4, color="black", label="total")
    seen = set()
    for phase, start, end in phase_spans(tl):
        colour = PHASE_COLOURS.get(phase, "tab:gray")
        ax.axvspan(start, end, color=colour, alpha=0.18, lw=0, label=None if phase in seen else phase)
        seen.add(phase)
    ax.axvline(0.0, color="gray", ls="--", lw=0.8)
    if tl["t_s"].min() < 0:
        ax.annotate("idle baseline", (tl["t_s"].min(), 0.02), xycoords=("data", "axes fraction"),
                    fontsize=7, color="gray")
    title = "Power timeline"
    if trial:
        duration = trial.get("duration_s")
        if duration is not None and duration == duration:  # not NaN
            ax.axvline(float(duration), color="gray", ls="--", lw=0.8)
        title += (f": {trial.get('model')} {trial.get('backend')}/{trial.get('precision')} "
                  f"{load_label(trial)} ({trial.get('trial_id')})")
    ax.set_xlabel("s from the start of the measured window (dashed: window)")
    ax.set_ylabel("power (W)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def layer_shares(layers: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Per module type and phase: the share of energy (or of GPU time when no energy was measured)."""
    value = "energy_j" if usable(layers, "energy_j") else "gpu_time_s"
    require(layers, (value,), "nothing to share out")
    df = layers.copy()
    df["phase"] = df["phase"].fillna("all") if "phase" in df.columns else "all"
    df["module_type"] = df["module_type"].fillna(df["module"]) if "module_type" in df.columns else df["module"]
    shares = df.pivot_table(index="module_type", columns="phase", values=value, aggfunc="sum", fill_value=0.0)
    shares = shares / shares.to_numpy().sum()
    shares = shares.loc[shares.sum(axis=1).sort_values().index]
    return shares, value


# Identical decoder blocks doing identical work: a spread beyond this is worth a look
# (a hook or timer attributing time to the wrong block, or a block that really differs).
LAYER_CV_LIMIT = 0.10


def layer_verdict(per_layer: Any) -> str:
    """Whether the decoder layers cost alike, measured: their coefficient of variation and
    the largest against the smallest."""
    import numpy as np

    values = np.asarray(per_layer, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) < 2 or values.mean() <= 0:
        return "one layer, nothing to compare"
    cv = values.std() / values.mean()
    spread = values.max() / values.min() if values.min() > 0 else float("inf")
    if cv <= LAYER_CV_LIMIT:
        return f"equal within CV {cv:.1%} (max/min {spread:.2f}), as identical blocks should be"
    return f"NOT equal: CV {cv:.1%} > {LAYER_CV_LIMIT:.0%}, max/min {spread:.2f}"


def plot_layer_shares(layers: pd.DataFrame, trial_id: str | None = None) -> Figure:
    """Energy share per module type (stacked by phase) and energy per decoder layer.

    Without energy (CPU runs profile with the host clock) the shares are of time, and say so.
    """
    if layers is None or layers.empty:
        raise PlotUnavailable("no layers.parquet (the sweep did not profile layers)")
    shares, value = layer_shares(layers)
    energy = value == "energy_j"
    what = "energy" if energy else "time"
    has_index = usable(layers, "layer_index")
    fig = new_figure(11.0 if has_index else 6.5, max(3.0, 0.35 * len(shares) + 1.5))
    axes = fig.subplots(1, 2 if has_index else 1, squeeze=False).ravel()
    ax = axes[0]
    left = None
    for phase in shares.columns:
        values = shares[phase].to_numpy() * 100
        ax.barh(shares.index, values, left=left, color=PHASE_COLOURS.get(phase, "tab:gray"), label=phase)
        left = values if left is None else left + values
    ax.set_xlabel(f"share of {what} (%)" + ("" if energy else ": gpu_time_s, no energy measured"))
    ax.set_title(f"{what.capitalize()} share per module type", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    if has_index:
        per_layer = layers[layers["layer_index"].notna()].groupby("layer_index")[value].sum()
        ax2 = axes[1]
        index = per_layer.index.astype(int)
        ax2.bar(index, per_layer.values * (1.0 if energy else 1e3), color="tab:green")
        ax2.set_xticks(index if len(index) <= 16 else index[:: -(-len(index) // 16)])
        ax2.set_xlabel("decoder layer")
        ax2.set_ylabel("energy (J)" if energy else "time (ms)")
        ax2.set_title(f"{what.capitalize()} per decoder layer: {layer_verdict(per_layer.to_numpy())}",
                      fontsize=10)
        ax2.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Layer profile" + (f" of trial {trial_id}" if trial_id else ""), fontsize=11)
    return fig
