"""The axis table is the one list of axes: a new entry flows through plan, run and report."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from sweeper.core.axes import AXES, Axis
from sweeper.core.schema import arrow_schema
from sweeper.plan.expand import expand, make_plan
from sweeper.plan.spec import parse_sweep

SWEEP = {"name": "axes", "models": "tiny-llama", "backends": "noop", "precisions": "fp32",
         "batch_sizes": [1, 2], "workload": {"input_len": 8, "output_len": 4},
         "measure": {"warmup_iters": 0, "min_iters": 1, "min_duration_s": 0, "idle_s": 0},
         "backend_options": {"noop": {"step_s": 0.001}}}

# A throwaway axis: values from nowhere in particular, default 1 (so it stays out of
# the ids of trials at 1), not in the load key (trials differing here share a model).
KNOB = Axis("knob", int, lambda grid: [1, 3], default=1, header="knob", doc="a throwaway test axis")


def test_the_bundled_axes_in_grid_order():
    assert AXES.names == ("model", "backend", "precision", "tensor_parallel", "batch_size", "input_len",
                          "output_len", "request_rate", "max_concurrency", "repeat")
    assert AXES.compare_keys() == ("model", "backend", "variant", "precision", "batch_size", "input_len",
                                   "output_len", "request_rate", "max_concurrency", "repeat")
    assert AXES.series_columns() == ("model", "backend", "backend_options", "precision", "tensor_parallel")


def test_a_new_axis_joins_expansion_ids_rules_schema_and_tables():
    sweep = parse_sweep(SWEEP)
    before = {t.label(): t.trial_id for t in expand(sweep)[0]}
    with AXES.extended(KNOB):
        trials, _ = expand(sweep)
        assert len(trials) == 2 * len(before)
        at_default = [t for t in trials if t.axes()["knob"] == 1]
        # at its default the axis stays out of the identity: stored results stay valid
        assert {t.label(): t.trial_id for t in at_default} == before
        moved = [t for t in trials if t.axes()["knob"] == 3]
        assert all(t.trial_id not in before.values() and "knob=3" in t.label() for t in moved)
        assert all(t.columns()["knob"] in (1, 3) for t in trials)
        assert {t.load_key for t in trials} == {trials[0].load_key}  # one model load for all
        assert "knob" in arrow_schema("trials").names
        assert "knob" in AXES.compare_keys()
        # exclude rules name it, typed by the table
        excluded = parse_sweep({**SWEEP, "exclude": [{"knob": 3}]})
        assert len(expand(excluded)[0]) == len(before)
        with pytest.raises(Exception, match="is not a int"):
            parse_sweep({**SWEEP, "exclude": [{"knob": "3"}]})
    assert "knob" not in AXES and "knob" not in arrow_schema("trials").names


def test_a_new_axis_flows_through_a_real_run_and_the_report(ray_local, tmp_path):
    from sweeper.analysis.report import build_report
    from sweeper.run.assembly import run_plan
    from sweeper.run.storage import ResultStore

    with AXES.extended(KNOB):
        plan = make_plan(parse_sweep(SWEEP), "cpu")
        store = ResultStore(str(tmp_path / "out"))
        summary = run_plan(plan, store, ray_local)
        assert summary.ok == 4 and summary.model_loads == 1
        store.aggregate()
        rows = pq.read_table(tmp_path / "out" / "trials.parquet").to_pylist()
        assert sorted((r["batch_size"], r["knob"]) for r in rows) == [(1, 1), (1, 3), (2, 1), (2, 3)]
        report = build_report(tmp_path / "out", "md")
        assert report.path.exists()
