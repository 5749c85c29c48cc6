"""Serving mode in the sweep file: its keys, its axes, its bad input, its plan."""

from __future__ import annotations

import math

import pytest
import yaml

from sweeper.core.errors import SweepFileError
from sweeper.plan.expand import expand, make_plan
from sweeper.plan.spec import parse_sweep
from tests.conftest import ROOT, run_cli

SERVING = {
    "name": "s", "models": "tiny-llama", "backends": ["noop", "transformers"], "precisions": "fp32",
    "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": [2, "inf"],
                 "max_concurrency": [4, 16], "num_prompts": 20},
}
OFFLINE = {"name": "s", "models": "tiny-llama", "precisions": "fp32", "batch_sizes": 4,
           "workload": {"input_len": 8, "output_len": 4}}


def test_request_rate_and_max_concurrency_are_axes_and_batch_size_is_not():
    trials, _ = expand(parse_sweep(SERVING))
    assert len(trials) == 2 * 2 * 2
    assert {t.batch_size for t in trials} == {None}
    assert sorted({t.request_rate for t in trials}) == [2.0, math.inf]
    assert {t.max_concurrency for t in trials} == {4, 16}
    assert {t.mode for t in trials} == {"serving"}
    t = trials[0]
    assert "rate=2/s conc=4" in t.label()
    assert t.columns()["mode"] == "serving" and t.columns()["request_rate"] == 2.0


def test_serving_keys_change_no_offline_trial_id():
    offline = expand(parse_sweep(OFFLINE))[0][0]
    assert "serving" not in offline.identity() and "request_rate" not in offline.identity()
    serving = expand(parse_sweep(SERVING))[0]
    assert len({t.trial_id for t in serving}) == len(serving)
    slower = expand(parse_sweep({**SERVING, "workload": {**SERVING["workload"], "arrival": "constant"}}))[0]
    assert {t.trial_id for t in slower}.isdisjoint(t.trial_id for t in serving)


def test_exclude_rules_match_rates_written_as_integers():
    sweep = parse_sweep({**SERVING, "exclude": [{"request_rate": 2, "backend": "transformers"}]})
    trials, excluded = expand(sweep)
    assert excluded == 2 and len(trials) == 6


@pytest.mark.parametrize("patch, words", [
    ({"workload": {"input_len": 8, "output_len": 4, "request_rate": 2}}, "request_rate is a serving-mode key"),
    ({"workload": {"input_len": 8, "output_len": 4, "slo": {"ttft_ms": 5}}}, "slo is a serving-mode key"),
])
def test_serving_keys_in_offline_mode_are_refused(patch, words):
    with pytest.raises(SweepFileError, match=words):
        parse_sweep({**OFFLINE, **patch}, "f.yaml")


@pytest.mark.parametrize("workload, field, words", [
    ({"request_rate": None}, "workload", "request_rate is required in serving mode"),
    ({"num_prompts": None}, "workload", "needs num_prompts"),
    ({"request_rate": "inf", "num_prompts": None, "duration_s": 5}, "workload", "inf sends every request at once"),
    ({"burstiness": 0.5}, "workload", "needs arrival: gamma"),
    ({"request_rate": [0]}, "workload.request_rate[0]", "greater than 0"),
    ({"request_rate": ["fast"]}, "workload.request_rate[0]", "number"),
    ({"arrival": "uniform"}, "workload.arrival", "poisson"),
    ({"max_concurrency": [0]}, "workload.max_concurrency[0]", "greater than 0"),
    ({"slo": {}}, "workload.slo", "at least one of"),
    ({"slo": {"ttft": 5}}, "workload.slo.ttft", "unknown key"),
    ({"mode": "online"}, "workload.mode", "offline"),
])
def test_bad_serving_values_name_the_field(workload, field, words):
    data = {**SERVING, "workload": {k: v for k, v in {**SERVING["workload"], **workload}.items() if v is not None}}
    with pytest.raises(SweepFileError) as info:
        parse_sweep(data, "f.yaml")
    assert info.value.field == field, str(info.value)
    assert words in str(info.value)


def test_batch_sizes_layer_profiles_and_fidelity_are_offline_only():
    with pytest.raises(SweepFileError, match="batch_sizes: not an axis in serving mode"):
        parse_sweep({**SERVING, "batch_sizes": [1, 8]}, "f.yaml")
    with pytest.raises(SweepFileError, match="profile: the layer-profiling pass"):
        parse_sweep({**SERVING, "profile": {"layers": "block"}}, "f.yaml")
    with pytest.raises(SweepFileError, match="fidelity: the fidelity pass scores offline generate calls"):
        parse_sweep({**SERVING, "fidelity": {"reference": "fp32"}}, "f.yaml")
    with pytest.raises(SweepFileError, match="batch_sizes: required field is missing"):
        parse_sweep({k: v for k, v in OFFLINE.items() if k != "batch_sizes"}, "f.yaml")


def test_an_option_without_a_serving_path_is_skipped_at_plan_time():
    sweep = parse_sweep({**SERVING, "backend_options": {"transformers": [{}, {"compile": True}]}})
    plan = make_plan(sweep, "cpu")
    reasons = {p.skip_reason for p in plan.skipped}
    assert len(plan.skipped) == 4
    assert reasons == {next(iter(reasons))} and "continuous-batching" in next(iter(reasons))


def test_the_cli_says_one_line_and_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**SERVING, "batch_sizes": [1]}))
    proc = run_cli("plan", str(path))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "batch_sizes: not an axis in serving mode" in proc.stderr


def test_plan_json_is_strict_json_with_inf_as_a_string():
    import json

    proc = run_cli("plan", str(ROOT / "sweeps" / "serving.yaml"), "--json")
    assert proc.returncode == 0, proc.stderr

    def refuse(constant: str) -> None:
        raise ValueError(f"non-standard JSON constant {constant}")

    plan = json.loads(proc.stdout, parse_constant=refuse)["plan"]
    assert {t["request_rate"] for t in plan} == {2, 8, 32, 128, "inf"}
    assert {t["batch_size"] for t in plan} == {None}
