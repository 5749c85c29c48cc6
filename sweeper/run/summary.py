"""What a run did, for its closing summary: counts, wall and busy time, where the slot time went.

The run's accounting is a listener of its events (``sweeper.run.events``): the scheduler
counts nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sweeper.core.capacity import Capacity
from sweeper.core.stages import IDLE, STAGES, StageSpan, stage_seconds
from sweeper.core.status import Status
from sweeper.run.events import (
    ActorHandedOver,
    ActorRequested,
    CapacityFound,
    GroupPlaced,
    GroupSplit,
    PlanSkipped,
    Resumed,
    Retrying,
    RunEnded,
    RunEvent,
    SplitWithdrawn,
    TrialAdded,
    TrialRecorded,
    TrialTimed,
)
from sweeper.run.search import SearchOutcome


@dataclass
class PlacementUse:
    trials: int = 0
    busy_s: float = 0.0
    model_loads: int = 0


@dataclass
class RunSummary:
    planned: int
    ran: int = 0
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    resumed: int = 0  # already had an ok (or kept failed) shard
    wall_s: float = 0.0
    model_loads: int = 0
    retries: int = 0  # trial attempts re-run after their actor died
    actor_handovers: int = 0  # groups loaded by a finished group's actor instead of a new one
    # Long groups that gave trials to a second copy of their model on an idle slot (a split
    # withdrawn before its copy was placed is not one).
    group_splits: int = 0
    busy_s: float = 0.0  # slot-seconds of trials: each trial's time x the GPUs its actor held
    write_s: float = 0.0  # the driver's time writing shards
    # Seconds per stage summed over every slot (sweeper.core.stages), as the actors timed them.
    stage_s: dict[str, float] = field(default_factory=dict)
    slots: int = 1  # GPUs (or, CPU-only, nodes) the sweep could use at once
    slot_unit: str = "GPU(s)"
    failures: list[str] = field(default_factory=list)
    # Per node and GPU (``node GPU i``; a CPU-only node's ``node CPU``): trials that held it, their
    # busy seconds and the model loads placed there (a tensor-parallel group counts on each of its GPUs).
    placements: dict[str, PlacementUse] = field(default_factory=dict)
    # The capacity searches that ended this run (sweeper.core.capacity), in the order they did.
    capacities: list[Capacity] = field(default_factory=list)
    # What the configuration search found (None: no search block).
    search: SearchOutcome | None = None

    @property
    def busy_fraction(self) -> float | None:
        """Share of the slots' wall time spent running trials (loads and idle slots are the rest)."""
        if self.wall_s <= 0:
            return None
        return self.busy_s / (max(self.slots, 1) * self.wall_s)

    def on_event(self, event: RunEvent) -> None:
        """Count what the event says happened."""
        match event:
            case TrialRecorded():
                self._recorded(event)
            case TrialTimed(busy_s=busy_s, width=width, placement=placement):
                # Slot-seconds: a tensor-parallel trial keeps each of its GPUs busy for its time.
                self.busy_s += busy_s * width
                for slot in placement.slots if placement is not None else ():
                    use = self.placements.setdefault(slot, PlacementUse())
                    use.trials += 1
                    use.busy_s += busy_s
            case ActorRequested():
                self.model_loads += 1
            case GroupPlaced(placement=placement):
                for slot in placement.slots if placement is not None else ():
                    self.placements.setdefault(slot, PlacementUse()).model_loads += 1
            case Retrying():
                self.retries += 1
            case ActorHandedOver():
                self.actor_handovers += 1
            case GroupSplit():
                self.group_splits += 1
            case SplitWithdrawn():
                # Its copy was never placed: neither the split nor the copy's load happened.
                self.group_splits -= 1
                self.model_loads -= 1
            case TrialAdded() | CapacityFound():
                self._searched(event)
            case PlanSkipped(count=count):
                self.skipped += count
            case Resumed(already_ok=ok, kept_failed=kept):
                self.resumed = ok + kept
            case RunEnded(wall_s=wall_s, write_s=write_s):
                self.wall_s, self.write_s = wall_s, write_s

    def _searched(self, event: TrialAdded | CapacityFound) -> None:
        """A search asked for another trial, or a capacity search ended."""
        if isinstance(event, TrialAdded):
            self.planned += 1
        else:
            self.capacities.append(event.capacity)

    def _recorded(self, event: TrialRecorded) -> None:
        self.add_stages(list(event.stages), slots=event.slots)
        outcome = event.result.outcome
        self.ran += event.ran
        if outcome.status == Status.OK:
            self.ok += 1
        elif outcome.status == Status.SKIPPED:
            self.skipped += 1
        else:
            self.failed += 1
            self.failures.append(f"{event.trial.label()}: {outcome.error}")

    def add_stages(self, spans: list[StageSpan], slots: int = 1) -> None:
        """Add an actor's spans, once per slot it holds (a tensor-parallel actor's load holds
        each of its GPUs): the breakdown is over slot-seconds."""
        for name, seconds in stage_seconds(spans).items():
            self.stage_s[name] = self.stage_s.get(name, 0.0) + seconds * slots

    def stage_breakdown(self) -> dict[str, float]:
        """Seconds per stage over the slots' wall time, ``idle`` the remainder (see sweeper.core.stages)."""
        ordered = {name: self.stage_s[name] for name in STAGES if name in self.stage_s}
        if self.wall_s > 0:
            ordered[IDLE] = max(max(self.slots, 1) * self.wall_s - sum(ordered.values()), 0.0)
        return ordered
