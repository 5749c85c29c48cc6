"""Live progress of a sweep: a ticking bar, where each group runs, one line per finished trial.

The command line's rendering of a run's events (``sweeper.run.events``): ``LiveObserver`` is
the run session's ``Observer`` on a console, and feeds the events to a ``ProgressView``.
Two renderings of the same events. On a terminal: rich's progress bar (done,
failed and skipped counts, elapsed, an ETA recomputed at every refresh) above a
table of the groups (which node and GPUs each holds, what it is doing, for how
long), with each finished trial's one-line result printed above the bar. With
``--quiet``, or when stderr is not a terminal, plain lines only (one per
finished trial, one per group placement) that read well in CI logs and pipes.

The ETA is work over parallelism, from measured times only: the mean measured
trial time for every trial not yet finished (less what the running ones have
already spent), plus the mean measured model load for every group not yet
loaded (less what the loading ones have spent), spread over the slots the
remaining groups can use at once. It is unknown ("--") until a trial has
finished, and it ticks down between events because the running trials' and
loads' elapsed times are read at each refresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
)
from rich.table import Table
from rich.text import Text

from sweeper.core.results import TrialResult
from sweeper.core.status import Status
from sweeper.core.trial import Trial
from sweeper.run.events import (
    ActorRequested,
    GroupEnded,
    GroupLoaded,
    GroupPlaced,
    Notice,
    Placement,
    Polled,
    RunEnded,
    RunEvent,
    RunStarted,
    TrialAdded,
    TrialRecorded,
    TrialStarted,
)

MAX_ROWS = 40  # a live table taller than a terminal scrolls away and helps nobody
REFRESH_PER_S = 4


@dataclass
class _GroupState:
    label: str
    num_gpus: int
    since: float
    state: str = "waiting"  # waiting (for resources) | loading | running
    placement: Placement | None = None


@dataclass
class _Running:
    trial: Trial
    group: object
    since: float


def format_duration(seconds: float | None) -> str:
    """``--``, ``42s``, ``3m05s`` or ``1h02m``: short and fixed in shape, for a ticking display."""
    if seconds is None:
        return "--"
    s = max(int(round(seconds)), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


@dataclass
class _Clocked:
    """Measured durations of one kind (trials, loads): their mean estimates the next one."""

    seconds: list[float] = field(default_factory=list)

    def mean(self) -> float | None:
        return sum(self.seconds) / len(self.seconds) if self.seconds else None


class _LiveColumn(ProgressColumn):
    """A column drawn from the view at every refresh: elapsed time and the sweep's own ETA
    (rich's would extrapolate the rate of finished trials only, blind to pending loads)."""

    def __init__(self, text: Callable[[], Text]):
        super().__init__()
        self.text = text

    def render(self, task: Task) -> Text:
        return self.text()


class _SweepProgress(Progress):
    """rich's progress bar with the groups table under it (rich's documented extension point)."""

    def __init__(self, view: ProgressView, *columns: ProgressColumn | str, **kwargs):
        self.view = view  # before rich's constructor, which renders once
        super().__init__(*columns, **kwargs)

    def get_renderables(self) -> Iterable[RenderableType]:
        yield self.make_tasks_table(self.tasks)
        if self.view.groups:
            yield self.view.groups_table()


class ProgressView:
    def __init__(self, total: int, *, slots: int, console: Console | None = None, quiet: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.total, self.slots = total, max(slots, 1)
        self.console = console or Console(stderr=True)
        self.quiet = quiet or not self.console.is_terminal
        self.clock = clock  # injectable: the estimate's arithmetic is tested without sleeping
        self.ok = self.failed = self.skipped = 0
        self.groups: dict[object, _GroupState] = {}
        self.running: dict[str, _Running] = {}
        self.trials = _Clocked()
        self.loads = _Clocked()
        self.t0 = clock()
        self._progress: _SweepProgress | None = None
        self._task: TaskID | None = None

    @property
    def finished(self) -> int:
        return self.ok + self.failed + self.skipped

    @property
    def trial_seconds(self) -> list[float]:
        return self.trials.seconds

    def __enter__(self) -> ProgressView:
        if not self.quiet:
            self._progress = _SweepProgress(
                self,
                TextColumn("[bold]sweeper[/]"),
                BarColumn(bar_width=None),
                MofNCompleteColumn(),
                TextColumn("{task.description}"),
                _LiveColumn(lambda: Text(f"elapsed {format_duration(self.elapsed_s())}", style="dim")),
                _LiveColumn(lambda: Text(f"ETA {format_duration(self.eta_s())}", style="cyan")),
                console=self.console, refresh_per_second=REFRESH_PER_S, transient=True,
                expand=True)
            self._task = self._progress.add_task(self._counts(), total=self.total)
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def _line(self, text: str | Text) -> None:
        if isinstance(text, Text):
            self.console.print(text, highlight=False, soft_wrap=True)
        else:
            self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    def on_event(self, event: RunEvent) -> None:
        """Show what the run's event says (the events a view draws; others pass by)."""
        match event:
            case Polled():
                self.refresh()
            case TrialRecorded(trial=trial, result=result, ran=ran):
                # A trial that never ran (its group's load failed, its OOM predicted) has only its
                # reason to show, whole: the cause is at its end (a server's last log line).
                line = trial_line(result) if ran else str(result.outcome.error or "")
                self.trial_finished(trial, result.outcome.status or Status.FAILED, line)
            case TrialStarted(group=group, trial=trial):
                self.trial_started(trial, group)
            case TrialAdded():
                self.trial_added()
            case ActorRequested(group=group, label=label, gpus=gpus):
                self.group_waiting(group, label, gpus)
            case GroupPlaced(group=group, placement=placement) if placement is not None:
                self.group_placed(group, placement)
            case GroupLoaded(group=group):
                self.group_loaded(group)
            case GroupEnded(group=group):
                self.group_done(group)

    # -- events (``key`` identifies a group; labels of two groups may be equal) ------------
    def group_waiting(self, key: object, label: str, num_gpus: int = 0) -> None:
        """The group's actor is requested: it waits for free resources, then loads."""
        self.groups[key] = _GroupState(label, num_gpus, since=self.clock())
        if self.quiet and num_gpus:
            # Plain lines for logs: a group that waits for GPUs (a tensor-parallel group while
            # narrower ones hold them) shows as waiting there too, until its "placed" line.
            self._line(f"waiting {label} for {num_gpus} free GPU(s) on one node")
        self.refresh()

    def group_placed(self, key: object, placement: Placement) -> None:
        g = self.groups.get(key)
        if g is None:
            return
        g.placement, g.state, g.since = placement, "loading", self.clock()
        if self.quiet:
            self._line(f"placed  {g.label} on {placement}")
        self.refresh()

    def group_loaded(self, key: object) -> None:
        g = self.groups.get(key)
        if g is not None:
            if g.state == "loading":
                self.loads.seconds.append(self.clock() - g.since)
            g.state, g.since = "running", self.clock()
        self.refresh()

    def group_done(self, key: object) -> None:
        self.groups.pop(key, None)
        self.refresh()

    def trial_added(self) -> None:
        """A search asked for one more trial than the plan listed."""
        self.total += 1
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, total=self.total)
        self.refresh()

    def trial_started(self, trial: Trial, key: object = None) -> None:
        self.running[trial.trial_id] = _Running(trial, key, since=self.clock())
        self.refresh()

    def trial_finished(self, trial: Trial, status: str, summary: str = "") -> None:
        run = self.running.pop(trial.trial_id, None)
        if run is not None and status == Status.OK:
            self.trials.seconds.append(self.clock() - run.since)
        if status == Status.OK:
            self.ok += 1
        elif status == Status.SKIPPED:
            self.skipped += 1
        else:
            self.failed += 1
        where = self._placement_of(run)
        line = (f"[{self.finished}/{self.total}] {status:<6} {trial.label()}  {summary}"
                + (f"  @ {where}" if where else ""))
        if self.quiet:
            self._line(line)
        else:
            style = "green" if status == Status.OK else "yellow" if status == Status.SKIPPED else "red"
            self._line(Text.assemble((f"[{self.finished}/{self.total}] ", "dim"), (f"{status:<6}", style),
                                     f" {trial.label()}  {summary}", (f"  @ {where}" if where else "", "dim")))
        self.refresh()

    def _placement_of(self, run: _Running | None) -> Placement | None:
        g = self.groups.get(run.group) if run is not None else None
        return g.placement if g is not None else None

    # -- the estimate ------------------------------------------------------------
    def elapsed_s(self) -> float:
        return self.clock() - self.t0

    def eta_s(self) -> float | None:
        """Seconds left: remaining trial and load work (measured means) over usable slots."""
        per_trial = self.trials.mean()
        if per_trial is None:
            return None
        remaining = self.total - self.finished
        if remaining <= 0:
            return 0.0
        now = self.clock()
        per_load = self.loads.mean() or 0.0
        work = (remaining - len(self.running)) * per_trial
        work += sum(max(per_trial - (now - r.since), 0.0) for r in self.running.values())
        for g in self.groups.values():
            if g.state == "waiting":
                work += per_load
            elif g.state == "loading":
                work += max(per_load - (now - g.since), 0.0)
        # Groups run one trial at a time each: no more in parallel than groups left.
        parallel = min(self.slots, max(len(self.groups), 1), remaining)
        return work / parallel

    def _counts(self) -> str:
        waiting = sum(g.state == "waiting" for g in self.groups.values())
        loading = sum(g.state == "loading" for g in self.groups.values())
        return (f"[green]{self.ok} ok[/] [red]{self.failed} failed[/] [yellow]{self.skipped} skipped[/]"
                f" [dim]| {len(self.running)} running, {loading} loading, {waiting} waiting[/]")

    def counts_text(self) -> str:
        waiting = sum(g.state == "waiting" for g in self.groups.values())
        loading = sum(g.state == "loading" for g in self.groups.values())
        eta = self.eta_s()
        return (f"{self.finished}/{self.total} done ({self.ok} ok, {self.failed} failed, "
                f"{self.skipped} skipped), {len(self.running)} running, {loading} loading, "
                f"{waiting} waiting; elapsed {self.elapsed_s():,.0f}s; "
                + (f"ETA {eta:,.0f}s" if eta is not None else "ETA --"))

    def refresh(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.finished, description=self._counts())

    # -- rendering ---------------------------------------------------------------
    def groups_table(self) -> Table:
        """Each group not done: its node and GPUs, what it is doing, and for how long."""
        table = Table(box=None, pad_edge=False, header_style="dim")
        for col in ("node", "GPUs", "group", "doing", "for"):
            table.add_column(col)
        current = {r.group: r for r in self.running.values()}
        now = self.clock()

        def order(item: tuple[object, _GroupState]) -> tuple:
            p = item[1].placement
            return (p is None, p.node if p else "", p.gpu_ids or "" if p else "")

        rows = sorted(self.groups.items(), key=order)
        for key, g in rows[:MAX_ROWS]:
            p, run = g.placement, current.get(key)
            if g.state == "waiting":
                doing = Text(f"waiting for {g.num_gpus} free GPU(s) on one node" if g.num_gpus
                             else "waiting for a node", style="dim")
                since = g.since
            elif run is not None:
                doing, since = Text(run.trial.label(), style="cyan"), run.since
            else:
                doing, since = Text(g.state, style="yellow"), g.since
            table.add_row(p.node if p else "-", p.gpus if p else "-", g.label, doing, f"{now - since:5.1f}s")
        if len(rows) > MAX_ROWS:
            table.add_row("", "", f"... {len(rows) - MAX_ROWS} more group(s)", "", "")
        return table

    def _render(self) -> Table:
        return self.groups_table()


def trial_line(result: TrialResult) -> str:
    """What the view says of a finished trial: its error, or its headline figures."""
    if result.outcome.status != Status.OK:
        return str(result.outcome.error or "")[:200]
    # Any of these may be null on an ok row (a serving run with no steady state has no
    # throughput): the line says what there is.
    throughput_tok_s, rel_ci95 = result.throughput.throughput_tok_s, result.intervals.throughput_rel_ci95
    shown = ((throughput_tok_s, 1.0, "{:,.1f} tok/s"), (result.latency.ttft_s, 1e3, "ttft {:,.1f} ms"),
             (result.client.send_lateness_p99_s, 1e3, "sent late p99 {:,.1f} ms"),
             (result.energy.energy_per_token_j, 1.0, "{:.4f} J/tok"))
    parts = [fmt.format(value * scale) for value, scale, fmt in shown if value is not None]
    if throughput_tok_s is not None and rel_ci95 is not None:
        parts[0] += f" ±{rel_ci95:.0%}"  # how precise the figure is, beside it
    if result.stability.unstable:
        parts.append("unstable (client behind)" if result.client.client_behind else "unstable")
    return "  ".join(parts)


class LiveObserver:
    """The run session's ``Observer`` on a console: its lines printed, its events drawn by a
    ``ProgressView`` from the run's start to its end (``quiet``: plain lines, no live display)."""

    def __init__(self, console: Console, *, quiet: bool = False) -> None:
        self.console, self.quiet = console, quiet
        self.view: ProgressView | None = None

    def say(self, line: str) -> None:
        self.console.print(line, highlight=False, markup=False, soft_wrap=True)

    def warn(self, line: str) -> None:
        self.console.print(f"warning: {line}", highlight=False, markup=False, soft_wrap=True)

    def on_event(self, event: RunEvent) -> None:
        if isinstance(event, RunStarted):
            self.view = ProgressView(event.to_run, slots=event.slots, console=self.console, quiet=self.quiet)
            self.view.__enter__()
        elif isinstance(event, RunEnded):
            view, self.view = self.view, None
            if view is not None:
                view.__exit__(None, None, None)
        elif isinstance(event, Notice):
            self.say(event.text)
        elif self.view is not None:
            self.view.on_event(event)
