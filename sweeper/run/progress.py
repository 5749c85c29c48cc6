"""Live progress of a sweep: where each group runs, counts, ETA from measured trial times.

Two renderings of the same events: a live table on a terminal (which group
holds which node and GPUs, what it is doing), and, with ``--quiet`` or when
stderr is not a terminal, plain lines (one per finished trial, one per group
placement) that read well in CI logs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sweeper.core.trial import Trial

MAX_ROWS = 40  # a live table taller than a terminal scrolls away and helps nobody


@dataclass(frozen=True)
class Placement:
    """Where a group's actor runs: its node and the GPUs Ray gave it there."""

    hostname: str
    node_id: str
    gpu_ids: str | None  # node-local, comma-separated; None: no GPU (CPU-only cluster)

    @property
    def node(self) -> str:
        # Nodes of one host (a local test cluster) differ only in their Ray node id.
        return f"{self.hostname}:{self.node_id[:8]}"

    @property
    def gpus(self) -> str:
        return f"GPU {self.gpu_ids}" if self.gpu_ids else "CPU"

    def __str__(self) -> str:
        return f"{self.node} {self.gpus}"


@dataclass
class _GroupState:
    label: str
    num_gpus: int
    state: str = "waiting"  # waiting (for resources) | loading | running
    placement: Placement | None = None
    since: float = field(default_factory=time.monotonic)


@dataclass
class _Running:
    trial: Trial
    group: object
    since: float = field(default_factory=time.monotonic)


class ProgressView:
    def __init__(self, total: int, *, slots: int, console: Console | None = None, quiet: bool = False):
        self.total, self.slots = total, max(slots, 1)
        self.console = console or Console(stderr=True)
        self.quiet = quiet or not self.console.is_terminal
        self.ok = self.failed = self.skipped = 0
        self.groups: dict[object, _GroupState] = {}
        self.running: dict[str, _Running] = {}
        self.trial_seconds: list[float] = []
        self.t0 = time.monotonic()
        self._live: Live | None = None

    @property
    def finished(self) -> int:
        return self.ok + self.failed + self.skipped

    def __enter__(self) -> ProgressView:
        if not self.quiet:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    def _line(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False, soft_wrap=True)

    # -- events (``key`` identifies a group; labels of two groups may be equal) ------------
    def group_waiting(self, key: object, label: str, num_gpus: int = 0) -> None:
        """The group's actor is requested: it waits for free resources, then loads."""
        self.groups[key] = _GroupState(label, num_gpus)
        self.refresh()

    def group_placed(self, key: object, placement: Placement) -> None:
        g = self.groups.get(key)
        if g is None:
            return
        g.placement, g.state, g.since = placement, "loading", time.monotonic()
        if self.quiet:
            self._line(f"placed  {g.label} on {placement}")
        self.refresh()

    def group_loaded(self, key: object) -> None:
        g = self.groups.get(key)
        if g is not None:
            g.state = "running"
        self.refresh()

    def group_done(self, key: object) -> None:
        self.groups.pop(key, None)
        self.refresh()

    def trial_started(self, trial: Trial, key: object = None) -> None:
        self.running[trial.trial_id] = _Running(trial, key)
        self.refresh()

    def trial_finished(self, trial: Trial, status: str, summary: str = "") -> None:
        run = self.running.pop(trial.trial_id, None)
        if run is not None and status == "ok":
            self.trial_seconds.append(time.monotonic() - run.since)
        if status == "ok":
            self.ok += 1
        elif status == "skipped":
            self.skipped += 1
        else:
            self.failed += 1
        if self.quiet:
            where = self._placement_of(run)
            self._line(f"[{self.finished}/{self.total}] {status:<6} {trial.label()}  {summary}"
                       + (f"  @ {where}" if where else ""))
        elif status != "ok":
            self.console.print(Text(f"{status}: {trial.label()}  {summary}",
                                    style="yellow" if status == "skipped" else "red"))
        self.refresh()

    def _placement_of(self, run: _Running | None) -> Placement | None:
        g = self.groups.get(run.group) if run is not None else None
        return g.placement if g is not None else None

    # -- rendering ---------------------------------------------------------------
    def eta_s(self) -> float | None:
        """Remaining trials x mean measured trial time, spread over the slots they can use."""
        if not self.trial_seconds:
            return None
        remaining = self.total - self.finished
        per_trial = sum(self.trial_seconds) / len(self.trial_seconds)
        return remaining * per_trial / min(self.slots, max(remaining, 1))

    def counts_text(self) -> str:
        waiting = sum(g.state == "waiting" for g in self.groups.values())
        loading = sum(g.state == "loading" for g in self.groups.values())
        eta = self.eta_s()
        return (f"{self.finished}/{self.total} done ({self.ok} ok, {self.failed} failed, "
                f"{self.skipped} skipped), {len(self.running)} running, {loading} loading, "
                f"{waiting} waiting; elapsed {time.monotonic() - self.t0:,.0f}s; "
                + (f"ETA {eta:,.0f}s" if eta is not None else "ETA --"))

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Group:
        head = Text.assemble(("sweeper ", "bold"), self.counts_text())
        table = Table(box=None, pad_edge=False, header_style="dim")
        for col in ("node", "GPUs", "group", "doing", "for"):
            table.add_column(col)
        current = {r.group: r for r in self.running.values()}
        now = time.monotonic()

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
        return Group(head, table)
