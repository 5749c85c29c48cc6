"""The run session (sweeper.run.session): a sweep planned and run as library calls, without
the command line, on a real local Ray, with real Parquet; it prints nothing."""

from __future__ import annotations

import pytest

from sweeper.core.errors import SweepFileError, UserInputError
from sweeper.run.observer import Quiet
from sweeper.run.session import open_run, plan_sweep, run_sweep
from sweeper.run.sweep_run import RunOptions

SWEEP = """
name: session
models: [tiny-llama]
backends: noop
precisions: [fp32, fp8]
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
backend_options: {noop: {step_s: 0.001}}
measure: {warmup_iters: 0, min_iters: 2, min_duration_s: 0.05, idle_s: 0}
"""


@pytest.mark.slow
def test_a_sweep_runs_through_the_session_api_without_the_cli(write_sweep, tmp_path, capfd, ray_local):
    """As a notebook would: on the cluster its own Ray driver is already connected to."""
    sweep, out = write_sweep(SWEEP), str(tmp_path / "out")
    before = plan_sweep(sweep, "cpu", output=out)
    assert [before.status(pt) for pt in before.plan.trials].count("run") == 2  # fp8 is skipped on a CPU
    assert len(before.plan.skipped) == 2 and before.done() == 0

    observer = Quiet()
    with open_run(sweep, out, observer) as setup:
        result = run_sweep(setup, RunOptions(), observer=observer)
    assert result.summary.ok == 2 and result.summary.skipped == 2 and result.summary.failed == 0
    assert result.counts["trials"] == 4
    assert any(line.startswith("sweeper: on the Ray cluster this process is connected to (GCS ")
               for line in observer.said), observer.said
    assert any("2 trials to run in 1 group(s), 2 skipped" in line for line in observer.said)

    after = plan_sweep(sweep, "cpu", output=out)
    assert after.to_run() == [] and after.done() == 2

    again = Quiet()
    with open_run(sweep, out, again) as setup:
        resumed = run_sweep(setup, observer=again)
    assert resumed.summary.resumed == 4 and resumed.summary.ran == 0
    assert again.said == ["resuming: 2 trial(s) already ok, 2 skipped; 0 to run (Ray not started)"]
    printed = capfd.readouterr()
    assert "session" not in printed.out and "resuming" not in printed.err  # the session printed nothing


@pytest.mark.slow
def test_a_probe_answer_is_reused_only_for_a_plan_that_skips_nothing(write_sweep, ray_local):
    """Sweeps run one after another through one driver ask the nodes once: a plan the last
    answer skips nothing of keeps it, and one it would skip a trial of is made from a new probe
    (what was missing may have been installed since)."""
    from sweeper.plan.capabilities import probe_cluster
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import load_sweep
    from sweeper.run.session import cluster_plan

    fresh = probe_cluster()
    again = probe_cluster(reuse=True)
    assert not fresh.reused and again.reused and again.nodes == fresh.nodes
    assert again.source.startswith(fresh.source + " ") and again.source.endswith(" s before, by this process")

    runnable = load_sweep(write_sweep(SWEEP.replace("[fp32, fp8]", "fp32"), "runnable.yaml"))
    plan = cluster_plan(runnable, ray_local.device, "runnable.yaml", expand(runnable))
    assert plan.skipped == [] and plan.notes[-1].endswith(" s before, by this process"), plan.notes

    skipping = load_sweep(write_sweep(SWEEP, "skipping.yaml"))  # the noop backend runs no fp8
    plan = cluster_plan(skipping, ray_local.device, "skipping.yaml", expand(skipping))
    assert len(plan.skipped) == 2 and plan.notes[-1] == f"installed libraries checked in: {fresh.source}", plan.notes


def test_open_run_checks_the_sweep_and_holds_its_directory(write_sweep, tmp_path):
    bad = write_sweep(SWEEP.replace("batch_sizes: [1, 2]", "batch_sizes: [0]"), name="bad.yaml")
    with pytest.raises(SweepFileError, match=r"batch_sizes\[0\]"), open_run(bad, str(tmp_path / "bad")):
        pass
    sweep, out = write_sweep(SWEEP), str(tmp_path / "out")
    with open_run(sweep, out) as setup:
        assert setup.sweep.name == "session" and len(setup.expanded[0]) == 4
        with pytest.raises(UserInputError, match="in use by another sweeper run"), open_run(sweep, out):
            pass
    with open_run(sweep, out):  # released on exit
        pass
