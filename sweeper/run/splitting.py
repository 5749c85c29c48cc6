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
