"""What a sweep run tells its listeners: one typed event per thing that happened.

The scheduler (``sweeper.run.sweep_run``) decides what runs where and emits these; it keeps
no counts, writes nothing and draws nothing. Its listeners do the rest: the ``Recorder``
(each result's shards, capacity and search rows), the run's accounting (``RunSummary.on_event``:
counts, busy time, the per-GPU table) and the run's ``Observer`` (the command line's live view,
a notebook's log, a test's list). A group is named by an
opaque ``group`` key (two groups may share a label) and its ``label``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sweeper.core.capacity import Capacity
from sweeper.core.outcome import Placement
from sweeper.core.results import TrialResult
from sweeper.core.search import SearchPoint
from sweeper.core.stages import StageSpan
from sweeper.core.trial import Trial


@dataclass(frozen=True)
class RunEvent:
    """Something that happened in a run."""


@dataclass(frozen=True)
class Notice(RunEvent):
    """An event the user is told of in a line of its own (``text``)."""

    @property
    def text(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class PlanSkipped(RunEvent):
    """The plan's skipped trials (unsupported here), each with the result that says why: to be
    recorded before anything runs."""

    skips: tuple[tuple[Trial, TrialResult], ...]

    @property
    def count(self) -> int:
        return len(self.skips)


@dataclass(frozen=True)
class SearchPointFound(RunEvent):
    """A configuration search's evaluated point as search.parquet's row (``key``: its shard)."""

    key: str
    point: SearchPoint


@dataclass(frozen=True)
class Resumed(Notice):
    """The results directory already held some of the plan's trials."""

    already_ok: int
    kept_failed: int  # failed or predicted out of memory, kept without --retry-failed
    to_run: int

    @property
    def text(self) -> str:
        kept = (f", {self.kept_failed} failed or predicted out of memory kept (use --retry-failed to re-run them)"
                if self.kept_failed else "")
        return f"resuming: {self.already_ok} trial(s) already ok{kept}; {self.to_run} to run"


@dataclass(frozen=True)
class RunStarted(RunEvent):
    """The run begins: ``to_run`` trials over ``slots`` GPUs (or CPU-only nodes)."""

    to_run: int
    slots: int


@dataclass(frozen=True)
class Polled(RunEvent):
    """The scheduler looked at its calls (several times a second): time passed."""


@dataclass(frozen=True)
class ActorRequested(RunEvent):
    """A group's actor was asked for: it waits for free resources, then loads."""

    group: object
    label: str
    gpus: int


@dataclass(frozen=True)
class GroupPlaced(RunEvent):
    """The group's actor holds its resources (or was handed over): where it runs."""

    group: object
    placement: Placement | None


@dataclass(frozen=True)
class GroupLoaded(RunEvent):
    """The group's model load ended (ok or not)."""

    group: object


@dataclass(frozen=True)
class GroupEnded(RunEvent):
    """The group has no trial left to run."""

    group: object


@dataclass(frozen=True)
class TrialStarted(RunEvent):
    group: object
    trial: Trial


@dataclass(frozen=True)
class TrialRecorded(RunEvent):
    """A trial's result was recorded: one it ran (``ran``), or one failed or skipped without
    running (its group's load failed, its OOM was predicted). ``stages``: the spans of its
    actor's time it carries, over ``slots`` slots (a tensor-parallel actor holds several)."""

    trial: Trial
    result: TrialResult
    ran: bool
    stages: tuple[StageSpan, ...] = field(default=())
    slots: int = 1
    # What the recorder writes beside the row: the trial's other tables (requests, timeline,
    # ...) and where it ran.
    tables: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    placement: Placement | None = None


@dataclass(frozen=True)
class TrialTimed(RunEvent):
    """A trial held ``placement``'s slots for ``busy_s`` (its ``width`` GPUs each)."""

    busy_s: float
    width: int
    placement: Placement | None


@dataclass(frozen=True)
class GroupSplit(RunEvent):
    """A long group gave its last ``moved`` trials to ``copy``, a second copy of its model on an
    idle slot."""

    group: object
    copy: object
    moved: int


@dataclass(frozen=True)
class SplitWithdrawn(RunEvent):
    """``group`` ran out of trials while ``copy``, split off it earlier, still waited for a slot:
    ``group`` takes back the copy's ``trials`` and runs them on the model it holds, and the
    copy's actor request is withdrawn (its load never happened)."""

    group: object
    copy: object
    trials: int


@dataclass(frozen=True)
class ActorHandedOver(RunEvent):
    """A finished group's actor loads a waiting group's model instead of a new actor."""


@dataclass(frozen=True)
class Retrying(Notice):
    """An actor died (or hung loading): its trial, or its load, runs again on a fresh actor."""

    attempt: int
    max_retries: int
    why: str

    @property
    def text(self) -> str:
        return f"retry {self.attempt}/{self.max_retries}: {self.why}"


@dataclass(frozen=True)
class RunEnded(RunEvent):
    """The run is over (finished, interrupted or stopped by an error)."""

    wall_s: float
    write_s: float


@dataclass(frozen=True)
class TrialAdded(RunEvent):
    """A search asked for a trial the plan did not list (a capacity search's next probe, a
    configuration search's next point): one more to run."""

    trial: Trial


@dataclass(frozen=True)
class CapacityFound(Notice):
    """A configuration's capacity search ended (``sweeper.core.capacity``): its answer."""

    label: str
    capacity: Capacity

    @property
    def text(self) -> str:
        c = self.capacity
        unit = "req/s" if c.load_axis == "request_rate" else "in flight"
        if c.capacity_load is None:
            found = f"no load from {c.range_low:g} {unit} held"
        else:
            found = f"{c.capacity_load:g} {unit}"
            if c.fail_load is not None:
                found += f" (next probe {c.fail_load:g} failed: {c.bounded_by})"
            elif c.bounded_by == "high":
                found += " (the range's top held: at least that)"
        where = f"capacity {self.label}: {found}; {c.n_probes} probe(s)"
        if c.energy_per_request_j is not None:
            where += f", {c.energy_per_request_j:.4g} J/request there"
        return where + ("" if c.precise or c.imprecise_reason is None else f"; approximate: {c.imprecise_reason}")


class ResultSink(Protocol):
    """The listener that writes what a run records (``sweeper.run.recorder.Recorder``). The
    scheduler hands it every event first, and at the end, on an interrupt or on a failed write
    has it write what finished; ``uri`` names where (for the message of a failed write) and
    ``write_s`` is the time its writing took."""

    @property
    def uri(self) -> str: ...

    @property
    def write_s(self) -> float: ...

    def on_event(self, event: RunEvent) -> None: ...

    def flush(self) -> None: ...

    def shutdown(self) -> None: ...
