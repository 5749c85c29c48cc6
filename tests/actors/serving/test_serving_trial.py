"""Serving trials on the noop backend's simulated engine, in virtual time: the client
loop, the engine's schedule, saturation, the time limit and the trial's columns."""

from __future__ import annotations

import math

import numpy as np
import pytest

from actors.backends.base import ModelSpec
from actors.backends.noop import NoopBackend
from actors.serving.records import ServingRequest
from actors.serving_measure import measure_serving_trial
from actors.telemetry import NullTelemetry
from sweeper.core.results import RequestRecord
from sweeper.core.schema import trials_columns
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.fake_nvml import FakeClock


def noop(**options) -> tuple[NoopBackend, FakeClock]:
    # Virtual time: it moves only when the backend sleeps.
    backend, clock = NoopBackend(), FakeClock(100.0)
    backend.clock, backend.sleep = clock, clock.sleep
    sweep = sweep_of(rate=1.0, noop=options)
    backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", expand(sweep)[0][0].backend_options, serving=True))
    return backend, clock


def sweep_of(rate, noop=None, **workload):
    return parse_sweep({
        "name": "serve", "models": "tiny-llama", "backends": "noop", "precisions": "fp32",
        "backend_options": {"noop": {"step_s": 0.01, "prefill_s": 0.02, "max_batch": 8, **(noop or {})}},
        "workload": {"mode": "serving", "input_len": 8, "output_len": 10, "request_rate": rate,
                     "num_prompts": 100, **workload},
        "measure": {"idle_s": 0, "min_window_s": 0.5},
    })


def request(i: int, at_s: float, output_len: int = 3) -> ServingRequest:
    return ServingRequest(i, np.arange(8), output_len, at_s)


def test_the_simulated_engine_runs_the_documented_schedule():
    backend, clock = noop(step_s=0.1, prefill_s=0.2, max_batch=4)
    run = backend.serve([request(0, 0.0), request(1, 0.25)], max_concurrency=None, deadline_s=1e9)
    t0 = run.t_start_s
    a, b = run.requests
    # A: prefill step to 0.2, then 0.3; B is sent at its arrival (0.25), mid-step, and waits
    # in the engine for that step's end (0.3); its prefill step (0.3-0.5) gives A its last token too.
    assert [round(t - t0, 6) for t in a.token_times_s] == [0.2, 0.3, 0.5]
    assert round(b.arrival_s - t0, 6) == 0.25 and round(b.submit_s - t0, 6) == 0.25
    assert b.send_lateness_s == 0.0 and a.send_lateness_s == 0.0
    assert round(b.scheduled_s - t0, 6) == 0.3 and b.queue_s == pytest.approx(0.05)
    assert [round(t - t0, 6) for t in b.token_times_s] == [0.5, 0.6, 0.7]
    assert b.ttft_s == pytest.approx(0.25) and b.tpot_s == pytest.approx(0.1)


def test_max_concurrency_holds_later_arrivals_back():
    backend, _ = noop(step_s=0.1, prefill_s=0.1, max_batch=16)
    run = backend.serve([request(i, 0.0) for i in range(4)], max_concurrency=2, deadline_s=1e9)
    t0 = run.t_start_s
    submits = sorted(round(r.submit_s - t0, 6) for r in run.requests)
    assert submits == [0.0, 0.0, 0.3, 0.3]  # the second pair waits for the first to finish
    assert all(r.arrival_s == t0 for r in run.requests)
    # ... which is the cap's wait, not the client's: due when the slots came free, sent then.
    assert sorted(round(r.send_due_s - t0, 6) for r in run.requests) == submits
    assert all(r.send_lateness_s == 0.0 for r in run.requests)


def test_a_run_past_its_deadline_records_what_it_has_and_returns():
    backend, clock = noop(step_s=0.1, prefill_s=0.1, max_batch=1)
    run = backend.serve([request(i, 0.0, output_len=50) for i in range(5)], max_concurrency=None,
                        deadline_s=clock() + 6.0)
    assert len(run.requests) == 5 and len(run.completed) == 1
    assert {r.error for r in run.failed} == {"unfinished: the run's time limit passed"}
    assert clock() < 100.0 + 7.0


def measure(rate, noop_options=None, measure_options=None, backend_class=NoopBackend,
            **workload) -> tuple[dict, list[RequestRecord]]:
    sweep = sweep_of(rate, noop_options, **workload)
    if measure_options:
        sweep = sweep.model_copy(update={"measure": sweep.measure.model_copy(update=measure_options)})
    trial = expand(sweep)[0][0]
    backend, clock = backend_class(), FakeClock(100.0)
    backend.clock, backend.sleep = clock, clock.sleep
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", trial.backend_options, serving=True))
    measured = measure_serving_trial(backend, trial, load, NullTelemetry(reason="test"), clock=clock)
    return measured.row, measured.requests


def test_an_overload_is_flagged_saturated_and_a_light_load_is_not():
    # 8 requests a step of ~0.01-0.02 s, 10 tokens each: capacity is about 400-800 req/s... of
    # tokens: 8 x 100 tokens/s = 800 tokens/s = 80 req/s. 20 req/s is light, 400 req/s is not.
    light, _ = measure(20.0)
    heavy, _ = measure(400.0)
    assert light["saturated"] is False and light["unstable"] is False
    assert heavy["saturated"] is True and heavy["unstable"] is True
    assert "saturated" in heavy["unstable_reason"]
    assert heavy["achieved_rate_req_s"] < 0.5 * heavy["offered_rate_req_s"]
    assert light["achieved_rate_req_s"] == pytest.approx(light["offered_rate_req_s"], rel=0.2)
    assert heavy["steady_batch"] == 8 and heavy["mean_running_batch"] == pytest.approx(8, abs=0.1)


def test_everything_sent_at_once_at_capacity_is_saturated_but_not_unstable():
    row, _ = measure("inf")
    assert row["offered_rate_req_s"] == math.inf
    assert row["saturated"] is True and row["unstable"] is False


def test_a_serving_row_fills_every_serving_column_and_leaves_energy_null_on_cpu():
    row, requests = measure(50.0, slo={"ttft_ms": 40, "tpot_ms": 15})
    serving = ["n_requests", "n_failed_requests", "offered_rate_req_s", "achieved_rate_req_s", "duration_s",
               "output_tokens", "throughput_tok_s", "total_throughput_tok_s", "run_duration_s",
               "window_start_s", "window_end_s", "steady_batch", "mean_running_batch", "max_concurrency_reached",
               "saturated", "queue_growth", "goodput_req_s", "slo_attainment", "queue_s",
               *(f"{m}{s}" for m in ("ttft", "tpot", "itl", "e2e") for s in ("_s", "_p50_s", "_p90_s", "_p99_s"))]
    assert [c for c in serving if row.get(c) is None] == []
    assert row["n_requests"] == 100 and row["n_failed_requests"] == 0
    for energy in ("energy_j", "energy_per_token_j", "energy_per_request_j", "run_energy_j"):
        assert row[energy] is None  # not measured is not zero
    assert set(row) <= {c.name for c in trials_columns()}
    assert len(requests) == 100 and all(isinstance(r, RequestRecord) for r in requests)
    good = sum(r.meets_slo for r in requests)
    assert row["slo_attainment"] == pytest.approx(good / 100)
    assert row["goodput_req_s"] == pytest.approx(good / row["run_duration_s"])
    assert all(len(r.itl_s) == 9 for r in requests)


def test_a_run_cut_by_the_time_limit_fails_with_what_it_measured():
    # One request at a time, 10 tokens of 10 ms: 100 requests need about 12 s; the run may use
    # 80 % of a 5 s limit.
    row, requests = measure(400.0, {"max_batch": 1}, {"timeout_s": 5.0})
    assert row["status"] == "failed" and row["reason"] == "timeout"
    assert "requests had not finished when the run's time limit" in row["error"]
    assert 0 < row["n_failed_requests"] < 100 and row["ttft_p50_s"] is not None
    assert {r.error for r in requests if r.error} <= {"unfinished: the run's time limit passed",
                                                           "not sent: the run's time limit passed"}


def test_the_simulated_prefix_cache_holds_shared_prefixes_and_shortens_their_prefill():
    """noop's prefix_block: shared prefixes (prefix_repetition) are held once a request with each
    has been admitted, each request records what was held, the trial its hit rate, and a step
    that admits mostly-cached prompts is that much shorter, in virtual time."""
    shared = {"dataset": {"prefix_repetition": {"prefix_len": 32, "suffix_len": 8, "num_prefixes": 2}},
              "input_len": None, "arrival": "constant"}
    slow = {"step_s": 0.005, "prefill_s": 0.1}
    cold, cold_requests = measure(2.0, slow, **shared)
    warm, warm_requests = measure(2.0, {**slow, "prefix_block": 16}, **shared)
    assert {r.cached_tokens for r in cold_requests} == {None} and cold["prefix_cache_hit_rate"] is None
    # Warm-up sent the same prefixes: every measured prompt finds its two 16-token blocks held.
    assert {r.cached_tokens for r in warm_requests} == {32}
    assert warm["prefix_cache_hit_rate"] == pytest.approx(32 / 40)
    # One request every 0.5 s, each done in under 0.15 s: each is admitted alone on arrival, its
    # prefill 0.1 s cold and 0.1 x 8/40 = 0.02 s with its prefix cached.
    assert cold["ttft_p50_s"] == pytest.approx(0.1) and warm["ttft_p50_s"] == pytest.approx(0.02)


def test_a_prefix_cache_holds_leading_blocks_only_and_never_a_prompts_last_token():
    from actors.backends.noop import PrefixCache

    cache = PrefixCache(4)
    assert cache.admit(list(range(12))) == 0  # nothing held yet; its blocks 0-3 and 4-7 now are
    assert cache.admit(list(range(12))) == 8  # not its last block: it holds the last token
    assert cache.admit(list(range(13))) == 8  # its third block (8-11) is new; now held
    assert cache.admit(list(range(13))) == 12
    assert cache.admit([*range(4), 99, 5, 6, 7, *range(8, 13)]) == 4  # a block differs: no hit after it
    assert cache.admit([9, 9, 9, 9, *range(4, 12)]) == 0  # the same block after another prefix is another block
    assert cache.admit([0, 1, 2]) == 0  # no full block
