"""The out-of-memory policy alone: told a result and the pending trials, the skips it returns."""

from __future__ import annotations

from sweeper.core.results import TrialResult
from sweeper.core.status import Reason, Status, failed_outcome
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import parse_sweep
from sweeper.run.oom_pruning import OomPruning

SWEEP = {"name": "o", "models": "tiny-llama", "precisions": "fp32", "batch_sizes": [1, 8, 16, 32],
         "workload": {"input_len": [8, 16], "output_len": 4}}


def trials():
    return {(t.batch_size, t.input_len): t for t in make_plan(parse_sweep(SWEEP), "cpu").runnable}


def test_an_oom_skips_the_larger_batches_of_its_shape_and_nothing_else():
    by = trials()
    ran = by[8, 16]
    pending = [t for key, t in by.items() if key != (8, 16)]
    oom = TrialResult(failed_outcome(Reason.OOM, "CUDA out of memory"))
    skips = OomPruning().after(ran, oom, pending)
    assert sorted((s.trial.batch_size, s.trial.input_len) for s in skips) == [(16, 16), (32, 16)]
    assert {(s.result.outcome.status, s.result.outcome.reason) for s in skips} == {(Status.SKIPPED, Reason.PREDICTED_OOM)}
    assert all(ran.trial_id in s.result.outcome.error for s in skips)  # names the trial that ran out


def test_no_skip_without_an_oom_or_with_pruning_off():
    by = trials()
    pending = list(by.values())[1:]
    failed = TrialResult(failed_outcome(Reason.EXCEPTION, "boom"))
    assert OomPruning().after(by[1, 8], failed, pending) == []
    oom = TrialResult(failed_outcome(Reason.OOM, "CUDA out of memory"))
    assert OomPruning(enabled=False).after(by[1, 8], oom, pending) == []
