"""A configuration's capacity search as a run drives it: the probes so far, and the next one.

The policy (what to probe next, what the probes say) is ``sweeper.core.capacity``'s, a pure
function of the probes; this is its state in a run. A probe already stored (an earlier run's,
or a grid trial at the same load) is read back and told instead of run again, so a resumed
search asks exactly the probes an uninterrupted one would, and spends no GPU time twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sweeper.core.capacity import PROBE_COLUMNS, Capacity, LoadSearch, Probe, capacity, next_probe
from sweeper.core.trial import Trial
from sweeper.run.resume import is_settled
from sweeper.run.storage import ResultStore


@dataclass
class CapacityRun:
    """One configuration's search: its first trial (the range's low), the probes told so far."""

    seed: Trial
    probes: list[Probe] = field(default_factory=list)
    # Every probe the search asked for, in order: the trials the run's plan answers for.
    asked: list[str] = field(default_factory=list)

    @property
    def search(self) -> LoadSearch:
        assert self.seed.load_search is not None
        return self.seed.load_search

    @property
    def capacity_id(self) -> str:
        return self.seed.capacity_id or ""

    def next_trial(self) -> Trial | None:
        """The next probe's trial, or None: the search has its answer."""
        ask = next_probe(self.search, self.probes)
        if ask is None:
            return None
        trial = self.seed.probe(ask.load, len(self.probes), ask.stretch)
        if not self.asked or self.asked[-1] != trial.trial_id:
            self.asked.append(trial.trial_id)
        return trial

    def tell(self, trial: Trial, row: Mapping[str, Any]) -> None:
        """A probe's result (its trials row, or the row's columns the policy reads)."""
        self.probes.append(Probe.from_row(self.search, trial.point[self.search.axis], row, trial.probe_stretch))

    def advance(self, store: ResultStore, retry_failed: bool) -> Trial | None:
        """The next probe that is not stored yet (stored ones are read back and told), or None."""
        while (trial := self.next_trial()) is not None:
            stored = store.stored_trials().get(trial.trial_id)
            if not is_settled(stored, retry_failed):
                return trial
            self.tell(trial, stored_row(store, trial.trial_id))
        return None

    def result(self) -> Capacity:
        return capacity(self.search, self.probes, self.seed.columns())


def stored_row(store: ResultStore, trial_id: str, columns: list[str] | None = list(PROBE_COLUMNS)) -> dict[str, Any]:  # noqa: B006 - never mutated
    """A stored trial's row (the columns a probe is judged by, unless ``columns`` says)."""
    table = store.read_shards("trials", trial_ids=[trial_id], columns=columns)
    rows = table.to_pylist()
    return rows[0] if rows else {"trial_id": trial_id, "status": "failed", "error": "its shard could not be read"}


class CapacityRuns:
    """The run's capacity searches, by configuration (capacity id)."""

    def __init__(self) -> None:
        self.by_id: dict[str, CapacityRun] = {}

    def __iter__(self) -> Iterator[CapacityRun]:
        return iter(self.by_id.values())

    def __len__(self) -> int:
        return len(self.by_id)

    def start(self, seed: Trial, store: ResultStore, retry_failed: bool) -> tuple[CapacityRun, Trial | None]:
        """The search of ``seed``'s configuration, replayed through what is stored; and its next
        probe to run (None: stored probes already answer it)."""
        run = self.by_id.setdefault(seed.capacity_id or "", CapacityRun(seed))
        return run, run.advance(store, retry_failed)

    def of(self, trial: Trial) -> CapacityRun | None:
        return self.by_id.get(trial.capacity_id) if trial.capacity_id is not None else None

    def asked(self) -> list[str]:
        return [trial_id for run in self for trial_id in run.asked]
