"""Analysis tables of a results directory: pandas in, pandas out.

The best configuration per model under latency bounds, the unstable and the
failed or skipped trials, what each precision saves and costs against its
model's reference, a join of two sweeps, and which trial the report's power
timeline and layer profile show. ``sweeper report`` lays these out as tables;
the notebooks call them directly. pandas, DuckDB and the precision registry are
imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sweeper.analysis.results import Results, check_results_dir
from sweeper.core.axes import AXES
from sweeper.core.errors import UserInputError
from sweeper.core.status import Status

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pandas as pd

# Configuration columns that make two sweeps' trials comparable (trial_id also
# hashes the measurement settings, which may legitimately differ between runs);
# ``variant`` is tensor parallelism and the backend options away from their
# defaults (``tp=2 compile=True``), so eager never meets compiled.
# Columns two sweeps' rows are matched on: every axis, from the axis table (tensor
# parallelism and non-default options as one "variant" column).
COMPARE_KEYS = AXES.compare_keys()


class ReportError(UserInputError):
    """A report option that does not fit the results (an unknown trial, a bad bound)."""


def ok_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The ok trials, with ``unstable`` a plain bool (null, i.e. not judged, counts as stable)."""
    df = trials[trials["status"] == Status.OK].copy()
    if "unstable" not in df.columns:
        df["unstable"] = False
    # Null means "not judged" (e.g. shards from before the flag existed): draw it as stable.
    df["unstable"] = df["unstable"].astype("boolean").fillna(False).astype(bool)
    return df


def memory_unit(values: Any) -> tuple[str, float]:
    """One decimal unit for a report's weight memory, plot and table alike: GB, or MB when
    every value is under a gigabyte (tiny synthetic models)."""
    finite = [float(v) for v in values if v is not None and v == v]
    return ("GB", 1e9) if finite and max(finite) >= 1e9 else ("MB", 1e6)


# The figures repeats are summarised by (median and a 95 % interval each).
REPEAT_METRICS = ("throughput_tok_s", "ttft_s", "tpot_s", "energy_per_token_j",
                  "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p90_s", "tpot_p99_s",
                  "send_lateness_p99_s", "accuracy", "energy_per_correct_j")
# What the best-configuration table can minimise (ReportSettings.criterion), in words.
CRITERIA = {"energy_per_token_j": "lowest J/token", "energy_per_correct_j": "fewest J per correct answer"}
# The latency statistics a bound of the best-configuration table may name.
STATISTICS = ("mean", "p50", "p90", "p99")


@dataclass(frozen=True)
class LatencyBound:
    """An upper bound on one latency statistic of a configuration (its repeats' median)."""

    metric: str  # ttft | tpot
    ms: float
    statistic: str = "mean"  # one of STATISTICS
    option: str = ""  # the command-line flag that set it, for messages

    @property
    def column(self) -> str:
        return f"{self.metric}_s" if self.statistic == "mean" else f"{self.metric}_{self.statistic}_s"

    def __str__(self) -> str:
        stat = "" if self.statistic == "mean" else f"{self.statistic} "
        return f"{stat}{self.metric.upper()} ≤ {self.ms:g} ms"


def latency_bounds(max_tpot_ms: float | None = None, max_ttft_ms: float | None = None,
                   slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
                   slo_percentile: int = 99) -> list[LatencyBound]:
    """The bounds the report's flags ask for: means (--max-*) and a percentile (--slo-*)."""
    if f"p{slo_percentile}" not in STATISTICS:
        raise ReportError(f"--slo-percentile must be one of 50, 90, 99, got {slo_percentile}")
    given = [("tpot", max_tpot_ms, "mean", "--max-tpot-ms"), ("ttft", max_ttft_ms, "mean", "--max-ttft-ms"),
             ("ttft", slo_ttft_ms, f"p{slo_percentile}", "--slo-ttft-ms"),
             ("tpot", slo_tpot_ms, f"p{slo_percentile}", "--slo-tpot-ms")]
    bounds = []
    for metric, ms, statistic, option in given:
        if ms is None:
            continue
        if not ms > 0:
            raise ReportError(f"{option} must be a positive number of milliseconds, got {ms}")
        bounds.append(LatencyBound(metric, ms, statistic, option))
    return bounds
# Repeats whose 95 % interval is wider than this share of their median disagree: the
# configuration's number is not one number, whatever each repeat's own flag says.
MAX_REPEAT_SPREAD = 0.10
_BOOTSTRAP_RESAMPLES = 4000


def median_interval(values: Any, confidence: float = 0.95) -> tuple[float, float, float]:
    """The median of ``values`` and a ``confidence`` interval for it: a percentile bootstrap
    of the median (seeded, so a report is reproducible); NaN bounds for fewer than two values.

    With two or three repeats the interval is the range they span, which is what a
    bootstrap of so few can say; more repeats narrow it.
    """
    import numpy as np

    v = np.asarray([x for x in values if x is not None and x == x], dtype=float)
    if len(v) == 0:
        return (float("nan"),) * 3
    median = float(np.median(v))
    if len(v) < 2:
        return median, float("nan"), float("nan")
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(v, size=(_BOOTSTRAP_RESAMPLES, len(v)), replace=True), axis=1)
    tail = (1 - confidence) / 2 * 100
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return median, float(lo), float(hi)


def repeat_summary(trials: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration (every axis but ``repeat``): how many ok repeats it has,
    the median and 95 % interval of each of ``REPEAT_METRICS``, whether any repeat was
    flagged unstable, and whether the repeats disagree (``repeats_disagree``: a throughput
    or J/token interval wider than ``MAX_REPEAT_SPREAD`` of its median)."""
    import pandas as pd

    df = ok_trials(trials)
    keys = [k for k in AXES.config_columns() if k in df.columns]
    rows = []
    for _, g in df.groupby(keys, sort=True, dropna=False):
        first = g.iloc[0]
        row: dict[str, Any] = {k: first[k] for k in keys}
        row.update(n_repeats=len(g), unstable=bool(g["unstable"].any()),
                   trial_ids=",".join(g["trial_id"]), mbu=first.get("mbu"))
        spreads = []
        for metric in REPEAT_METRICS:
            median, lo, hi = median_interval(g[metric]) if metric in g.columns else (float("nan"),) * 3
            row.update({metric: median, f"{metric}_lo": lo, f"{metric}_hi": hi})
            if metric in ("throughput_tok_s", "energy_per_token_j") and median == median and median > 0 and lo == lo:
                spreads.append((hi - lo) / median)
        row["repeats_disagree"] = bool(spreads) and max(spreads) > MAX_REPEAT_SPREAD
        # The repeat nearest the median throughput stands for the configuration in links.
        nearest = (g["throughput_tok_s"] - row["throughput_tok_s"]).abs().idxmin() \
            if g["throughput_tok_s"].notna().any() else g.index[0]
        row["trial_id"] = g.loc[nearest, "trial_id"]
        rows.append(row)
    columns = [*keys, "n_repeats", *(f"{m}{sfx}" for m in REPEAT_METRICS for sfx in ("", "_lo", "_hi")),
               "mbu", "unstable", "repeats_disagree", "trial_id", "trial_ids"]
    return pd.DataFrame(rows, columns=columns)


def best_configs(trials: pd.DataFrame, max_tpot_ms: float | None = None, max_ttft_ms: float | None = None,
                 *, bounds: Sequence[LatencyBound] | None = None, criterion: str = "energy_per_token_j",
                 min_accuracy: float | None = None) -> pd.DataFrame:
    """The best configuration per model under the latency bounds, judged on its repeats' medians.

    Best is the lowest median of ``criterion`` (``CRITERIA``: J/token, or J per correct answer);
    where a model has none measured (CPU runs) it is the highest median throughput instead,
    and ``criterion`` says which. ``min_accuracy``: configurations whose median accuracy is
    below it, or that were not scored, are not candidates.
    Repeats are never picked apart: a configuration's numbers are the medians of its
    repeats with their 95 % intervals (``*_lo``/``*_hi``, NaN for a single run), and
    ``repeats_disagree`` marks one whose repeats spread beyond ``MAX_REPEAT_SPREAD``.
    ``bounds`` (``latency_bounds``: means, or a percentile for serving SLOs) replace
    the two mean bounds. A configuration without the bounded latency cannot be shown
    to meet the bound and is left out. Unstable configurations are set aside while the
    model has a precise one (``set_aside`` counts them); where it has none, the best
    unstable one is chosen and ``only_unstable`` says so. Models with no configuration
    under the bounds get a row with only ``criterion``.
    """
    import pandas as pd

    if bounds is None:
        bounds = latency_bounds(max_tpot_ms, max_ttft_ms)
    configs = repeat_summary(trials)
    rows = []
    for model in sorted(trials["model"].dropna().unique()):
        cand = configs[configs["model"] == model]
        for bound in bounds:
            cand = cand[cand[bound.column].notna() & (cand[bound.column] * 1e3 <= bound.ms)]
        if min_accuracy is not None:
            cand = cand[cand["accuracy"].notna() & (cand["accuracy"] >= min_accuracy)]
        # Only a precise estimate can be crowned: unstable configurations (an estimate that
        # missed its bound) are set aside while the model has any other.
        precise = cand[~cand["unstable"].fillna(False).astype(bool)]
        set_aside = len(cand) - len(precise)
        pool, only_unstable = (precise, False) if not precise.empty else (cand, True)
        with_energy = pool[pool[criterion].notna()]
        if not with_energy.empty:
            best, chosen_by = with_energy.loc[with_energy[criterion].idxmin()], CRITERIA[criterion]
        elif pool["throughput_tok_s"].notna().any():
            lacking = "energy" if criterion == "energy_per_token_j" else "J per correct answer"
            best, chosen_by = pool.loc[pool["throughput_tok_s"].idxmax()], f"highest tok/s (no {lacking})"
        else:
            floor = "" if min_accuracy is None else f" and at accuracy ≥ {min_accuracy:g}"
            rows.append({"model": model, "criterion": f"no ok trial within the bounds{floor}", "set_aside": 0,
                         "only_unstable": False})
            continue
        rows.append({
            "model": model, "backend": best["backend"], "precision": best["precision"],
            "batch_size": best["batch_size"], "request_rate": best.get("request_rate"),
            "max_concurrency": best.get("max_concurrency"), "input_len": best["input_len"],
            "output_len": best["output_len"], "n_repeats": best["n_repeats"],
            "throughput_tok_s": best["throughput_tok_s"],
            "throughput_lo": best["throughput_tok_s_lo"], "throughput_hi": best["throughput_tok_s_hi"],
            "ttft_ms": best["ttft_s"] * 1e3, "tpot_ms": best["tpot_s"] * 1e3,
            # Serving: how late the client sent its requests, beside the TTFT it could distort.
            "send_lateness_p99_ms": best["send_lateness_p99_s"] * 1e3,
            "energy_per_token_j": best["energy_per_token_j"],
            "energy_per_token_lo": best["energy_per_token_j_lo"],
            "energy_per_token_hi": best["energy_per_token_j_hi"], "mbu": best.get("mbu"),
            "accuracy": best["accuracy"], "energy_per_correct_j": best["energy_per_correct_j"],
            "criterion": chosen_by, "unstable": bool(best["unstable"]),
            "repeats_disagree": bool(best["repeats_disagree"]), "trial_id": best["trial_id"],
            "set_aside": 0 if only_unstable else set_aside, "only_unstable": only_unstable,
        })
    return pd.DataFrame(rows, columns=[
        "model", "backend", "precision", "batch_size", "request_rate", "max_concurrency", "input_len",
        "output_len", "n_repeats", "throughput_tok_s", "throughput_lo", "throughput_hi", "ttft_ms",
        "send_lateness_p99_ms", "tpot_ms", "energy_per_token_j",
        "energy_per_token_lo", "energy_per_token_hi", "mbu", "accuracy", "energy_per_correct_j", "criterion",
        "unstable", "repeats_disagree", "trial_id", "set_aside", "only_unstable"])


def unstable_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The ok trials flagged unstable, with the reason each was flagged."""
    df = ok_trials(trials)
    cols = ["trial_id", "model", "backend", "precision", "batch_size", "duration_s", "unstable_reason"]
    return df[df["unstable"]][[c for c in cols if c in df.columns]].sort_values(["model", "precision", "batch_size"])


def not_ok_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The failed and skipped trials, with their reason and error."""
    df = trials[trials["status"] != Status.OK]
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
    df = ok_trials(results.trials)
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


# Per-trial noise columns compare_sweeps reads from each side when both tables have them.
_NOISE_COLUMNS = ("iteration_throughput_cv", "iteration_energy_cv", "n_iterations", "duration_s",
                  "energy_per_token_uncertainty_j")


def compare_sweeps(baseline: str | os.PathLike[str], candidate: str | os.PathLike[str]) -> pd.DataFrame:
    """Join two results directories' ok trials on their configuration; ratios are candidate / baseline.

    Runs in DuckDB straight over the two Parquet files, the way a user would. Each
    ratio comes with the half-width of its 95 % interval from both trials' own noise
    (``throughput_noise``: the per-iteration throughput CV over the square root of the
    iterations, on each side; ``energy_noise``: the per-iteration energy CV over the
    square root of the >= 1 s blocks, plus the window-boundary uncertainty), and
    ``*_within_noise`` says when the difference is inside it: such a difference is not
    one to act on. Null where a side lacks the columns (results from older versions).
    """
    import duckdb
    import pyarrow.parquet as pq

    from sweeper.core.trial import row_variant

    a = check_results_dir(baseline) / "trials.parquet"
    b = check_results_dir(candidate) / "trials.parquet"
    keys = AXES.compare_keys()  # at call time: axes added since import count too
    on = " AND ".join(f"a.{k} IS NOT DISTINCT FROM b.{k}" for k in keys)
    both = set(pq.read_schema(a).names) & set(pq.read_schema(b).names)
    noise = ", ".join(f"a.{c} AS baseline_{c}, b.{c} AS candidate_{c}" if c in both
                      else f"NULL AS baseline_{c}, NULL AS candidate_{c}" for c in _NOISE_COLUMNS)
    with_variant = "SELECT *, variant(backend, backend_options, TRY_CAST(tensor_parallel AS BIGINT)) AS variant FROM read_parquet(?)"
    sql = f"""
        WITH a AS ({with_variant}), b AS ({with_variant})
        SELECT {", ".join(f"a.{k}" for k in keys)},
               a.throughput_tok_s AS baseline_tok_s, b.throughput_tok_s AS candidate_tok_s,
               b.throughput_tok_s / a.throughput_tok_s AS throughput_ratio,
               b.tpot_s / a.tpot_s AS tpot_ratio,
               a.energy_per_token_j AS baseline_j_per_tok, b.energy_per_token_j AS candidate_j_per_tok,
               b.energy_per_token_j / a.energy_per_token_j AS energy_per_token_ratio,
               a.unstable OR b.unstable AS either_unstable, {noise}
        FROM a JOIN b ON {on}
        WHERE a.status = '{Status.OK}' AND b.status = '{Status.OK}'
        ORDER BY {", ".join(f"a.{k}" for k in keys)}"""
    con = duckdb.connect()
    try:
        # The stubs want an enum for null_handling whose module moved between DuckDB releases;
        # the string is accepted at run time by all of them.
        con.create_function("variant", row_variant, ["VARCHAR", "VARCHAR", "BIGINT"], "VARCHAR",  # type: ignore[call-overload]
                            null_handling="special")
        df = con.execute(sql, [str(a), str(b)]).df()
    finally:
        con.close()
    return _with_noise(df)


def _with_noise(df: pd.DataFrame) -> pd.DataFrame:
    import numpy as np

    def rel_se(side: str, cv: str, samples: Any) -> Any:
        return df[f"{side}_{cv}"].astype(float) / np.sqrt(np.maximum(samples.astype(float), 1.0))

    def blocks(side: str) -> Any:  # energy CV is over blocks of >= 1 s of iterations
        return np.minimum(df[f"{side}_n_iterations"].astype(float), np.floor(df[f"{side}_duration_s"].astype(float)))

    def boundary(side: str, per_token: str) -> Any:
        return df[f"{side}_energy_per_token_uncertainty_j"].astype(float) / df[per_token].astype(float)

    tp = np.hypot(rel_se("baseline", "iteration_throughput_cv", df["baseline_n_iterations"]),
                  rel_se("candidate", "iteration_throughput_cv", df["candidate_n_iterations"]))
    energy = np.sqrt(rel_se("baseline", "iteration_energy_cv", blocks("baseline")) ** 2
                     + rel_se("candidate", "iteration_energy_cv", blocks("candidate")) ** 2
                     + boundary("baseline", "baseline_j_per_tok") ** 2
                     + boundary("candidate", "candidate_j_per_tok") ** 2)
    df["throughput_noise"] = 1.96 * tp * df["throughput_ratio"]
    df["energy_noise"] = 1.96 * energy * df["energy_per_token_ratio"]
    for ratio, half in (("throughput_ratio", "throughput_noise"), ("energy_per_token_ratio", "energy_noise")):
        inside = (df[ratio] - 1.0).abs() <= df[half]
        name = "throughput_within_noise" if ratio.startswith("throughput") else "energy_within_noise"
        df[name] = inside.astype("boolean").mask(df[half].isna())
    return df.drop(columns=[f"{side}_{c}" for side in ("baseline", "candidate") for c in _NOISE_COLUMNS])


# -- precisions --------------------------------------------------------------------------


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
    mean over the shapes both have, each shape's repeats taken at their median),
    beside fidelity and the best MBU; ``shapes_compared`` counts those shapes.
    Empty when no model was run at more than one precision.
    """
    import pandas as pd

    from sweeper.core.precisions import PRECISIONS
    from sweeper.core.trial import row_variant

    df = ok_trials(trials)
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
        variant = row_variant(first_row["backend"], first_row.get("backend_options"),
                                int(tp) if pd.notna(tp) else 1)
        ref_name = _reference_precision(group)
        ref = group[group["precision"] == ref_name]
        ref_weights = ref["weight_memory_bytes"].median()
        def rank(p: str, r: str | None = ref_name) -> tuple[bool, int, str]:
            return p != r, order.get(p, len(order)), p

        # Reference first, then the registry's order.
        # Repeats of a shape are one point (their median) before pairing: pairing every repeat
        # with every repeat grows as repeats squared and counts pairs, not shapes.
        measured = ["energy_per_token_j", "throughput_tok_s"]
        ref_by_shape = ref.groupby(shape, dropna=False)[measured].median().reset_index()
        for precision in sorted(group["precision"].unique(), key=rank):
            rows_p = group[group["precision"] == precision]
            by_shape = rows_p.groupby(shape, dropna=False)[measured].median().reset_index()
            paired = by_shape.merge(ref_by_shape, on=shape, suffixes=("", "_ref"))
            weights = rows_p["weight_memory_bytes"].median()

            def ratio(column: str, paired: pd.DataFrame = paired) -> float | None:
                return _geomean(list(paired[column] / paired[f"{column}_ref"]))

            def first(column: str, rows_p: pd.DataFrame = rows_p) -> Any:
                if column not in rows_p.columns:
                    return None
                values = rows_p[column].dropna()
                return values.iloc[0] if len(values) else None

            rows.append({
                "model": first_row["model"],
                "backend": f"{first_row['backend']} {variant}" if variant else first_row["backend"],
                "precision": precision, "reference": ref_name,
                "weight_bytes": weights if pd.notna(weights) else None,
                "weight_vs_ref": weights / ref_weights if pd.notna(weights) and pd.notna(ref_weights) and ref_weights > 0 else None,
                "energy_per_token_vs_ref": ratio("energy_per_token_j"),
                "throughput_vs_ref": ratio("throughput_tok_s"),
                "shapes_compared": len(paired),
                "fidelity_kl": first("fidelity_kl"), "fidelity_top1": first("fidelity_top1"),
                "best_mbu": _max_or_none(rows_p, "mbu"),
            })
    return pd.DataFrame(rows, columns=[
        "model", "backend", "precision", "reference", "weight_bytes", "weight_vs_ref",
        "energy_per_token_vs_ref", "throughput_vs_ref", "shapes_compared", "fidelity_kl",
        "fidelity_top1", "best_mbu"])
