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

from sweeper.analysis.tables import ok_trials
from sweeper.core.axes import AXES

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd
    from matplotlib.figure import Figure

# Columns that identify a line of a per-configuration plot (batch size is the x axis);
# option variants (eager / compiled) and tensor parallelism are lines of their own.
UNSTABLE_NOTE = "hollow markers: unstable trials"
_PHASE_COLOURS = {"prefill": "tab:orange", "decode": "tab:blue"}


class PlotUnavailable(Exception):
    """The data a plot needs is absent or all null; the message says which."""


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


def _usable(df: pd.DataFrame, *columns: str) -> bool:
    return all(c in df.columns and df[c].notna().any() for c in columns)


def require(df: pd.DataFrame, columns: tuple[str, ...], why: str) -> None:
    missing = [c for c in columns if c not in df.columns or not df[c].notna().any()]
    if missing:
        raise PlotUnavailable(f"{', '.join(missing)} missing or all null ({why})")


def _plottable(trials: pd.DataFrame) -> pd.DataFrame:
    """The ok trials, or PlotUnavailable when there is none (every trial failed or was skipped)."""
    df = ok_trials(trials)
    if df.empty:
        raise PlotUnavailable("no ok trials (see the failed and skipped trials)")
    return df


def _varies(df: pd.DataFrame, column: str) -> bool:
    return column in df.columns and df[column].nunique(dropna=False) > 1


def series_label(row: Any, df: pd.DataFrame, with_model: bool = False) -> str:
    """A short label naming only the axes that vary in ``df``."""
    parts = [str(row["model"])] if with_model else []
    if _varies(df, "backend"):
        parts.append(str(row["backend"]))
    parts.append(str(row["precision"]))
    if _varies(df, "backend_options") or _varies(df, "tensor_parallel"):
        from sweeper.core.trial import variant_label

        tp = row.get("tensor_parallel")
        variant = variant_label(str(row["backend"]), row.get("backend_options"),
                                int(tp) if tp is not None and tp == tp else 1)
        if variant:
            parts.append(variant)
    if _varies(df, "input_len") or _varies(df, "output_len"):
        parts.append(f"in{row['input_len']}/out{row['output_len']}")
    return " ".join(parts)


def _scatter_marked(ax: Any, x: Any, y: Any, unstable: Any, colour: Any, marker: str = "o",
                    size: float = 36, label: str | None = None) -> None:
    """Filled markers for stable trials, hollow (hatched) ones for unstable trials."""
    stable = ~unstable
    if stable.any():
        ax.scatter(x[stable], y[stable], s=size, color=colour, marker=marker, zorder=3, label=label)
    if unstable.any():
        ax.scatter(x[unstable], y[unstable], s=size * 1.6, facecolors="none", edgecolors=colour,
                   hatch="////", linewidths=1.4, marker=marker, zorder=3,
                   label=None if stable.any() else label)


def _log_if_wide(ax: Any, values: Any, axis: str) -> None:
    """Log scale when the values span more than ~a decade, ticks as plain numbers (0.1, not 10^-1)."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    values = values[values > 0]
    if len(values) and values.max() / values.min() > 20:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
        target = ax.yaxis if axis == "y" else ax.xaxis
        target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        target.set_minor_formatter(NullFormatter())


def _batch_axis(ax: Any, batches: Any) -> None:
    batches = sorted({int(b) for b in batches})
    if len(batches) > 1 and batches[-1] / max(batches[0], 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")


def _model_axes(fig: Figure, models: list[str]) -> list[Any]:
    n = len(models)
    cols = min(n, 3)
    rows = -(-n // cols)
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[n:]:
        ax.set_visible(False)
    return list(axes[:n])


# -- per-configuration lines over batch size ----------------------------------------


def _per_batch(trials: pd.DataFrame, column: str, ylabel: str, title: str, why: str) -> Figure:
    df = _plottable(trials)
    require(df, (column, "batch_size"), why)
    df = df[df[column].notna()]
    models = sorted(df["model"].unique())
    cols = min(len(models), 3)
    fig = new_figure(max(6.0, 4.6 * cols), 3.6 * -(-len(models) // cols) + 0.5)
    for ax, model in zip(_model_axes(fig, models), models, strict=True):
        mdf = df[df["model"] == model]
        keys = [k for k in (*AXES.series_columns(), *AXES.shape_columns()) if k in mdf.columns]
        for i, (_, g) in enumerate(mdf.groupby(keys, sort=True, dropna=False)):
            colour = f"C{i % 10}"
            g = g.sort_values("batch_size")
            mean = g.groupby("batch_size")[column].mean()  # repeats: the line goes through their mean
            ax.plot(mean.index, mean.values, color=colour, lw=1.5, label=series_label(g.iloc[0], df))
            _scatter_marked(ax, g["batch_size"].to_numpy(), g[column].to_numpy(),
                            g["unstable"].to_numpy(), colour)
        _batch_axis(ax, mdf["batch_size"])
        _log_if_wide(ax, mdf[column], "y")
        ax.set_title(model, fontsize=10)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    suptitle = title + (f"\n{UNSTABLE_NOTE}" if df["unstable"].any() else "")
    fig.suptitle(suptitle, fontsize=11)
    return fig


def plot_throughput(trials: pd.DataFrame) -> Figure:
    """Output tokens per second against batch size, one line per (backend, precision, shape)."""
    return _per_batch(trials, "throughput_tok_s", "output tokens / s", "Throughput vs batch size",
                      "no throughput measured")


def plot_energy_per_token(trials: pd.DataFrame) -> Figure:
    """Joules per output token against batch size."""
    return _per_batch(trials, "energy_per_token_j", "J / output token", "Energy per token vs batch size",
                      "no energy measured: CPU-only run?")


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


def plot_pareto(trials: pd.DataFrame, latencies: tuple[str, ...] = ("tpot_s", "ttft_s")) -> Figure:
    """Latency (ms) against J/token per model; the non-dominated trials are joined and labelled.

    The frontier is per model: a smaller model is usually cheaper and faster, so
    a frontier across models would only ever show the smallest one.
    """
    df = _plottable(trials)
    require(df, ("energy_per_token_j",), "no energy measured: CPU-only run?")
    latencies = tuple(lat for lat in latencies if _usable(df, lat))
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
                _scatter_marked(ax, p["energy_per_token_j"].to_numpy(), p[latency].to_numpy() * 1e3,
                                p["unstable"].to_numpy(), colour, marker=marker,
                                label=f"{model} {precision}")
            on = g[g["on_frontier"]].sort_values("energy_per_token_j")
            ax.step(on["energy_per_token_j"], on[latency] * 1e3, where="post", color=colour,
                    lw=1.2, alpha=0.7)
            for k, (_, row) in enumerate(on.iterrows()):
                ax.annotate(f"{series_label(row, df)} bs={row['batch_size']}",
                            (row["energy_per_token_j"], row[latency] * 1e3), fontsize=7,
                            xytext=(5, 4 if k % 2 == 0 else -10), textcoords="offset points")
        _log_if_wide(ax, front["energy_per_token_j"], "x")
        _log_if_wide(ax, front[latency], "y")
        ax.margins(x=0.1)  # room for the labels of the points at the edges
        name = "TPOT" if latency.startswith("tpot") else "TTFT" if latency.startswith("ttft") else latency
        ax.set_xlabel("J / output token (lower is better)")
        ax.set_ylabel(f"{name} ms (lower is better)")
        ax.set_title(f"{name} vs energy per token", fontsize=10)
        ax.grid(True, alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="best")
    note = "lines join each model's non-dominated trials (labelled)"
    if df["unstable"].any():
        note += f"; {UNSTABLE_NOTE}"
    fig.suptitle(f"Pareto frontier: latency against energy\n{note}", fontsize=11)
    return fig


# -- memory, fidelity --------------------------------------------------------------------


def plot_weight_memory(trials: pd.DataFrame) -> Figure:
    """Model weight footprint per precision, grouped by model."""
    import numpy as np

    df = _plottable(trials)
    require(df, ("weight_memory_bytes",), "no weight memory recorded")
    df = df[df["weight_memory_bytes"].notna()]
    table = df.groupby(["model", "precision"])["weight_memory_bytes"].max().unstack("precision")
    unit, scale = ("GiB", 2**30) if table.max().max() >= 2**30 else ("MiB", 2**20)
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
    ax.set_ylabel(f"weight memory ({unit})")
    ax.set_title("Weight memory per precision", fontsize=11)
    ax.legend(fontsize=8, title="precision", title_fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def plot_fidelity(trials: pd.DataFrame) -> Figure:
    """Fidelity (KL divergence to the reference precision) against J/token."""
    df = _plottable(trials)
    if "fidelity_kl" not in df.columns or df["fidelity_kl"].isna().all():
        raise PlotUnavailable("no fidelity_kl values in trials.parquet (no fidelity measured)")
    require(df, ("fidelity_kl", "energy_per_token_j"), "both are needed")
    df = df[df["fidelity_kl"].notna() & df["energy_per_token_j"].notna()]
    fig = new_figure(6.4, 4.6)
    ax = fig.subplots()
    for m, (model, g) in enumerate(df.groupby("model", sort=True)):
        colour = f"C{m % 10}"
        _scatter_marked(ax, g["energy_per_token_j"].to_numpy(), g["fidelity_kl"].to_numpy(),
                        g["unstable"].to_numpy(), colour, label=model)
        for _, row in g.iterrows():
            ax.annotate(f"{row['precision']} bs={row['batch_size']}",
                        (row["energy_per_token_j"], row["fidelity_kl"]), fontsize=7,
                        xytext=(4, 3), textcoords="offset points")
    _log_if_wide(ax, df["energy_per_token_j"], "x")
    if (df["fidelity_kl"] > 0).all():  # a log axis would hide exact zeros (identical outputs)
        _log_if_wide(ax, df["fidelity_kl"], "y")
    ax.set_xlabel("J / output token")
    ax.set_ylabel("KL divergence to reference (lower is better)")
    ax.set_title("Fidelity vs energy per token", fontsize=11)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
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
        colour = _PHASE_COLOURS.get(phase, "tab:gray")
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
                  f"bs={trial.get('batch_size')} ({trial.get('trial_id')})")
    ax.set_xlabel("s from the start of the measured window (dashed: window)")
    ax.set_ylabel("power (W)")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return fig


def layer_shares(layers: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Per module type and phase: the share of energy (or of GPU time when no energy was measured)."""
    value = "energy_j" if _usable(layers, "energy_j") else "gpu_time_s"
    require(layers, (value,), "nothing to share out")
    df = layers.copy()
    df["phase"] = df["phase"].fillna("all") if "phase" in df.columns else "all"
    df["module_type"] = df["module_type"].fillna(df["module"]) if "module_type" in df.columns else df["module"]
    shares = df.pivot_table(index="module_type", columns="phase", values=value, aggfunc="sum", fill_value=0.0)
    shares = shares / shares.to_numpy().sum()
    shares = shares.loc[shares.sum(axis=1).sort_values().index]
    return shares, value


def plot_layer_shares(layers: pd.DataFrame, trial_id: str | None = None) -> Figure:
    """Energy share per module type (stacked by phase) and energy per decoder layer.

    Without energy (CPU runs profile with the host clock) the shares are of time, and say so.
    """
    if layers is None or layers.empty:
        raise PlotUnavailable("no layers.parquet (the sweep did not profile layers)")
    shares, value = layer_shares(layers)
    energy = value == "energy_j"
    what = "energy" if energy else "time"
    has_index = _usable(layers, "layer_index")
    fig = new_figure(11.0 if has_index else 6.5, max(3.0, 0.35 * len(shares) + 1.5))
    axes = fig.subplots(1, 2 if has_index else 1, squeeze=False).ravel()
    ax = axes[0]
    left = None
    for phase in shares.columns:
        values = shares[phase].to_numpy() * 100
        ax.barh(shares.index, values, left=left, color=_PHASE_COLOURS.get(phase, "tab:gray"), label=phase)
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
        ax2.set_title(f"{what.capitalize()} per decoder layer (should be near equal)", fontsize=10)
        ax2.grid(True, axis="y", alpha=0.3)
    fig.suptitle("Layer profile" + (f" of trial {trial_id}" if trial_id else ""), fontsize=11)
    return fig
