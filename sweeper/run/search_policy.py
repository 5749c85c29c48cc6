"""The run's searches as one policy the scheduler consults: what runs next, as decisions.

A sweep's capacity searches (``sweeper.run.capacity_run``) and its configuration search
(``sweeper.run.search``) decide what to run from what was recorded. ``SweepRun`` tells this
policy each trial it records and applies what comes back (a ``Decision``: the next probe, to run
first on the same group; new points, each a group of its own; capacity searches that ended), as
GuideLLM's scheduler applies its constraints' decisions. The policy holds the searches' state;
the scheduler holds the groups, the actors and the events.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sweeper.core.capacity import Capacity
from sweeper.core.trial import Trial
from sweeper.run.capacity_run import CapacityRun, CapacityRuns, stored_row
from sweeper.run.resume import is_settled, resume_filter
from sweeper.run.search import SearchRun, capacity_interval, row_gpu_s, row_interval, stored_points
from sweeper.run.storage import ResultStore


@dataclass
class Decision:
    """What the scheduler does next because of a recorded trial (or a resume)."""

    probe: Trial | None = None  # a capacity search's next probe: first on the same group
    points: list[Trial] = field(default_factory=list)  # a configuration search's new points: a group each
    found: list[tuple[str, Capacity]] = field(default_factory=list)  # capacity searches that ended, labelled

    def merge(self, other: Decision) -> Decision:
        self.points += other.points
        self.found += other.found
        return self


@dataclass
class Start:
    """Where a run begins: the trials to run, and what the results directory already answered."""

    todo: list[Trial]
    already_ok: int
    kept: int  # failed (or predicted out of memory) and kept
    decision: Decision


class SearchPolicy:
    """The run's capacity searches and its configuration search (None: a grid), over the
    results directory that holds what they have measured."""

    def __init__(self, store: ResultStore, retry_failed: bool, search: SearchRun | None = None) -> None:
        self.store, self.retry_failed, self.search = store, retry_failed, search
        self.capacities = CapacityRuns()

    # -- the start ------------------------------------------------------------------------
    def start(self, runnable: list[Trial]) -> Start:
        """The plan's runnable trials less what is stored; each capacity search replayed to its
        first missing probe; a configuration search's stored points told again, and its first
        points asked (its space is the grid: none of the grid's own trials run)."""
        if self.search is not None:
            decision = self._resume_search()
            decision.merge(self.more_points())
            failed = sum(p.error is not None for p in self.search.points)
            return Start(decision.points, len(self.search.points) - failed, failed, decision)
        todo, ok, kept = resume_filter([t for t in runnable if t.load_search is None], self.store, self.retry_failed)
        decision = Decision()
        for seed in (t for t in runnable if t.load_search is not None):
            run, probe = self.capacities.start(seed, self.store, self.retry_failed)
            ok += sum(p.figures.get("status") == "ok" for p in run.probes)
            kept += sum(p.figures.get("status") != "ok" for p in run.probes)
            if probe is None:
                decision.merge(self._found(run))
            else:
                todo.append(probe)
        return Start(todo, ok, kept, decision)

    def _resume_search(self) -> Decision:
        """The points an earlier run stored, told to the search again; a point stopped mid-way
        (its capacity search short of its answer) goes on from its stored probes."""
        search, decision = self.search, Decision()
        assert search is not None
        for step, params in stored_points(self.store, search.id):
            made = search.space.trial(params)
            if isinstance(made, str):
                continue  # the space has changed under it: not a point of this search now
            trial = dataclasses.replace(made, search_id=search.id, search_step=step,
                                        search_params=json.dumps(params, sort_keys=True, default=str))
            if trial.load_search is None:
                if self._stored(trial):
                    row = stored_row(self.store, trial.trial_id, columns=None)
                    search.restore(step, params, trial, row, row_gpu_s(row), row_interval(search.settings, row))
                continue
            run, probe = self.capacities.start(trial, self.store, self.retry_failed)
            if probe is None:
                found = run.result()
                decision.found.append((trial.configuration_label(), found))
                search.restore(step, params, trial, dict(found.items()), found.gpu_s or 0.0,
                               capacity_interval(search.settings, found))
            elif search.resume_point(step, params) is not None:
                decision.points.append(probe)
        return decision

    # -- as trials end ---------------------------------------------------------------------
    def on_recorded(self, trial: Trial, row: Mapping[str, Any]) -> Decision:
        """A trial's row was recorded: its capacity search's next probe, or the search's answer;
        for a configuration search's point, the points that take its place."""
        decision = Decision()
        run = self.capacities.of(trial)
        if run is not None:
            run.tell(trial, row)
            probe = run.advance(self.store, self.retry_failed)
            if probe is not None:
                return Decision(probe=probe)
            decision.merge(self._found(run))
        elif self.search is not None and trial.search_id is not None:
            self.search.tell_row(trial, row)
        if self.search is not None and trial.search_id is not None:
            decision.merge(self.more_points())
        return decision

    def _found(self, run: CapacityRun) -> Decision:
        found = run.result()
        if self.search is not None and run.seed.search_id is not None:
            self.search.tell_capacity(run.seed, found)
        return Decision(found=[(run.seed.configuration_label(), found)])

    def more_points(self) -> Decision:
        """The configuration search's next points while it wants more. A point whose result is
        stored (its trial, or its capacity search's every probe) is told at once, another asked."""
        decision = Decision()
        if self.search is None:
            return decision
        while (point := self.search.ask()) is not None:
            trial = point.trial
            if trial.load_search is not None:
                run, probe = self.capacities.start(trial, self.store, self.retry_failed)
                if probe is None:
                    decision.merge(self._found(run))
                else:
                    decision.points.append(probe)
            elif self._stored(trial):
                self.search.tell_row(trial, stored_row(self.store, trial.trial_id, columns=None))
            else:
                decision.points.append(trial)
        return decision

    def _stored(self, trial: Trial) -> bool:
        return is_settled(self.store.stored_trials().get(trial.trial_id), self.retry_failed)

    # -- the end ---------------------------------------------------------------------------
    def searched_plan(self, plan_ids: list[str]) -> tuple[list[str], dict[str, list[str]]] | None:
        """What the results directory answers for after the run: trial ids, and the keys of the
        derived tables' rows; None for a plain grid (the plan's ids stand). A configuration
        search answers for the points it evaluated (and their probes), not its space's grid."""
        if self.search is None and not len(self.capacities):
            return None
        derived = {"capacity": [run.capacity_id for run in self.capacities]}
        ids = plan_ids
        if self.search is not None:
            ids = [p.trial.trial_id for p in self.search.points if p.trial.load_search is None]
            derived["search"] = [key for key, _ in self.search.point_rows()]
        return ids + self.capacities.asked(), derived
