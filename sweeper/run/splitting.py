"""When a long group should give some of its trials to an idle slot.

A group runs its trials one after another on one actor; a slot with nothing
left to load sits idle meanwhile (2,000 trials in one group on four GPUs kept
three of them idle: busy fraction 0.21). Moving ``k`` of the group's ``n``
remaining trials to a second copy of its model on that slot ends the group at
``max((n - k) * t, load + k * t)`` instead of ``n * t``, where ``t`` is the
group's mean trial time and ``load`` what a load of its model costs there.
The best ``k`` balances the two sides; the move is worth it only if it saves
at least ``MIN_SAVING_S``, so a short tail never costs a model load.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# A split saves at least this much wall time, or it is not made: it costs a model load's
# energy and memory on the idle slot, and the estimate is only as good as the mean.
MIN_SAVING_S = 5.0


@dataclass(frozen=True)
class Split:
    moved: int  # trials moved to the new copy: the last ones of the queue
    saving_s: float  # wall seconds the group is expected to end sooner


def best_split(pending: int, mean_trial_s: float, load_s: float) -> Split | None:
    """The split of ``pending`` trials that ends the group soonest, if it is worth a load."""
    if pending < 2 or mean_trial_s <= 0:
        return None
    total_s = pending * mean_trial_s
    # (n - k) t = load + k t  at  k = (n t - load) / 2t; the integer on either side.
    k_star = (total_s - load_s) / (2 * mean_trial_s)
    best: Split | None = None
    for k in {int(k_star), int(k_star) + 1}:
        if 1 <= k < pending:
            saving_s = total_s - max((pending - k) * mean_trial_s, load_s + k * mean_trial_s)
            if best is None or saving_s > best.saving_s:
                best = Split(moved=k, saving_s=saving_s)
    return best if best is not None and best.saving_s >= MIN_SAVING_S else None


@dataclass(frozen=True)
class RunningGroup:
    """What the split rule reads of a group: a snapshot the scheduler takes, not the group."""

    key: int  # the scheduler's handle for the group (its place in the open groups)
    running: bool  # running a trial now (a group waiting for a slot or loading is not split)
    pending: int  # trials still queued behind the current one
    mean_trial_s: float | None  # seconds per finished trial so far; None before the first
    gpus: int
    withdrawn: bool  # a copy split off it earlier was never placed: the cluster is busier than it looks
    load_s: float  # what another load of its model costs here (the backend's longest this run)


@dataclass(frozen=True)
class SplitDecision:
    key: int  # the group to split
    moved: int  # its last trials that go to the new copy
    saving_s: float


@dataclass(frozen=True)
class Splitting:
    """The split rule as a policy: told the running groups while a slot is idle, it returns
    the split that ends a group soonest (the scheduler makes the copy), or None."""

    enabled: bool = True

    def decide(self, groups: Sequence[RunningGroup]) -> SplitDecision | None:
        if not self.enabled:
            return None
        best: SplitDecision | None = None
        for g in groups:
            # Tensor-parallel groups stay whole: the free GPUs may sit on different nodes.
            if not g.running or g.mean_trial_s is None or g.gpus > 1 or g.withdrawn:
                continue
            split = best_split(g.pending, g.mean_trial_s, g.load_s)
            if split is not None and (best is None or split.saving_s > best.saving_s):
                best = SplitDecision(g.key, split.moved, split.saving_s)
        return best
