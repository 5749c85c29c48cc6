"""Measure until precise: the window's 95 % intervals, and a window that ends when they are narrow enough."""

from __future__ import annotations

import math

import pytest

from actors.backends.base import ModelSpec
from actors.backends.noop import NoopBackend
from actors.measure import measure_trial
from actors.telemetry import NullTelemetry
from sweeper.core.errors import UserInputError
from sweeper.core.intervals import mean_interval, t975
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.actors.test_measure import FakeClock


def sweep(measure: dict, noop: dict | None = None, mode: str = "offline") -> dict:
    return {"name": "precise", "models": "tiny-llama", "backends": "noop", "precisions": "bf16",
            "workload": {"input_len": 8, "output_len": 4},
            "backend_options": {"noop": {"step_s": 0.1, **(noop or {})}},
            "measure": {"warmup_iters": 0, "min_iters": 1, "min_duration_s": 0, "idle_s": 0, **measure},
            **({"batch_sizes": 1} if mode == "offline" else {"workload": {"mode": "serving", "input_len": 8,
                                                                           "output_len": 4, "num_prompts": 8,
                                                                           "request_rate": [1.0]}})}


def measured(measure: dict, noop: dict | None = None) -> dict:
    trial = expand(parse_sweep(sweep(measure, noop)))[0][0]
    backend, clock = NoopBackend(), FakeClock()
    backend.clock, backend.sleep = clock, clock.sleep
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "bf16", trial.backend_options, seed=trial.seed))
    return measure_trial(backend, trial, load, NullTelemetry(reason="test"), clock=clock).row


def test_t_quantiles_match_the_tables():
    assert t975(1) == pytest.approx(12.706, abs=1e-3)
    assert t975(10) == pytest.approx(2.228, abs=1e-3)
    assert t975(31) == pytest.approx(2.0395, abs=2e-4)  # the expansion, just past the table
    assert t975(120) == pytest.approx(1.9799, abs=2e-4)
    with pytest.raises(ValueError):
        t975(0)


def test_mean_interval_is_t_times_the_standard_error():
    interval = mean_interval([9.0, 10.0, 11.0])
    assert interval is not None
    assert interval.mean == 10.0 and interval.n == 3
    assert interval.half_width == pytest.approx(4.303 * 1.0 / math.sqrt(3))
    assert interval.relative == pytest.approx(interval.half_width / 10.0)
    assert mean_interval([1.0]) is None


def test_a_steady_trial_stops_as_soon_as_its_interval_is_narrow_enough():
    # 0.4 s calls (prefill + 3 steps of 0.1 s): blocks of 3 calls (1.2 s); three blocks
    # give an interval, which is exactly zero for identical calls.
    row = measured({"target_rel_ci": 0.02, "max_duration_s": 30})
    assert row["target_met"] is True
    assert row["throughput_rel_ci95"] == pytest.approx(0.0, abs=1e-12)
    assert row["ci_blocks"] >= 3
    assert row["duration_s"] < 5.0  # not the 30 s cap, and not the fixed window's 10 s default
    assert row["unstable"] is False  # a short window is fine once it is precise (min_window_s does not apply)


def test_a_noisy_trial_runs_longer_and_meets_a_reachable_target():
    steady = measured({"target_rel_ci": 0.05, "max_duration_s": 120})
    noisy = measured({"target_rel_ci": 0.05, "max_duration_s": 120}, {"step_jitter": 0.3})
    assert noisy["target_met"] is True and noisy["throughput_rel_ci95"] <= 0.05
    assert noisy["duration_s"] > steady["duration_s"]
    assert noisy["ci_blocks"] > steady["ci_blocks"]


def test_a_target_out_of_reach_ends_at_max_duration_and_is_flagged():
    row = measured({"target_rel_ci": 0.001, "max_duration_s": 20}, {"step_jitter": 0.5})
    assert row["target_met"] is False
    assert 20.0 <= row["duration_s"] < 21.0  # the cap, plus the call that crossed it
    assert row["throughput_rel_ci95"] > 0.001
    assert row["unstable"] is True
    assert "> target_rel_ci 0.1%" in row["unstable_reason"]


def test_a_fixed_window_records_its_interval_without_a_verdict():
    row = measured({"min_duration_s": 6, "min_window_s": 0})
    assert row["target_met"] is None
    assert row["throughput_rel_ci95"] == pytest.approx(0.0, abs=1e-12) and row["ci_blocks"] == 5
    assert 6.0 <= row["duration_s"] < 6.5


@pytest.mark.parametrize(("measure", "message"), [
    ({"max_duration_s": 30}, "max_duration_s bounds a window that measures until precise"),
    ({"target_rel_ci": 0.02, "min_duration_s": 20, "max_duration_s": 10}, "max_duration_s (10) is below"),
    ({"target_rel_ci": 0.02, "min_duration_s": 90}, "above the default max_duration_s (60)"),
    ({"target_rel_ci": 1.5}, "target_rel_ci"),
    # A floor above the window the sweep asks for would flag every trial: refused, naming both.
    ({"min_duration_s": 6, "min_window_s": 10}, "measure.min_window_s (10 s) is above measure.min_duration_s (6 s)"),
])
def test_impossible_windows_are_refused_at_plan_time(measure, message):
    with pytest.raises(UserInputError, match="measure") as err:
        parse_sweep(sweep(measure))
    assert message in str(err.value)


def test_serving_mode_refuses_a_precision_target():
    with pytest.raises(UserInputError, match="measure.target_rel_ci: a serving run plays its whole"):
        parse_sweep(sweep({"target_rel_ci": 0.02}, mode="serving"))


def test_a_target_joins_the_trial_id_only_when_set():
    plain = expand(parse_sweep(sweep({})))[0][0]
    targeted = expand(parse_sweep(sweep({"target_rel_ci": 0.02})))[0][0]
    capped = expand(parse_sweep(sweep({"target_rel_ci": 0.02, "max_duration_s": 30})))[0][0]
    assert len({plain.trial_id, targeted.trial_id, capped.trial_id}) == 3
    assert "target_rel_ci" not in plain.identity()["measure"]


def test_the_window_floor_follows_min_duration_s_unless_set():
    # The sweep that asked for 6 s windows is not flagged for them (it once met a silent 10 s floor).
    assert measured({"min_duration_s": 6})["unstable"] is False
    assert expand(parse_sweep(sweep({"min_duration_s": 6})))[0][0].columns()["min_window_s"] == 6.0
    # Ids are unchanged where the floor was the old default (10 s windows, 10 s floor).
    plain = expand(parse_sweep(sweep({"min_duration_s": 10})))[0][0]
    spelled = expand(parse_sweep(sweep({"min_duration_s": 10, "min_window_s": 10})))[0][0]
    assert plain.trial_id == spelled.trial_id
    # A stricter bound judges, never re-measures: max_rel_ci is no part of the trial's id.
    strict = expand(parse_sweep(sweep({"min_duration_s": 10, "max_rel_ci": 0.01})))[0][0]
    assert strict.trial_id == plain.trial_id and strict.columns()["max_rel_ci"] == 0.01
    # With a precision target the floor does not apply, whatever it is.
    assert parse_sweep(sweep({"min_duration_s": 1, "min_window_s": 10, "target_rel_ci": 0.05}))
