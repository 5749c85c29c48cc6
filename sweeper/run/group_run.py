"""The scheduler's records: the run's options, each group's state and progress, a call in flight.

``SweepRun`` (``sweeper.run.sweep_run``) keeps its state in these fields and changes it in
one method per event; they hold no behaviour beyond reading themselves.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from sweeper.core.backends import BACKENDS
from sweeper.core.outcome import LoadResult
from sweeper.core.secrets import redact
from sweeper.core.stages import StageSpan
from sweeper.core.trial import Trial
from sweeper.plan.expand import TrialGroup
from sweeper.run.actor_runner import CallKind
from sweeper.run.events import Placement


@dataclass(frozen=True)
class RunOptions:
    retry_failed: bool = False  # re-run trials whose stored result is failed
    max_retries: int = 2  # re-runs of a trial whose actor died, before it is recorded failed
    oom_pruning: bool = True  # skip larger batches of a shape that ran out of memory
    split_groups: bool = True  # give a long group's last trials to an idle slot (sweeper.run.splitting)
    poll_s: float = 0.25  # how often the display refreshes and time limits are checked


# -- the state machine -------------------------------------------------------------------

class GroupState(enum.Enum):
    # Its actor is not requested yet: the group reads a fidelity reference that another group
    # of this run computes, and waits until that group holds its resources. Ray does not place
    # actors queued for the same resources in the order they were asked for; asked for at
    # once, a reader could get the slot first and load the reference precision itself.
    HELD = "held"
    WAITING = "waiting"  # its actor is requested; the cluster may be holding it back for resources
    LOADING = "loading"  # the actor is placed and loading the group's model
    RUNNING = "running"  # a trial is submitted (or about to be)
    DONE = "done"  # every trial recorded; its actor is gone


@dataclass(eq=False)  # identity: a group's run is a key of the progress view
class GroupRun:
    """One group's progress: its actor (replaced when it dies or hangs) and its queue."""

    group: TrialGroup
    resources: dict[str, Any]  # what the group's actor holds
    pending: list[Trial]
    state: GroupState = GroupState.WAITING
    actor: Any = None
    load: LoadResult | None = None
    current: Trial | None = None  # submitted, or waiting for a fresh actor to retry it
    # Times the current trial's actor died under it (loading or running it); before
    # the first trial, deaths while loading the group's model.
    deaths: int = 0
    started_s: float = 0.0  # monotonic time the current attempt was submitted
    placed_s: float = 0.0  # monotonic time the actor got its resources (its load's clock starts)
    attempt: int = 0  # actors started for this group; tells a stale actor's replies apart
    placement: Placement | None = None
    # The load's stage spans (and the actor's start), recorded with the next trial recorded.
    load_stages: list[StageSpan] = field(default_factory=list)
    # What a split weighs: the driver's seconds per finished trial.
    trials_timed: int = 0
    trial_s_total: float = 0.0
    # A copy split off it was never placed before it ran out and took the copy's trials back:
    # the cluster is busier than its free slots say, so it is not split again.
    splits_withdrawn: int = 0
    # The groups whose actors are requested once this one is placed (or closed): those that
    # read the fidelity reference this group computes.
    readers: list[GroupRun] = field(default_factory=list)

    @property
    def mean_trial_s(self) -> float | None:
        return self.trial_s_total / self.trials_timed if self.trials_timed else None

    @property
    def label(self) -> str:
        return self.group.label

    def redacted(self, text: str) -> str:
        """``text`` as a row the driver writes keeps it: the group's secret flag values (a launched
        server's ``--hf-token``) replaced. The actor redacts what it reports; a text the driver
        makes of a call that failed (Ray's own error, quoting the remote traceback) passes here."""
        trial = self.group.trials[0]
        return redact(text, BACKENDS[trial.backend].secret_values(trial.backend_options))

    def timed_out(self, now_s: float) -> bool:
        limit_s = self.current.measure.timeout_s if self.current is not None else None
        return limit_s is not None and now_s - self.started_s > limit_s

    def load_timed_out(self, now_s: float) -> bool:
        # Only once placed: an actor queued behind other groups for a GPU is not loading yet.
        limit_s = self.group.trials[0].measure.load_timeout_s
        return self.state is GroupState.LOADING and now_s - self.placed_s > limit_s


@dataclass(frozen=True)
class Call:
    """A call in flight to a group's actor: what it answers."""

    group: GroupRun
    kind: CallKind
    attempt: int  # the group's actor attempt the call went to
    # A close: the actor it ends (the group may have handed its own on) and when it is killed
    # if it has not closed by then.
    actor: Any = None
    deadline_s: float = 0.0
