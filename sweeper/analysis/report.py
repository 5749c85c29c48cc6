"""``sweeper report``: plots, a best-configuration table and the stability record of a results directory.

The report is built from the aggregated tables (``trials.parquet`` and, when
present, ``timeline.parquet`` and ``layers.parquet``) into ``OUTPUT/report/``:
one PNG per plot and either a self-contained ``index.html`` (images embedded as
data URIs, so the file can be mailed or attached to a CI run) or ``report.md``
with the images beside it. A plot whose data is missing is replaced by a
one-line note; unstable trials are drawn hollow and listed, never dropped.

The loading and table functions are public so the notebooks reuse them.
"""

from __future__ import annotations

import base64
import html
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sweeper.core.errors import ResultsError, UserInputError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd

FORMATS = ("html", "md")
# Configuration columns that make two sweeps' trials comparable (trial_id also
# hashes the measurement settings, which may legitimately differ between runs);
# ``variant`` is tensor parallelism and the backend options away from their
# defaults (``tp=2 compile=True``), so eager never meets compiled.
COMPARE_KEYS = ("model", "backend", "variant", "precision", "batch_size", "input_len", "output_len", "repeat")


class ReportError(UserInputError):
    """A report option that does not fit the results (an unknown trial, a bad bound)."""


# -- loading ---------------------------------------------------------------------------


@dataclass
class Results:
    """A results directory's aggregated tables (the timeline is read per trial: it is the large one)."""

    root: Path
    trials: pd.DataFrame
    layers: pd.DataFrame | None = None
    timeline_path: Path | None = None

    def timeline(self, trial_id: str) -> pd.DataFrame | None:
        if self.timeline_path is None:
            return None
        import pandas as pd

        return pd.read_parquet(self.timeline_path, filters=[("trial_id", "==", trial_id)])

    def timeline_trials(self) -> set[str]:
        if self.timeline_path is None:
            return set()
        import pyarrow.parquet as pq

        ids = pq.read_table(self.timeline_path, columns=["trial_id"]).column("trial_id")
        return set(ids.unique().to_pylist()) - {None}


def table_path(root: str | os.PathLike, kind: str) -> Path | None:
    """``root/<kind>.parquet`` if it exists."""
    path = Path(root) / f"{kind}.parquet"
    return path if path.is_file() else None


def check_results_dir(root: str | os.PathLike) -> Path:
    """The results directory as a Path, or a ResultsError that says what to do."""
    text = str(root)
    if "://" in text:
        raise ResultsError(f"{text}: reports and queries read local directories; copy the results here first")
    path = Path(text)
    if not path.is_dir():
        raise ResultsError(f"{text}: no such results directory")
    if table_path(path, "trials") is None:
        hint = (f"run `sweeper aggregate {text}` first" if (path / "shards" / "trials").is_dir()
                else "is this a sweeper output directory?")
        raise ResultsError(f"{text}: no trials.parquet ({hint})")
    return path


def load_results(root: str | os.PathLike) -> Results:
    """Read a results directory's aggregated tables into pandas."""
    import pandas as pd

    path = check_results_dir(root)
    trials = pd.read_parquet(table_path(path, "trials"))
    layers_path = table_path(path, "layers")
    layers = pd.read_parquet(layers_path) if layers_path else None
    timeline_path = table_path(path, "timeline")
    if timeline_path is not None:
        import pyarrow.parquet as pq

        if pq.ParquetFile(timeline_path).metadata.num_rows == 0:  # CPU runs write an empty timeline
            timeline_path = None
    return Results(path, trials, layers if layers is not None and not layers.empty else None, timeline_path)


# -- tables ------------------------------------------------------------------------------


def _ok(trials: pd.DataFrame) -> pd.DataFrame:
    from sweeper.analysis.plots import ok_trials

    return ok_trials(trials)


def best_configs(trials: pd.DataFrame, max_tpot_ms: float | None = None,
                 max_ttft_ms: float | None = None) -> pd.DataFrame:
    """The best ok trial per model under the latency bounds.

    Best is the lowest J/token; where a model has no energy measured (CPU runs)
    it is the highest throughput instead, and ``criterion`` says which. A trial
    without the bounded latency cannot be shown to meet the bound and is left
    out. Models with no trial under the bounds get a row with only ``criterion``.
    """
    import pandas as pd

    for name, bound in (("--max-tpot-ms", max_tpot_ms), ("--max-ttft-ms", max_ttft_ms)):
        if bound is not None and not bound > 0:
            raise ReportError(f"{name} must be a positive number of milliseconds, got {bound}")
    df = _ok(trials)
    rows = []
    for model in sorted(trials["model"].dropna().unique()):
        cand = df[df["model"] == model]
        if max_tpot_ms is not None:
            cand = cand[cand["tpot_s"].notna() & (cand["tpot_s"] * 1e3 <= max_tpot_ms)]
        if max_ttft_ms is not None:
            cand = cand[cand["ttft_s"].notna() & (cand["ttft_s"] * 1e3 <= max_ttft_ms)]
        with_energy = cand[cand["energy_per_token_j"].notna()]
        if not with_energy.empty:
            best, criterion = with_energy.loc[with_energy["energy_per_token_j"].idxmin()], "lowest J/token"
        elif cand["throughput_tok_s"].notna().any():
            best, criterion = cand.loc[cand["throughput_tok_s"].idxmax()], "highest tok/s (no energy)"
        else:
            rows.append({"model": model, "criterion": "no ok trial within the bounds"})
            continue
        rows.append({
            "model": model, "backend": best["backend"], "precision": best["precision"],
            "batch_size": best["batch_size"], "input_len": best["input_len"],
            "output_len": best["output_len"], "throughput_tok_s": best["throughput_tok_s"],
            "ttft_ms": best["ttft_s"] * 1e3, "tpot_ms": best["tpot_s"] * 1e3,
            "energy_per_token_j": best["energy_per_token_j"], "mbu": best.get("mbu"),
            "criterion": criterion, "unstable": bool(best["unstable"]), "trial_id": best["trial_id"],
        })
    return pd.DataFrame(rows, columns=[
        "model", "backend", "precision", "batch_size", "input_len", "output_len", "throughput_tok_s",
        "ttft_ms", "tpot_ms", "energy_per_token_j", "mbu", "criterion", "unstable", "trial_id"])


def unstable_trials(trials: pd.DataFrame) -> pd.DataFrame:
    df = _ok(trials)
    cols = ["trial_id", "model", "backend", "precision", "batch_size", "duration_s", "unstable_reason"]
    return df[df["unstable"]][[c for c in cols if c in df.columns]].sort_values(["model", "precision", "batch_size"])


def not_ok_trials(trials: pd.DataFrame) -> pd.DataFrame:
    df = trials[trials["status"] != "ok"]
    cols = ["trial_id", "model", "backend", "precision", "batch_size", "status", "reason", "error"]
    return df[cols].sort_values(["status", "model", "precision", "batch_size"])


def default_timeline_trial(results: Results) -> str | None:
    """The trial whose power timeline the report shows: the ok trial with the most energy.

    Without energy (a timeline but no energy column filled) it is the longest ok
    trial that has samples; without a timeline there is none.
    """
    with_samples = results.timeline_trials()
    if not with_samples:
        return None
    df = _ok(results.trials)
    df = df[df["trial_id"].isin(with_samples)]
    if df.empty:
        return None
    key = "energy_j" if df["energy_j"].notna().any() else "duration_s"
    if not df[key].notna().any():
        return str(df.iloc[0]["trial_id"])
    return str(df.loc[df[key].idxmax()]["trial_id"])


def layers_trial(results: Results, preferred: str | None) -> str | None:
    """The trial whose layer profile the report shows: ``preferred`` if profiled, else the one with the most energy."""
    if results.layers is None:
        return None
    profiled = set(results.layers["trial_id"].dropna().unique())
    if preferred in profiled:
        return preferred
    df = results.trials[results.trials["trial_id"].isin(profiled)]
    if not df.empty and df["energy_j"].notna().any():
        return str(df.loc[df["energy_j"].idxmax()]["trial_id"])
    return sorted(profiled)[0] if profiled else None


def compare_sweeps(baseline: str | os.PathLike, candidate: str | os.PathLike) -> pd.DataFrame:
    """Join two results directories' ok trials on their configuration; ratios are candidate / baseline.

    Runs in DuckDB straight over the two Parquet files, the way a user would.
    """
    import duckdb

    from sweeper.core.trial import variant_label

    a = table_path(check_results_dir(baseline), "trials")
    b = table_path(check_results_dir(candidate), "trials")
    on = " AND ".join(f"a.{k} IS NOT DISTINCT FROM b.{k}" for k in COMPARE_KEYS)
    with_variant = "SELECT *, variant(backend, backend_options, TRY_CAST(tensor_parallel AS BIGINT)) AS variant FROM read_parquet(?)"
    sql = f"""
        WITH a AS ({with_variant}), b AS ({with_variant})
        SELECT {", ".join(f"a.{k}" for k in COMPARE_KEYS)},
               a.throughput_tok_s AS baseline_tok_s, b.throughput_tok_s AS candidate_tok_s,
               b.throughput_tok_s / a.throughput_tok_s AS throughput_ratio,
               b.tpot_s / a.tpot_s AS tpot_ratio,
               a.energy_per_token_j AS baseline_j_per_tok, b.energy_per_token_j AS candidate_j_per_tok,
               b.energy_per_token_j / a.energy_per_token_j AS energy_per_token_ratio,
               a.unstable OR b.unstable AS either_unstable
        FROM a JOIN b ON {on}
        WHERE a.status = 'ok' AND b.status = 'ok'
        ORDER BY {", ".join(f"a.{k}" for k in COMPARE_KEYS)}"""
    con = duckdb.connect()
    try:
        con.create_function("variant", variant_label, ["VARCHAR", "VARCHAR", "BIGINT"], "VARCHAR",
                            null_handling="special")
        return con.execute(sql, [str(a), str(b)]).df()
    finally:
        con.close()


# -- building ----------------------------------------------------------------------------


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""


@dataclass
class Plot:
    title: str
    filename: str
    png: bytes
    caption: str = ""


@dataclass
class Report:
    path: Path  # index.html or report.md
    directory: Path
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line per plot left out
    tables: list[Table] = field(default_factory=list)
    header: list[str] = field(default_factory=list)


def _reference_precision(group: pd.DataFrame) -> str | None:
    """The precision a model's others are compared with: the fidelity pass's
    reference where one ran, else bf16, else none."""
    if "fidelity_reference" in group.columns:
        named = group["fidelity_reference"].dropna()
        if not named.empty:
            return str(named.iloc[0])
    return "bf16" if (group["precision"] == "bf16").any() else None


def _max_or_none(df: pd.DataFrame, column: str) -> float | None:
    return df[column].max() if column in df.columns and df[column].notna().any() else None


def _geomean(values: list[float]) -> float | None:
    import math

    values = [v for v in values if v is not None and v == v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def precision_summary(trials: pd.DataFrame) -> pd.DataFrame:
    """What each precision saves and costs against its model's reference precision.

    Per model, backend and precision: weight memory, and J/token and tok/s as
    ratios to the reference measured at the same batch size and shape (geometric
    mean over the shapes both have), beside fidelity and the best MBU. Empty when
    no model was run at more than one precision.
    """
    import pandas as pd

    from sweeper.core.precisions import PRECISIONS
    from sweeper.core.trial import variant_label

    df = _ok(trials)
    shape = ["batch_size", "input_len", "output_len"]
    order = {name: i for i, name in enumerate(PRECISIONS)}
    rows = []
    # Eager and compiled (any option variant) are separate comparisons, as is tensor parallelism.
    keys = [k for k in ("model", "backend", "backend_options", "tensor_parallel") if k in df.columns]
    for _, group in df.groupby(keys, sort=True, dropna=False):
        if group["precision"].nunique() < 2:
            continue
        first_row = group.iloc[0]
        tp = first_row.get("tensor_parallel")
        variant = variant_label(first_row["backend"], first_row.get("backend_options"),
                                int(tp) if pd.notna(tp) else 1)
        ref_name = _reference_precision(group)
        ref = group[group["precision"] == ref_name]
        ref_weights = ref["weight_memory_bytes"].median()
        # Reference first, then the registry's order.
        for precision in sorted(group["precision"].unique(),
                                key=lambda p, r=ref_name: (p != r, order.get(p, len(order)), p)):
            rows_p = group[group["precision"] == precision]
            paired = rows_p.merge(ref, on=shape, suffixes=("", "_ref"))
            weights = rows_p["weight_memory_bytes"].median()

            def ratio(column: str, paired=paired) -> float | None:
                return _geomean(list(paired[column] / paired[f"{column}_ref"]))

            def first(column: str, rows_p=rows_p) -> Any:
                values = rows_p[column].dropna() if column in rows_p.columns else ()
                return values.iloc[0] if len(values) else None

            rows.append({
                "model": first_row["model"],
                "backend": f"{first_row['backend']} {variant}" if variant else first_row["backend"],
                "precision": precision, "reference": ref_name,
                "weight_gb": weights / 1e9 if pd.notna(weights) else None,
                "weight_vs_ref": weights / ref_weights if pd.notna(weights) and pd.notna(ref_weights) else None,
                "energy_per_token_vs_ref": ratio("energy_per_token_j"),
                "throughput_vs_ref": ratio("throughput_tok_s"),
                "shapes_compared": len(paired),
                "fidelity_kl": first("fidelity_kl"), "fidelity_top1": first("fidelity_top1"),
                "best_mbu": _max_or_none(rows_p, "mbu"),
            })
    return pd.DataFrame(rows, columns=[
        "model", "backend", "precision", "reference", "weight_gb", "weight_vs_ref",
        "energy_per_token_vs_ref", "throughput_vs_ref", "shapes_compared", "fidelity_kl",
        "fidelity_top1", "best_mbu"])


PLOT_FILES = ("throughput.png", "energy_per_token.png", "pareto.png", "weight_memory.png",
              "fidelity.png", "power_timeline.png", "layer_shares.png")


def figure_png(fig: Any, dpi: int = 110) -> bytes:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
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


def _tables(results: Results, max_tpot_ms: float | None, max_ttft_ms: float | None) -> list[Table]:
    trials = results.trials
    bounds = []
    if max_tpot_ms is not None:
        bounds.append(f"TPOT ≤ {max_tpot_ms:g} ms")
    if max_ttft_ms is not None:
        bounds.append(f"TTFT ≤ {max_ttft_ms:g} ms")
    best = best_configs(trials, max_tpot_ms, max_ttft_ms)
    tables = [Table(
        "Best configuration per model",
        ["model", "backend", "precision", "batch", "in/out", "tok/s", "TTFT ms", "TPOT ms", "J/token",
         "MBU", "criterion", "trial"],
        [[_fmt(r.model), _fmt(r.backend), _fmt(r.precision), _fmt(r.batch_size),
          _shape(r.input_len, r.output_len),
          _fmt(r.throughput_tok_s), _fmt(r.ttft_ms), _fmt(r.tpot_ms), _fmt(r.energy_per_token_j),
          _fmt(r.mbu),
          _fmt(r.criterion) + (" ⚠ unstable" if r.unstable is True else ""), _fmt(r.trial_id)]
         for r in best.itertuples()],
        "under " + " and ".join(bounds) if bounds else "no latency bound (--max-tpot-ms / --max-ttft-ms)",
    )]
    precisions = precision_summary(trials)
    if not precisions.empty:
        tables.append(Table(
            "Precisions against the reference",
            ["model", "backend", "precision", "weights GB", "weights × ref", "J/token × ref",
             "tok/s × ref", "KL to ref", "top-1 vs ref", "best MBU"],
            [[_fmt(r.model), _fmt(r.backend), _fmt(r.precision) + (" (reference)" if r.precision == r.reference else ""),
              _fmt(r.weight_gb, 3), _fmt(r.weight_vs_ref, 3), _fmt(r.energy_per_token_vs_ref, 3),
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
    ok = _ok(t)
    devices = ", ".join(sorted(set(t["device_name"].dropna()))) or "unknown device"
    sweeps = ", ".join(sorted(set(t["sweep"].dropna()))) or str(results.root)
    return [
        f"sweep: {sweeps}",
        f"results: {results.root}",
        f"device: {devices}",
        f"trials: {len(t)} ({counts.get('ok', 0)} ok, {counts.get('failed', 0)} failed, "
        f"{counts.get('skipped', 0)} skipped; {int(ok['unstable'].sum())} ok but unstable)",
        f"generated: {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}",
    ]


def build_report(root: str | os.PathLike, fmt: str = "html", max_tpot_ms: float | None = None,
                 max_ttft_ms: float | None = None, trial_id: str | None = None) -> Report:
    """Write ``root/report/`` and return what went into it."""
    from sweeper.analysis import plots

    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r} (choose from {', '.join(FORMATS)})")
    results = load_results(root)
    if trial_id is not None and trial_id not in set(results.trials["trial_id"]):
        raise ReportError(f"{root}: no trial {trial_id!r} in trials.parquet")
    tables = _tables(results, max_tpot_ms, max_ttft_ms)  # validates the bounds before any drawing

    directory = results.root / "report"
    directory.mkdir(parents=True, exist_ok=True)
    for stale in PLOT_FILES:  # a plot left out this time must not linger beside the new page
        (directory / stale).unlink(missing_ok=True)

    timeline_id = trial_id or default_timeline_trial(results)
    timeline_row = None
    if timeline_id is not None:
        timeline_row = results.trials[results.trials["trial_id"] == timeline_id].iloc[0].to_dict()
    layer_id = layers_trial(results, trial_id or timeline_id)
    layers = None if layer_id is None else results.layers[results.layers["trial_id"] == layer_id]

    n_unstable = int(_ok(results.trials)["unstable"].sum())
    marked = f"hollow hatched markers: the {n_unstable} unstable trial(s) listed below" if n_unstable else ""
    timeline_caption = ""
    if timeline_row is not None:
        timeline_caption = (f"trial {timeline_id}: {timeline_row['model']} {timeline_row['backend']}/"
                            f"{timeline_row['precision']} bs={timeline_row['batch_size']}"
                            + ("" if trial_id else " (the ok trial with the most energy; --trial picks another)"))

    def timeline_fig() -> Any:
        if table_path(results.root, "timeline") is None:
            raise plots.PlotUnavailable("no timeline.parquet in the results")
        if timeline_id is None:
            raise plots.PlotUnavailable("no timeline samples (a CPU-only run has no GPU telemetry)")
        return plots.plot_power_timeline(results.timeline(timeline_id), timeline_row)

    def layers_fig() -> Any:
        if layers is None:
            raise plots.PlotUnavailable(
                "no layers.parquet in the results" if table_path(results.root, "layers") is None
                else "layers.parquet is empty (the sweep did not profile layers)")
        return plots.plot_layer_shares(layers, layer_id)

    wanted = [
        ("Throughput vs batch size", "throughput.png", marked, lambda: plots.plot_throughput(results.trials)),
        ("Energy per token vs batch size", "energy_per_token.png", marked,
         lambda: plots.plot_energy_per_token(results.trials)),
        ("Pareto frontier: latency vs J/token", "pareto.png",
         "per model, the trials no other trial beats on both latency and J/token are joined and labelled"
         + (f"; {marked}" if marked else ""), lambda: plots.plot_pareto(results.trials)),
        ("Weight memory per precision", "weight_memory.png", "", lambda: plots.plot_weight_memory(results.trials)),
        ("Fidelity vs J/token", "fidelity.png", marked, lambda: plots.plot_fidelity(results.trials)),
        ("Power timeline", "power_timeline.png", timeline_caption, timeline_fig),
        ("Layer energy shares", "layer_shares.png", f"layer profile of trial {layer_id}", layers_fig),
    ]
    report = Report(path=directory / ("index.html" if fmt == "html" else "report.md"), directory=directory,
                    tables=tables, header=_header(results))
    for title, filename, caption, make in wanted:
        try:
            fig = make()
        except plots.PlotUnavailable as exc:
            report.notes.append(f"{title} left out: {exc}")
            continue
        png = figure_png(fig)
        (directory / filename).write_bytes(png)
        report.plots.append(Plot(title, filename, png, caption))

    text = render_html(report) if fmt == "html" else render_markdown(report)
    tmp = report.path.with_name(f".{report.path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(report.path)
    return report


# -- rendering ---------------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
h1 { margin-bottom: .2em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd; }
ul.meta { color: #555; list-style: none; padding: 0; } .note { color: #8a6d3b; }
table { border-collapse: collapse; font-size: 13px; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: left; }
th { background: #f3f3f3; } tr.unstable td { background: #fff6e0; }
figure { margin: 1em 0; } img { max-width: 100%; border: 1px solid #eee; }
.caption { color: #666; font-size: 13px; }
"""


def _html_table(table: Table) -> str:
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in table.headers)
    body = []
    for row in table.rows:
        cls = ' class="unstable"' if any("unstable" in c for c in row) and "Unstable" not in table.title else ""
        body.append(f"<tr{cls}>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>")
    caption = f'<p class="caption">{e(table.caption)}</p>' if table.caption else ""
    rows = f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>" if table.rows else ""
    return f"<h2>{e(table.title)}</h2>{caption}{rows}"


def render_html(report: Report) -> str:
    e = html.escape
    parts = ["<!doctype html>", '<html lang="en"><head><meta charset="utf-8">',
             "<title>sweeper report</title>", f"<style>{_CSS}</style></head><body>",
             "<h1>sweeper report</h1>",
             '<ul class="meta">' + "".join(f"<li>{e(line)}</li>" for line in report.header) + "</ul>"]
    parts.append(_html_table(report.tables[0]))
    parts.append("<h2>Plots</h2>")
    for plot in report.plots:
        data = base64.b64encode(plot.png).decode("ascii")
        parts.append(f'<figure><img alt="{e(plot.title)}" src="data:image/png;base64,{data}">'
                     f"<figcaption><b>{e(plot.title)}</b> ({e(plot.filename)})"
                     + (f": {e(plot.caption)}" if plot.caption else "") + "</figcaption></figure>")
    parts += [f'<p class="note">{e(note)}</p>' for note in report.notes]
    parts += [_html_table(t) for t in report.tables[1:]]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_table(table: Table) -> list[str]:
    lines = [f"## {table.title}", ""]
    if table.caption:
        lines += [table.caption, ""]
    if table.rows:
        lines.append("| " + " | ".join(table.headers) + " |")
        lines.append("|" + " --- |" * len(table.headers))
        lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
        lines.append("")
    return lines


def render_markdown(report: Report) -> str:
    lines = ["# sweeper report", ""] + [f"- {line}" for line in report.header] + [""]
    lines += _md_table(report.tables[0])
    lines += ["## Plots", ""]
    for plot in report.plots:
        lines += [f"![{plot.title}]({plot.filename})", ""]
        if plot.caption:
            lines += [f"*{plot.title}*: {plot.caption}", ""]
    lines += [f"> {note}" + "\n" for note in report.notes]
    for table in report.tables[1:]:
        lines += _md_table(table)
    return "\n".join(lines).rstrip() + "\n"
