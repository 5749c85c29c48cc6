"""Where the time goes, through a real local Ray: stage spans per trial and group, actors handed on
between groups, the run summary's breakdown and the report's timeline."""

from __future__ import annotations

import pandas as pd
import pytest

from sweeper.analysis.report import build_report
from sweeper.analysis.stage_plots import stage_breakdown, with_slots
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import load_sweep
from sweeper.run.assembly import run_plan
from sweeper.run.storage import ResultStore

# One worker runs the module's sweep once (pytest-xdist).
pytestmark = pytest.mark.xdist_group("stages")

SWEEP = """
name: stages
models: [tiny-llama, tiny-qwen2]
backends: noop
precisions: [fp32, bf16]
batch_sizes: [1, 2]
backend_options: {noop: {step_s: 0.01, load_s: 0.3}}
workload: {input_len: 8, output_len: 4}
measure: {warmup_iters: 1, min_iters: 2, min_duration_s: 0.3, idle_s: 0, min_window_s: 0}
"""


@pytest.fixture(scope="module")
def ran(ray_local, tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("stages")
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    plan = make_plan(load_sweep(path), "cpu", sweep_path=str(path))
    store = ResultStore(str(tmp_path / "out"))
    summary = run_plan(plan, store, ray_local)
    store.aggregate()
    trials = pd.read_parquet(tmp_path / "out" / "trials.parquet")
    stages = pd.read_parquet(tmp_path / "out" / "stages.parquet")
    return summary, trials, stages, tmp_path / "out"


def test_every_trial_and_group_records_its_stages(ran):
    summary, trials, stages, _ = ran
    assert summary.ok == 8
    # One load per group (two models x two precisions), recorded once, with the group's first trial.
    loads = stages[stages["stage"] == "load"]
    assert len(loads) == 4 and (loads["duration_s"] >= 0.3).all()
    assert set(loads["trial_id"]) <= set(trials["trial_id"])
    assert (stages[stages["stage"] == "load"]["scope"] == "group").all()
    # Each trial's measured window is inside its measure span; warm-up has its own.
    measure = stages[stages["stage"] == "measure"].set_index("trial_id")["duration_s"]
    window = trials.set_index("trial_id")["duration_s"]
    assert set(measure.index) == set(window.index)
    assert (measure >= window - 1e-6).all() and (measure < window + 0.1).all()
    assert set(stages[stages["stage"] == "warmup"]["trial_id"]) == set(trials["trial_id"])


def test_a_slots_spans_never_overlap_and_the_breakdown_adds_up(ran):
    summary, _, stages, _ = ran
    spans = with_slots(stages)
    assert spans["slot"].nunique() == 1  # a CPU-only node is one slot
    gaps = (spans["started_at"].iloc[1:].reset_index(drop=True)
            - spans["end"].iloc[:-1].reset_index(drop=True)).dt.total_seconds()
    assert (gaps >= -1e-6).all()
    breakdown = summary.stage_breakdown()
    assert sum(breakdown.values()) == pytest.approx(summary.slots * summary.wall_s, rel=1e-6)
    assert breakdown["measure"] >= 8 * 0.3 and breakdown["idle"] >= 0
    assert set(stage_breakdown(stages)["stage"]) >= {"load", "warmup", "measure", "idle"}


def test_a_finished_groups_actor_loads_the_next_group(ran):
    summary, trials, _, _ = ran
    # One node slot, four groups: the first actor is handed on three times, never restarted.
    assert summary.model_loads == 4 and summary.actor_handovers == 3
    assert (trials["status"] == "ok").all()


def test_the_report_draws_the_timeline_and_the_breakdown(ran):
    out = ran[3]
    report = build_report(out, fmt="md")
    assert "stages.png" in {p.filename for p in report.plots}
    table = next(t for t in report.tables if t.title == "Where the time went")
    assert [row[0] for row in table.rows][-1] == "idle"
    assert "load" in [row[0] for row in table.rows]
