"""``sweeper report``: plots, a best-configuration table and the stability record of a results directory.

The report is built from the aggregated tables (``trials.parquet`` and, when
present, ``timeline.parquet``, ``layers.parquet`` and, for the energy per turn of
replayed conversations, the per-turn sums of ``requests.parquet``) into ``OUTPUT/report/``:
one PNG per plot and either a self-contained ``index.html`` (images embedded as
data URIs, so the file can be mailed or attached to a CI run) or ``report.md``
with the images beside it. A plot whose data is missing is replaced by a
one-line note; unstable trials are drawn hollow and listed, never dropped.

This module decides what goes on the page; the loading is in
``sweeper.analysis.results``, the tables in ``sweeper.analysis.tables``, the
plots in ``sweeper.analysis.plots`` and the HTML and Markdown in
``sweeper.analysis.render``. The notebooks call those modules directly.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from sweeper.analysis import (
    accuracy_plots,
    plots,
    quality_plots,
    search_plots,
    serving_plots,
    stage_plots,
)
from sweeper.analysis.figure_data import figure_data
from sweeper.analysis.render import Plot, Report, Table, render_html, render_markdown
from sweeper.analysis.results import (
    Results,
    add_budget_columns,
    load_results,
    report_settings,
    table_path,
)
from sweeper.analysis.tables import (
    LatencyBound,
    ReportError,
    best_configs,
    default_timeline_trial,
    latency_bounds,
    layers_trial,
    memory_unit,
    not_ok_trials,
    ok_trials,
    precision_summary,
    unstable_trials,
)
from sweeper.core.budget import BUDGET_COLUMNS, BudgetColumn
from sweeper.core.errors import ResultsError
from sweeper.core.settings import ReportSettings
from sweeper.core.status import Status

if TYPE_CHECKING:
    import pyarrow as pa

FORMATS = ("html", "md")
PLOT_FILES = ("throughput.png", "latency.png", "energy_per_token.png", "pareto.png", "serving_latency.png",
              "serving_energy.png", "goodput.png", "search.png", "energy_per_turn.png", "prefix_caching.png", "weight_memory.png",
              "fidelity.png", "quality.png", "accuracy.png", "power_timeline.png", "layer_shares.png", "stages.png")
# What ``--plots`` names a plot by: its file's name without the extension.
PLOT_NAMES = tuple(name.removesuffix(".png") for name in PLOT_FILES)


def figure_png(fig: Any, dpi: int = 110) -> bytes:
    """``fig`` as PNG at ``dpi``, drawn once and left drawn at that size (``figure_data``
    then reads that drawing rather than laying the figure out again).

    The same pixels as ``fig.savefig(dpi=dpi)``, which draws twice under constrained layout
    (once to lay out, once to render) and puts the figure back at its own dpi, so that reading
    its artists afterwards took a third drawing: two thirds of the report's time.
    """
    import io

    from matplotlib.image import imsave

    fig.set_dpi(dpi)
    fig.canvas.draw()
    buf = io.BytesIO()
    # What savefig's PNG writer does with the canvas once drawn.
    imsave(buf, fig.canvas.buffer_rgba(), format="png", origin="upper", dpi=dpi)
    return buf.getvalue()


def _fmt(value: Any, digits: int = 4) -> str:
    import math

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else ""
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 10 ** digits else f"{value:,.0f}"
    try:
        import pandas as pd

        if value is pd.NA or value is pd.NaT:
            return ""
    except ImportError:  # pragma: no cover
        pass
    return str(value)


def _first_line(text: Any, limit: int = 200) -> str:
    text = _fmt(text).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _shape(input_len: Any, output_len: Any) -> str:
    if _fmt(input_len) == "":
        return ""
    return f"{int(input_len)}/{int(output_len)}"


def _load(row: Any) -> str:
    """What loads a configuration: its batch size (offline) or its request rate (serving)."""
    if _fmt(row.batch_size):
        return _fmt(row.batch_size)
    rate = getattr(row, "request_rate", None)
    if rate is None or rate != rate:
        return ""
    conc = getattr(row, "max_concurrency", None)
    return f"{rate:g}/s" + (f" c{int(conc)}" if conc is not None and conc == conc else "")


def _best_table(results: Results, bounds: Sequence[LatencyBound]) -> Table:
    judged = results.report
    best = best_configs(results.trials, bounds=bounds, criterion=judged.criterion, min_accuracy=judged.min_accuracy)
    shown = _BestColumns.of(results)
    rows = [shown.row(r, results.report) for r in best.itertuples()]
    aside = int(best["set_aside"].fillna(0).sum()) if len(best) else 0
    return Table("Best configuration per model", shown.headers(), rows, _best_caption(bounds, judged, aside, shown))


@dataclass(frozen=True)
class _BestColumns:
    """The best table's optional columns: those whose data the results hold."""

    priced: list[BudgetColumn]
    lateness: bool  # serving trials: the client's send lateness beside the TTFT it would distort
    scored: bool  # a scored sweep: accuracy and J per correct answer

    @classmethod
    def of(cls, results: Results) -> _BestColumns:
        trials = results.trials

        def has(column: str) -> bool:
            return column in trials and bool(trials[column].notna().any())

        return cls([c for c in BUDGET_COLUMNS if has(c.name)], has("send_lateness_p99_s"), has("accuracy"))

    def headers(self) -> list[str]:
        return ["model", "backend", "precision", "batch / rate", "in/out", "repeats", "tok/s", "TTFT ms",
                *(["late p99 ms"] if self.lateness else []), "TPOT ms", "J/token",
                *(["accuracy", "J/correct"] if self.scored else []), *[c.header for c in self.priced], "MBU",
                "criterion", "trial"]

    def row(self, r: Any, report: ReportSettings) -> list[str]:
        # A model with no precise trial says so: its best is the best of the unstable ones.
        flags = ((" ⚠ only unstable" if r.only_unstable is True else " ⚠ unstable" if r.unstable is True else "")
                 + (" ⚠ repeats disagree" if r.repeats_disagree is True else ""))
        return [_fmt(r.model), _fmt(r.backend), _fmt(r.precision), _load(r), _shape(r.input_len, r.output_len),
                _fmt(r.n_repeats), _with_interval(r.throughput_tok_s, r.throughput_lo, r.throughput_hi),
                _fmt(r.ttft_ms), *([_fmt(r.send_lateness_p99_ms, 3)] if self.lateness else []), _fmt(r.tpot_ms),
                _with_interval(r.energy_per_token_j, r.energy_per_token_lo, r.energy_per_token_hi),
                *([_fmt(r.accuracy, 3), _fmt(r.energy_per_correct_j)] if self.scored else []),
                *[_fmt(c.of(r.energy_per_token_j, report)) for c in self.priced],  # at the median J/token
                _fmt(r.mbu), _fmt(r.criterion) + flags, _fmt(r.trial_id)]


def _best_caption(bounds: Sequence[LatencyBound], judged: ReportSettings, aside: int, shown: _BestColumns) -> str:
    bound = ("under " + " and ".join(str(b) for b in bounds) if bounds
             else "no latency bound (--max-tpot-ms / --max-ttft-ms, or --slo-ttft-ms / --slo-tpot-ms at a percentile)")
    if judged.min_accuracy is not None:
        bound += f"; accuracy at least {judged.min_accuracy:g} (--min-accuracy)"
    if aside:
        bound += (f"; {aside} unstable configuration{'s' if aside > 1 else ''} set aside (chosen only among those "
                  "whose estimate met its bound, where a model has any)")
    return (f"{bound}; each configuration's figures are the medians of its repeats, [95 % interval] where "
            "it has several (a bootstrap of the median); the trial is the repeat nearest the median; TTFT and "
            "TPOT are means"
            + ("; late p99: how late the client sent its requests (p99 of send_lateness_s; above the larger of 5 ms "
               "and 10 % of TTFT p50 the trial is unstable, client_behind)" if shown.lateness else ""))


def _with_interval(value: Any, lo: Any, hi: Any) -> str:
    text = _fmt(value)
    if text and _fmt(lo) and _fmt(hi):
        text += f" [{_fmt(lo)}–{_fmt(hi)}]"
    return text


def best_table(root: str | os.PathLike) -> Table:
    """The best ok trial per model of a results directory, read from its aggregated tables."""
    return _best_table(load_results(root), [])


def best_table_of(trials: pa.Table, root: str, report: ReportSettings) -> Table:
    """The same from a trials table already in memory: what ``sweeper run`` prints at its end,
    from the table its aggregation has just written (not read back)."""
    return _best_table(Results(Path(root), add_budget_columns(trials.to_pandas(), report), report=report), [])


def _tables(results: Results, bounds: Sequence[LatencyBound]) -> list[Table]:
    trials = results.trials
    tables = [_best_table(results, bounds)]
    precisions = precision_summary(trials)
    unit, scale = memory_unit(ok_trials(trials)["weight_memory_bytes"]) if "weight_memory_bytes" in trials else ("GB", 1e9)
    if not precisions.empty:
        tables.append(Table(
            "Precisions against the reference",
            ["model", "backend", "precision", f"weights {unit}", "weights × ref", "J/token × ref",
             "tok/s × ref", "KL to ref", "top-1 vs ref", "best MBU"],
            [[_fmt(r.model), _fmt(r.backend), _fmt(r.precision) + (" (reference)" if r.precision == r.reference else ""),
              _fmt(None if r.weight_bytes is None else r.weight_bytes / scale, 3), _fmt(r.weight_vs_ref, 3), _fmt(r.energy_per_token_vs_ref, 3),
              _fmt(r.throughput_vs_ref, 3), _fmt(r.fidelity_kl, 3), _fmt(r.fidelity_top1, 3), _fmt(r.best_mbu, 3)]
             for r in precisions.itertuples()],
            "ratios are geometric means over the batch sizes and shapes both precisions ran; "
            "fidelity on random-weight presets is numerical deviation, not quality",
        ))
    unstable = unstable_trials(trials)
    tables.append(Table(
        f"Unstable trials ({len(unstable)})",
        ["trial", "model", "backend", "precision", "batch", "window s", "why"],
        [[_fmt(r.trial_id), _fmt(r.model), _fmt(r.backend), _fmt(r.precision), _fmt(r.batch_size),
          _fmt(r.duration_s, 3), _fmt(r.unstable_reason)] for r in unstable.itertuples()],
        "kept in every plot and table, drawn with hollow hatched markers" if len(unstable)
        else "every ok trial passed the stability checks",
    ))
    if results.stages is not None:
        breakdown = stage_plots.stage_breakdown(results.stages)
        tables.append(Table(
            "Where the time went",
            ["stage", "seconds", "share", "spans"],
            [[r.stage, _fmt(r.seconds, 4), f"{r.share:.1%}" if r.share is not None else "", _fmt(r.spans)]
             for r in breakdown.itertuples()],
            "seconds summed over every slot (a node's GPUs an actor held); idle: the gaps between a slot's "
            f"stages, up to {stage_plots.SESSION_GAP_S:g} s each (longer: the sweep was not running)",
        ))
    bad = not_ok_trials(trials)
    tables.append(Table(
        f"Failed and skipped trials ({len(bad)})",
        ["trial", "model", "backend", "precision", "batch", "status", "reason", "error"],
        [[_fmt(r.trial_id), _fmt(r.model), _fmt(r.backend), _fmt(r.precision), _fmt(r.batch_size),
          _fmt(r.status), _fmt(r.reason), _first_line(r.error)] for r in bad.itertuples()],
        "" if len(bad) else "none",
    ))
    return tables


def _header(results: Results) -> list[str]:
    t = results.trials
    counts = t["status"].value_counts()
    ok = ok_trials(t)
    devices = ", ".join(sorted(set(t["device_name"].dropna()))) or "unknown device"
    sweeps = ", ".join(sorted(set(t["sweep"].dropna()))) or str(results.root)
    return [
        f"sweep: {sweeps}",
        f"results: {results.root}",
        f"device: {devices}",
        f"trials: {len(t)} ({counts.get(Status.OK, 0)} ok, {counts.get(Status.FAILED, 0)} failed, "
        f"{counts.get(Status.SKIPPED, 0)} skipped; {int(ok['unstable'].sum())} ok but unstable)",
        f"generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
        *_pricing_lines(results.report),
    ]


def _pricing_lines(report: ReportSettings) -> list[str]:
    lines = []
    if report.grid_intensity_g_per_kwh is not None:
        lines.append(f"grid intensity: {report.grid_intensity_g_per_kwh:g} gCO2e/kWh "
                     "(co2e_g_per_1k_tokens: GPU energy only; host and cooling not included)")
    if report.price_per_kwh is not None:
        lines.append(f"energy price: {report.price_per_kwh:g} per kWh (cost_per_1m_tokens: GPU energy only)")
    return lines


def build_report(root: str | os.PathLike, fmt: str = "html", max_tpot_ms: float | None = None,
                 max_ttft_ms: float | None = None, trial_id: str | None = None,
                 grid_intensity_g_per_kwh: float | None = None, price_per_kwh: float | None = None, *,
                 slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                 slo_percentile: int = 99, plots_wanted: Sequence[str] | None = None,
                 criterion: str | None = None, min_accuracy: float | None = None) -> Report:
    """Write ``root/report/`` and return what went into it (pricing: the sweep's ``report``
    block as recorded, the given values in its place). ``plots_wanted``: the plots to draw, by
    name (``PLOT_NAMES``); None: every plot whose data is there. The tables are always there."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r} (choose from {', '.join(FORMATS)})")
    wanted = _plot_files(plots_wanted)
    bounds = latency_bounds(max_tpot_ms, max_ttft_ms, slo_ttft_ms, slo_tpot_ms, slo_percentile)
    results = load_results(root, _settings(root, grid_intensity_g_per_kwh=grid_intensity_g_per_kwh,
                                           price_per_kwh=price_per_kwh, criterion=criterion, min_accuracy=min_accuracy))
    if trial_id is not None and trial_id not in set(results.trials["trial_id"]):
        raise ReportError(f"{root}: no trial {trial_id!r} in trials.parquet")
    tables = _tables(results, bounds)
    directory = _report_directory(results)
    report = Report(path=directory / ("index.html" if fmt == "html" else "report.md"), directory=directory,
                    tables=tables, header=_header(results))
    for title, filename, caption, make in _wanted_plots(results, _Shown.pick(results, trial_id), slo_percentile):
        if filename not in wanted:
            continue
        try:
            fig = make()
        except plots.PlotNotApplicable:
            continue
        except plots.PlotUnavailable as exc:
            report.notes.append(f"{title} left out: {exc}")
            continue
        png = figure_png(fig)
        (directory / filename).write_bytes(png)
        report.plots.append(Plot(title, filename, png, caption, figure_data(fig)))
    text = render_html(report) if fmt == "html" else render_markdown(report)
    tmp = report.path.with_name(f".{report.path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(report.path)
    return report


def _plot_files(names: Sequence[str] | None) -> frozenset[str]:
    """The files of the plots named (every plot for None); an unknown name is a ``ReportError``."""
    if names is None:
        return frozenset(PLOT_FILES)
    unknown = [n for n in names if n not in PLOT_NAMES]
    if unknown:
        raise ReportError(f"--plots: unknown plot {unknown[0]!r} (choose from {', '.join(PLOT_NAMES)})")
    if not names:
        raise ReportError(f"--plots: name at least one plot (choose from {', '.join(PLOT_NAMES)})")
    return frozenset(f"{n}.png" for n in names)


def _settings(root: str | os.PathLike, **given: Any) -> ReportSettings | None:
    """The recorded report block with the command line's values in its place (None: as recorded)."""
    if all(v is None for v in given.values()):
        return None
    try:
        return report_settings(root, **given)
    except ValidationError as exc:  # the settings' bounds
        first = exc.errors()[0]
        raise ReportError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None


def _report_directory(results: Results) -> Path:
    directory = results.root / "report"
    if directory.exists() and not directory.is_dir():
        raise ReportError(f"{directory} exists and is not a directory: move it away, the report is written there")
    directory.mkdir(parents=True, exist_ok=True)
    for stale in PLOT_FILES:  # a plot left out this time must not linger beside the new page
        (directory / stale).unlink(missing_ok=True)
    return directory


@dataclass(frozen=True)
class _Shown:
    """The trial whose power timeline the report draws, and the one whose layer profile."""

    timeline_id: str | None
    timeline_row: dict[str, Any] | None
    caption: str
    layer_id: str | None
    layers: Any  # its layers.parquet rows, or None

    @classmethod
    def pick(cls, results: Results, trial_id: str | None) -> _Shown:
        timeline_id = trial_id or default_timeline_trial(results)
        row = None
        if timeline_id is not None:
            row = results.trials[results.trials["trial_id"] == timeline_id].iloc[0].to_dict()
        layer_id = layers_trial(results, trial_id or timeline_id)
        layers = None
        if layer_id is not None and results.layers is not None:
            layers = results.layers[results.layers["trial_id"] == layer_id]
        caption = ""
        if row is not None:
            rate = row.get("request_rate")
            load = f"rate={rate:g}/s" if rate is not None and rate == rate else f"bs={row['batch_size']}"
            caption = (f"trial {timeline_id}: {row['model']} {row['backend']}/{row['precision']} {load}"
                       + ("" if trial_id else " (the ok trial with the most energy; --trial picks another)"))
        return cls(timeline_id, row, caption, layer_id, layers)

    def timeline_fig(self, results: Results) -> Any:
        if table_path(results.root, "timeline") is None:
            raise plots.PlotUnavailable("no timeline.parquet in the results")
        if self.timeline_id is None:
            raise plots.PlotUnavailable("no timeline samples (a CPU-only run has no GPU telemetry)")
        return plots.plot_power_timeline(results.timeline(self.timeline_id), self.timeline_row)

    def layers_fig(self, results: Results) -> Any:
        if self.layers is None:
            raise plots.PlotUnavailable(
                "no layers.parquet in the results" if table_path(results.root, "layers") is None
                else "layers.parquet is empty (the sweep did not profile layers)")
        return plots.plot_layer_shares(self.layers, self.layer_id)


def _energy_per_turn_fig(results: Results) -> Any:
    """Energy per conversation turn. requests.parquet holds a row per request of the sweep:
    it is read (as sums per trial and turn) only once the sweep is known to have serving trials."""
    serving_plots.serving_trials(results.trials)
    try:
        turns = results.turn_energy()
    except ResultsError as exc:  # one unreadable table costs this plot, not the whole page
        raise plots.PlotUnavailable(str(exc)) from None
    return serving_plots.plot_energy_per_turn(results.trials, turns)


PlotSpec = tuple[str, str, str, Callable[[], Any]]  # title, file, caption, how to draw it


def _wanted_plots(results: Results, shown: _Shown, slo_percentile: int) -> list[PlotSpec]:
    """Every plot the report may hold: (title, file, caption, how to draw it)."""
    trials = results.trials
    n_unstable = int(ok_trials(trials)["unstable"].sum())
    marked = f"hollow hatched markers: the {n_unstable} unstable trial(s) listed below" if n_unstable else ""
    pareto_note = (f"; latency at p{slo_percentile}, the --slo-percentile, as the sweep has serving trials"
                   if plots.pareto_latencies(trials, percentile=slo_percentile) != ("tpot_s", "ttft_s") else "")
    return [
        ("Throughput vs batch size", "throughput.png", marked, lambda: plots.plot_throughput(trials)),
        ("Latency vs batch size", "latency.png", marked, lambda: plots.plot_latency(trials)),
        ("Energy per token vs batch size", "energy_per_token.png", marked,
         lambda: plots.plot_energy_per_token(trials)),
        ("Pareto frontier: latency vs J/token", "pareto.png",
         "per model, the trials no other trial beats on both latency and J/token are joined and labelled"
         + pareto_note + (f"; {marked}" if marked else ""),
         lambda: plots.plot_pareto(trials, percentile=slo_percentile)),
        ("Latency vs achieved throughput (serving)", "serving_latency.png",
         "p50 solid, p99 dashed; x: saturated trials", lambda: serving_plots.plot_serving_latency(trials)),
        ("Energy vs achieved request rate (serving)", "serving_energy.png",
         "the dotted line marks each configuration's saturation knee",
         lambda: serving_plots.plot_serving_energy(trials)),
        ("Goodput vs offered rate (serving)", "goodput.png", "goodput: requests/s meeting every SLO bound",
         lambda: serving_plots.plot_goodput(trials)),
        ("Configuration search", "search.png",
         "two objectives: every point against both, the Pareto front joined and labelled by step; one: every "
         "point's value against the GPU-seconds the search had spent, the best so far as a line; hollow: broke a "
         "constraint (search.parquet has every point, capacity.parquet each configuration's capacity)",
         lambda: search_plots.plot_search(results.search_points())),
        ("Energy per conversation turn (serving)", "energy_per_turn.png",
         "mean energy of a replayed conversation's request at each turn (0: its first), over the requests that "
         "completed inside their trial's steady window, repeats pooled; one line per configuration and rate; "
         "below: how many requests each mean is over", lambda: _energy_per_turn_fig(results)),
        ("Energy per request with prefix caching (serving)", "prefix_caching.png",
         "the configurations of a model that report a prefix-cache hit rate (the share of prompt tokens the engine "
         "took from its cache), J/request above and the hit rate below against the achieved rate; the dotted line "
         "marks each configuration's saturation knee", lambda: serving_plots.plot_prefix_caching(trials)),
        ("Weight memory per precision", "weight_memory.png", "", lambda: plots.plot_weight_memory(trials)),
        ("Fidelity vs J/token", "fidelity.png", marked, lambda: plots.plot_fidelity(trials)),
        ("Quality vs energy", "quality.png",
         "KL and top-1 to the reference, perplexity on the bundled text, against J per token and per response"
         + (f"; {marked}" if marked else ""), lambda: quality_plots.plot_quality(trials)),
        ("Accuracy vs energy", "accuracy.png",
         "scored replies (the sweep's scoring: block): accuracy with its Wilson 95 % interval against J per "
         "request, each model's non-dominated trials joined; J per correct answer per configuration and load"
         + (f"; {marked}" if marked else ""), lambda: accuracy_plots.plot_accuracy(trials)),
        ("Power timeline", "power_timeline.png", shown.caption, lambda: shown.timeline_fig(results)),
        ("Layer energy shares", "layer_shares.png", f"layer profile of trial {shown.layer_id}",
         lambda: shown.layers_fig(results)),
        ("Stage timeline", "stages.png", "each slot's stages over the sweep's wall time (sweeper/core/stages.py "
         "says what each holds)", lambda: stage_plots.plot_stage_timeline(results.stages)),
    ]
