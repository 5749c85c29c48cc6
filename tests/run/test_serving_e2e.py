"""sweeps/serving.yaml end to end through the real command line, Ray and Parquet: the
noop and transformers rows of the shipped example, every serving column filled."""

from __future__ import annotations

import math

import duckdb
import pytest

from tests.conftest import ROOT, run_cli

SERVING_COLUMNS = ("offered_rate_req_s", "achieved_rate_req_s", "throughput_tok_s", "total_throughput_tok_s",
                   "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "e2e_p99_s",
                   "max_concurrency_reached", "mean_running_batch", "goodput_req_s", "slo_attainment",
                   "window_start_s", "window_end_s", "run_duration_s", "saturated", "n_failed_requests")


@pytest.mark.slow
def test_the_serving_example_runs_resumes_and_reports(tmp_path):
    out = tmp_path / "serving"
    proc = run_cli("run", str(ROOT / "sweeps" / "serving.yaml"), "-o", str(out), "-q")
    assert proc.returncode == 0, proc.stderr[-3000:]
    everything = duckdb.sql(f"SELECT * FROM '{out}/trials.parquet' ORDER BY backend, request_rate").df()
    # vLLM's rows are skipped on a machine without a GPU (or without vllm), with the reason.
    vllm = everything[everything["backend"] == "vllm"]
    assert len(vllm) == 5 and (set(vllm["status"]) == {"skipped"} or set(vllm["status"]) == {"ok"})
    trials = everything[everything["backend"] != "vllm"]
    assert len(trials) == 10 and set(trials["status"]) == {"ok"}, trials[["status", "error"]]
    assert set(trials["mode"]) == {"serving"} and set(trials["backend"]) == {"noop", "transformers"}
    empty = [c for c in SERVING_COLUMNS if trials[c].isna().any()]
    assert empty == []
    assert trials["energy_j"].isna().all() and trials["batch_size"].isna().all()
    assert math.isinf(trials["request_rate"].max())
    noop = trials[trials["backend"] == "noop"].set_index("request_rate")
    # The simulated engine serves 16 requests per 5-20 ms step: 2 req/s is light, 128 and inf are not.
    assert not noop.loc[2.0, "saturated"] and noop.loc[128.0, "saturated"] and noop.loc[math.inf, "saturated"]
    # The example's SLO (TPOT 20 ms) sits at the simulated step's longest: on a busy machine a
    # stall can push one request past it, so the row is checked against its own requests, and
    # light load against saturation, not against a perfect score.
    met = dict(duckdb.sql(f"SELECT trial_id, avg(meets_slo::INT) FROM '{out}/requests.parquet' "
                          "GROUP BY trial_id").fetchall())
    assert all(met[t] == pytest.approx(a) for t, a in zip(trials["trial_id"], trials["slo_attainment"], strict=True))
    assert noop.loc[2.0, "slo_attainment"] > noop.loc[math.inf, "slo_attainment"]

    requests = duckdb.sql(f"SELECT trial_id, count(*) AS n, min(len(itl_s)) AS gaps, "
                          f"bool_and(error IS NULL) AS ok FROM '{out}/requests.parquet' GROUP BY trial_id").df()
    requests = requests[requests["trial_id"].isin(trials["trial_id"])]
    assert len(requests) == 10 and set(requests["gaps"]) == {15} and requests["ok"].all()
    counted = dict(zip(requests["trial_id"], requests["n"], strict=True))
    assert all(counted[t] == n for t, n in zip(trials["trial_id"], trials["n_requests"], strict=True))
    # 64 prompts, or fewer where duration_s (10 s) ends the arrivals first: at 2 req/s, about 20.
    assert noop.loc[8.0, "n_requests"] == 64 and 10 < noop.loc[2.0, "n_requests"] < 40

    again = run_cli("run", str(ROOT / "sweeps" / "serving.yaml"), "-o", str(out), "-q")
    assert again.returncode == 0 and "10 trial(s) already ok" in again.stderr and "0 to run" in again.stderr

    report = run_cli("report", str(out), "--slo-ttft-ms", "100", "--slo-percentile", "90")
    assert report.returncode == 0, report.stderr
    page = (out / "report" / "index.html").read_text()
    assert "Latency vs achieved throughput (serving)" in page and "Goodput vs offered rate" in page
    assert "p90 TTFT ≤ 100 ms" in page
    bad = run_cli("report", str(out), "--slo-ttft-ms", "100", "--slo-percentile", "95")
    assert bad.returncode == 2 and "--slo-percentile must be one of 50, 90, 99" in bad.stderr
