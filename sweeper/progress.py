"""Live progress of a sweep: counts, ETA from measured trial times, running trials."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from sweeper.trial import Trial


@dataclass
class _Running:
    trial: Trial
    where: str
    since: float = field(default_factory=time.monotonic)


class ProgressView:
    def __init__(self, total: int, *, slots: int, console: Console | None = None, quiet: bool = False):
        self.total, self.slots = total, max(slots, 1)
        self.console = console or Console(stderr=True)
        self.quiet = quiet or not self.console.is_terminal
        self.done = self.failed = 0
        self.running: dict[str, _Running] = {}
        self.loading: dict[str, str] = {}
        self.trial_seconds: list[float] = []
        self.t0 = time.monotonic()
        self._live: Live | None = None

    def __enter__(self) -> ProgressView:
        if not self.quiet:
            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)

    # -- events ----------------------------------------------------------------
    def group_loading(self, label: str, where: str = "") -> None:
        self.loading[label] = where
        self.refresh()

    def group_loaded(self, label: str) -> None:
        self.loading.pop(label, None)
        self.refresh()

    def trial_started(self, trial: Trial, where: str = "") -> None:
        self.running[trial.trial_id] = _Running(trial, where)
        self.refresh()

    def trial_finished(self, trial: Trial, status: str, summary: str = "") -> None:
        run = self.running.pop(trial.trial_id, None)
        if run is not None and status == "ok":
            self.trial_seconds.append(time.monotonic() - run.since)
        self.done += 1
        self.failed += status != "ok"
        if self.quiet:
            mark = "ok    " if status == "ok" else f"{status:<6}"
            self.console.print(f"[{self.done}/{self.total}] {mark} {trial.label()}  {summary}",
                               highlight=False, markup=False)
        elif status != "ok":
            self.console.print(Text(f"{status}: {trial.label()}  {summary}", style="red"))
        self.refresh()

    # -- rendering ---------------------------------------------------------------
    def eta_s(self) -> float | None:
        if not self.trial_seconds:
            return None
        remaining = self.total - self.done
        per_trial = sum(self.trial_seconds) / len(self.trial_seconds)
        return remaining * per_trial / min(self.slots, max(remaining, 1))

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _render(self) -> Group:
        elapsed = time.monotonic() - self.t0
        eta = self.eta_s()
        head = Text.assemble(
            ("sweeper ", "bold"),
            f"{self.done}/{self.total} done  ",
            (f"{len(self.running)} running  ", "cyan"),
            (f"{self.failed} failed  ", "red" if self.failed else "dim"),
            f"elapsed {elapsed:,.0f}s  ",
            f"ETA {eta:,.0f}s" if eta is not None else "ETA --",
        )
        table = Table(box=None, show_header=False, pad_edge=False)
        for label, where in self.loading.items():
            table.add_row(Text("loading", style="yellow"), label, where)
        now = time.monotonic()
        for r in self.running.values():
            table.add_row(Text(f"{now - r.since:5.1f}s", style="cyan"), r.trial.label(), r.where)
        return Group(head, table)
