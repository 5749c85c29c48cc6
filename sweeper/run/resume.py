"""Which trials a run leaves alone and which it predicts: the resume rule (a stored result that
stands is not run again) and the out-of-memory prediction (a batch that ran out predicts the
larger batches of its shape). Policies the scheduler applies, kept apart from its state machine."""

from __future__ import annotations

from sweeper.core.status import Status, settles
from sweeper.core.trial import Trial
from sweeper.run.storage import ResultStore, StoredTrial


def predicted_oom(oom_trial: Trial, pending: list[Trial]) -> list[Trial]:
    """The pending trials that ``oom_trial`` running out of memory predicts will too.

    Same loaded model (group), same workload shape, a larger batch: they need
    at least the memory that was not there. The repeat index does not change
    memory, so every repeat of a larger batch is predicted alike.
    """
    if oom_trial.batch_size is None:  # serving mode: the engine sizes its own batches
        return []
    return [t for t in pending
            if t.load_key == oom_trial.load_key and t.batch_size is not None and t.batch_size > oom_trial.batch_size
            and (t.shape, t.layer_profile) == (oom_trial.shape, oom_trial.layer_profile)]


def is_settled(stored: StoredTrial | None, retry_failed: bool, *, still_unsupported: bool = False) -> bool:
    """Whether a stored result stands (the trial is not run again): the resume rule,
    ``sweeper.core.status.settles``, for a trial that may have nothing stored."""
    return stored is not None and settles(stored.status, stored.reason, retry_failed=retry_failed,
                                          still_unsupported=still_unsupported)


def resume_filter(trials: list[Trial], store: ResultStore, retry_failed: bool) -> tuple[list[Trial], int, int]:
    """The runnable trials still to run, and how many are already ok or kept (failed, or skipped as
    predicted out of memory: a result too, re-run only with ``retry_failed``). A stored plan-time skip
    does not stand: the plan runs the trial now."""
    stored = store.stored_trials()
    todo, have_ok, kept = [], 0, 0
    for t in trials:
        s = stored.get(t.trial_id)
        if s is None or not is_settled(s, retry_failed):
            todo.append(t)
        elif s.status == Status.OK:
            have_ok += 1
        else:
            kept += 1
    return todo, have_ok, kept
