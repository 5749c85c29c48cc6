"""The scheduler's out-of-memory rule as a policy: told a trial's result and the trials still
pending, it returns the skips the result predicts, and the scheduler applies them.

A trial that ran out of memory predicts the same for every pending trial of its loaded model
and workload shape with a larger batch (``sweeper.run.resume.predicted_oom``): each is recorded
``skipped`` (``predicted_oom``) instead of being run into the same wall, unless the run was
asked not to (``--no-oom-pruning``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sweeper.core.results import TrialResult
from sweeper.core.status import Reason, skipped_outcome
from sweeper.core.trial import Trial
from sweeper.run.resume import predicted_oom


@dataclass(frozen=True)
class Skip:
    """A pending trial the policy decided not to run, with the result to record for it."""

    trial: Trial
    result: TrialResult


@dataclass(frozen=True)
class OomPruning:
    enabled: bool = True

    def after(self, ran: Trial, result: TrialResult, pending: Sequence[Trial]) -> list[Skip]:
        """The skips ``ran``'s ``result`` predicts among ``pending`` (none unless it ran out of memory)."""
        if not self.enabled or result.outcome.reason != Reason.OOM:
            return []
        text = f"predicted out of memory: batch {ran.batch_size} of the same shape ran out ({ran.trial_id})"
        return [Skip(t, TrialResult(skipped_outcome(Reason.PREDICTED_OOM, text))) for t in predicted_oom(ran, list(pending))]
