"""Capacity and configuration searches end to end: the real command line, Ray actors running
the noop engine in real time, Parquet and DuckDB. What the searches find is held to a known
truth in test_search_run.py (scripted, exact) and tests/actors/serving/test_capacity_knee.py
(virtual time); here the wall clock runs the engine, so these tests hold the results directory
to its shape: every probe a row, one capacity row per configuration, a resume that measures
nothing twice, the summary's lines."""

from __future__ import annotations

import json

import duckdb
import pytest

from tests.conftest import run_cli

CAPACITY = """\
name: cap
models: tiny-llama
backends: noop
precisions: fp32
backend_options:
  noop: {step_s: 0.02, max_batch: 8}
workload:
  mode: serving
  input_len: 8
  output_len: 4
  num_prompts: 100
  arrival: constant
  request_rate: {capacity: {low: 40, high: 640, resolution: 0.5}}
  slo: {ttft_ms: 80}
measure: {idle_s: 0, min_window_s: 0.2}
"""

SEARCH = """\
name: srch
models: tiny-llama
backends: noop
precisions: [fp32, bf16]
backend_options:
  noop: {step_s: 0.01}
workload:
  mode: serving
  input_len: 8
  output_len: 4
  num_prompts: 40
  request_rate: 50
  slo: {ttft_ms: 100}
measure: {idle_s: 0, min_window_s: 0.1}
search:
  objective: {minimize: ttft_p99_s}
  constraints: {slo: true}
  space:
    backend_options.noop.max_batch: {low: 1, high: 16, log: true, int: true}
  budget: {trials: 3}
"""


@pytest.mark.slow
def test_a_capacity_search_leaves_its_probes_and_its_answer_and_resumes_measuring_nothing(write_sweep, tmp_path):
    path, out = write_sweep(CAPACITY), tmp_path / "cap"
    proc = run_cli("run", str(path), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "capacity tiny-llama noop/fp32 max_batch=8 step_s=0.02 in=8 out=4: " in proc.stderr
    probes = duckdb.sql(f"SELECT * FROM '{out}/trials.parquet' ORDER BY probe_step").df()
    (capacity,) = duckdb.sql(f"SELECT * FROM '{out}/capacity.parquet'").df().to_dict("records")
    assert len(probes) == capacity["n_probes"] >= 3 and set(probes["status"]) == {"ok"}
    assert list(probes["probe_step"]) == list(range(len(probes))) and probes["capacity_id"].nunique() == 1
    # Low, then doubled while it held; a probe the search could not trust (unstable on a busy
    # machine) is measured again at once at its load, with twice the requests.
    loads = list(probes["request_rate"])
    assert list(dict.fromkeys(loads))[:3] == [40.0, 80.0, 160.0], loads
    for i in range(1, len(loads)):
        if loads[i] == loads[i - 1]:
            assert probes["num_prompts"][i] == 2 * probes["num_prompts"][i - 1], loads
        else:
            assert loads[i] not in loads[:i], loads  # no load is probed again later
    assert capacity["capacity_id"] == probes["capacity_id"][0] and capacity["bounded_by"] in ("slo", "saturation", "high")
    if capacity["capacity_load"] is not None:
        passed = probes[probes["trial_id"] == capacity["pass_trial_id"]].iloc[0]
        assert passed["request_rate"] == capacity["capacity_load"] and passed["slo_attainment"] >= 0.99
    plan = json.loads((out / "plan.json").read_text())
    assert sorted(plan["trial_ids"]) == sorted(probes["trial_id"]) and plan["derived"] == {"capacity": [capacity["capacity_id"]]}
    query = run_cli("query", str(out), "SELECT count(*) AS n FROM capacity", "--json")
    assert query.returncode == 0 and json.loads(query.stdout) == [{"n": 1}]

    again = run_cli("run", str(path), "-o", str(out), "-q")
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming: {len(probes)} trial(s) already ok; 0 to run" in again.stderr  # (no --address: Ray not started)
    # A run of its own (no --address) replays the stored probes before it would start Ray.
    alone = run_cli("run", str(path), "-o", str(out), "-q", own_ray=True)
    assert alone.returncode == 0 and "0 to run (Ray not started)" in alone.stderr, alone.stderr[-2000:]
    (same,) = duckdb.sql(f"SELECT * FROM '{out}/capacity.parquet'").df().to_dict("records")
    assert (same["capacity_load"], same["fail_load"], same["n_probes"]) == \
        (capacity["capacity_load"], capacity["fail_load"], capacity["n_probes"])


@pytest.mark.slow
def test_a_configuration_search_runs_its_budget_names_its_best_and_resumes(write_sweep, tmp_path):
    path, out = write_sweep(SEARCH), tmp_path / "srch"
    plan = run_cli("plan", str(path))
    assert plan.returncode == 0 and "search (tpe, seed 0): minimize ttft_p99_s" in plan.stdout + plan.stderr
    proc = run_cli("run", str(path), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "3 point(s) in" in proc.stderr and "stopped: budget.trials (3) reached" in proc.stderr
    assert "  best: step " in proc.stderr or "no point met the constraints" in proc.stderr
    rows = duckdb.sql(f"SELECT * FROM '{out}/trials.parquet'").df()
    assert len(rows) == 3 and sorted(rows["search_step"]) == [0, 1, 2] and rows["search_id"].nunique() == 1
    params = [json.loads(p) for p in rows["search_params"]]
    assert all(1 <= p["backend_options.noop.max_batch"] <= 16 and p["precision"] in ("fp32", "bf16") for p in params)
    again = run_cli("run", str(path), "-o", str(out), "-q")
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resuming: 3 trial(s) already ok; 0 to run" in again.stderr and "3 point(s) in" in again.stderr


@pytest.mark.parametrize("change, expected", [
    (("request_rate: {capacity: {low: 40, high: 640, resolution: 0.5}}",
      "request_rate: {capacity: {low: 640, high: 40}}"), "workload.request_rate.capacity: low (640) must be below high (40)"),
    (("request_rate: {capacity: {low: 40, high: 640, resolution: 0.5}}",
      "request_rate: {capacity: {low: 4, high: 64}}\n  max_concurrency: {capacity: {low: 1, high: 8}}"),
     "give request_rate or max_concurrency as a capacity range, not both"),
    (("request_rate: {capacity: {low: 40, high: 640, resolution: 0.5}}",
      "request_rate: {capacity: {low: 4, high: .inf}}"), "request_rate.capacity.high: must be a finite number"),
    (("request_rate: {capacity: {low: 40, high: 640, resolution: 0.5}}\n  slo: {ttft_ms: 80}",
      "request_rate: inf\n  max_concurrency: {capacity: {low: 1, high: 64}}"),
     "max_concurrency.capacity: a concurrency's capacity is the most requests in flight that hold an SLO"),
    (("request_rate: {capacity: {low: 40, high: 640, resolution: 0.5}}",
      "request_rate: inf\n  max_concurrency: {capacity: {low: 1.5, high: 64}}"),
     "max_concurrency.capacity.low: requests in flight are a whole number"),
])
def test_bad_capacity_ranges_exit_2_naming_the_field(write_sweep, change, expected):
    r = run_cli("plan", str(write_sweep(CAPACITY.replace(*change))))
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.parametrize("change, expected", [
    (("minimize: ttft_p99_s", "minimize: ttft_p99"), "search.objective[0]: 'ttft_p99' is not a numeric column of the trials table"),
    (("{low: 1, high: 16, log: true, int: true}", "{low: 16, high: 1}"), "search.space.backend_options.noop.max_batch: low (16) must be below high (1)"),
    (("{low: 1, high: 16, log: true, int: true}", "{low: 0, high: 16, log: true}"), "a log range cannot reach zero or below"),
    (("constraints: {slo: true}", "constraints: {slo: true, ttft_p99: {max: 1}}"), "search.constraints.ttft_p99: not a numeric column"),
    (("constraints: {slo: true}", "constraints: {min_capacity_req_s: 5}"), "search.constraints.min_capacity_req_s: needs a capacity search"),
    (("budget: {trials: 3}", "budget: {trials: 0}"), "search.budget.trials: Input should be greater than 0"),
    (("budget: {trials: 3}", "budget: {}"), "search.budget: give trials, gpu_hours or both"),
    (("backend_options.noop.max_batch", "backend_options.noop.max_batches"), "noop has no option 'max_batches'"),
    (("backend_options.noop.max_batch", "backend_options.vllm.max_num_seqs"), "vllm is not among this sweep's backends"),
    (("request_rate: 50", "request_rate: [50, 100]"), "workload.request_rate: a search scores each configuration at one load"),
])
def test_bad_search_blocks_exit_2_naming_the_field(write_sweep, change, expected):
    r = run_cli("plan", str(write_sweep(SEARCH.replace(*change))))
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.slow
def test_a_bad_search_block_stops_run_before_ray_starts(write_sweep):
    r = run_cli("run", str(write_sweep(SEARCH.replace("budget: {trials: 3}", "budget: {trials: 0}"))))
    assert r.returncode == 2 and "search.budget.trials" in r.stderr and "starting Ray" not in r.stderr


SEARCH4 = """
name: search4
models: tiny-llama
backends: noop
backend_options: {{noop: {{gate_file: "{gate}"}}}}
precisions: [fp32, bf16]
batch_sizes: [1, 2, 4, 8]
workload: {{input_len: 8, output_len: 4}}
measure: {{warmup_iters: 0, min_iters: 1, min_duration_s: 0.2, idle_s: 0}}
search:
  objective: {{maximize: throughput_tok_s}}
  space:
    backend_options.noop.step_s: {{low: 0.001, high: 0.01, log: true}}
  budget: {{trials: 8}}
"""


@pytest.mark.slow
def test_a_search_keeps_four_logical_gpus_busy_with_a_point_each(tmp_path):
    """Four GPUs (Ray's logical ones): every trial waits at a gate that opens only once four run
    at once, so a search that kept fewer points out than GPUs would open it only on its time limit."""
    from tests.cluster_scenarios import run_scenario
    from tests.conftest import ROOT

    sweep = tmp_path / "search4.yaml"
    sweep.write_text(SEARCH4.format(gate=tmp_path / "gate"))
    info = run_scenario("search4", sweep, tmp_path / "out", ROOT)
    assert info["gate"] == "4 trials running at once" and info["most_running"] == 4
    assert (info["gpus"], info["ok"], info["failed"], info["points"]) == (4, 8, 0, 8)
