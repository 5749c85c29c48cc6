"""At request_rate inf the plan warns when num_prompts leaves the engine full too briefly for
a steady window worth measuring: a warning, never a refusal."""

from __future__ import annotations

import json

import yaml

from sweeper.plan.expand import expand, make_plan
from sweeper.plan.spec import parse_sweep
from sweeper.plan.steady import engine_cap, inf_rate_warning
from tests.conftest import run_cli

SWEEP = {
    "name": "s", "models": "tiny-llama", "backends": ["noop"], "precisions": "fp32",
    "backend_options": {"noop": {"max_batch": 64}}, "repeats": 2,
    "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": [2, "inf"],
                 "max_concurrency": [8, 128], "num_prompts": 100},
}


def test_the_h100_case_is_told_how_many_prompts_a_steady_window_needs():
    # 300 prompts against max_num_seqs 256 left a 1.7-2.0 s window on an H100: 44 completions.
    warning = inf_rate_warning(300, 256, "backend_options.vllm.max_num_seqs")
    assert warning is not None
    assert warning.startswith("request_rate inf with num_prompts 300 against backend_options.vllm.max_num_seqs 256: ")
    assert "the steady window holds about 44 requests' completions, 0.17 of a request's life" in warning
    assert "under 512 prompts it is full for less of the run than it drains" in warning
    assert "(k + 1) x 256 prompts" in warning and "256 x (1 + W / T)" in warning
    assert warning.endswith("use num_prompts >= 1024 (4 x 256) for k = 3")


def test_enough_prompts_warn_of_nothing_and_one_batch_has_no_window():
    assert inf_rate_warning(1024, 256, "max_concurrency") is None
    assert "no steady window" in (inf_rate_warning(200, 256, "max_concurrency") or "")
    middle = inf_rate_warning(700, 256, "max_concurrency") or ""
    assert "about 444 requests' completions, 1.7 of a request's life" in middle and "under 512" not in middle


def test_the_cap_is_the_smaller_of_the_client_s_and_the_engine_s():
    trials, _ = expand(parse_sweep(SWEEP))
    caps = {(t.max_concurrency, engine_cap(t)) for t in trials}
    assert caps == {(8, (8, "max_concurrency")), (128, (64, "backend_options.noop.max_batch"))}
    vllm = parse_sweep({**SWEEP, "backends": ["vllm"], "backend_options": {},
                        "workload": {**SWEEP["workload"], "max_concurrency": None}})
    assert {engine_cap(t) for t in expand(vllm)[0]} == {None}  # vLLM's own default: unknown here


def test_the_plan_warns_once_per_run_shape_and_only_at_inf():
    plan = make_plan(parse_sweep(SWEEP), "cpu")
    assert len(plan.runnable) == 8 and len(plan.skipped) == 0  # nothing refused
    assert plan.warnings == [inf_rate_warning(100, 64, "backend_options.noop.max_batch")]
    finite = parse_sweep({**SWEEP, "workload": {**SWEEP["workload"], "request_rate": [2, 500]}})
    assert make_plan(finite, "cpu").warnings == []


def test_sweeper_plan_prints_the_warning_and_exits_0(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    proc = run_cli("plan", str(path), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert ("warning: request_rate inf with num_prompts 100 against backend_options.noop.max_batch 64: "
            in proc.stderr)
    assert "use num_prompts >= 256 (4 x 64) for k = 3" in proc.stderr
    as_json = run_cli("plan", str(path), "--device", "cpu", "--json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["warnings"] == [inf_rate_warning(100, 64, "backend_options.noop.max_batch")]
