"""A capacity search against the noop backend's simulated engine, in virtual time: the engine's
knee is known from its cost model, so the capacity the search reports can be held to it.

With every step as long as a prefill step (``prefill_s`` unset: one ``step_s``), each request
holds one of ``max_batch`` slots for exactly ``output_len`` steps, so the engine completes at
most ``max_batch / (output_len * step_s)`` requests a second. Below that, evenly spaced
arrivals wait at most a step or two for a slot; above it, the queue grows without bound and a
TTFT bound of a few steps fails for most requests."""

from __future__ import annotations

import pytest

from actors.backends.base import ModelSpec
from actors.backends.noop import NoopBackend
from actors.serving_measure import measure_serving_trial
from actors.telemetry import NullTelemetry
from sweeper.core.capacity import BoundedBy, Probe, capacity, next_probe
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.fake_nvml import FakeClock


def find_capacity(max_batch: int, output_len: int, step_s: float, seed: int, *, arrival: str = "constant",
                  ttft_ms: float | None = None, resolution: float = 0.05):
    workload = {"mode": "serving", "input_len": 8, "output_len": output_len, "num_prompts": 400,
                "arrival": arrival, "seed": seed,
                "request_rate": {"capacity": {"low": 1, "high": 1000, "resolution": resolution}}}
    if ttft_ms is not None:
        workload["slo"] = {"ttft_ms": ttft_ms}
    sweep = parse_sweep({"name": "knee", "models": "tiny-llama", "backends": "noop", "precisions": "fp32",
                         "backend_options": {"noop": {"step_s": step_s, "max_batch": max_batch}},
                         "workload": workload, "measure": {"idle_s": 0, "min_window_s": 0.5}})
    first = expand(sweep)[0][0]
    search = first.load_search
    probes: list[Probe] = []
    while (ask := next_probe(search, probes)) is not None:
        trial = first.probe(ask.load, len(probes), ask.stretch)
        backend, clock = NoopBackend(), FakeClock(100.0)  # virtual time: it moves only when the engine sleeps
        backend.clock, backend.sleep = clock, clock.sleep
        info = backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", trial.backend_options, serving=True))
        measured = measure_serving_trial(backend, trial, info, NullTelemetry(reason="test"), clock=clock)
        probes.append(Probe.from_row(search, ask.load, {**measured.row, "status": "ok", "trial_id": trial.trial_id},
                                     ask.stretch))
    return capacity(search, probes, first.columns()), probes


@pytest.mark.parametrize(("max_batch", "output_len", "step_s", "ttft_ms", "seed"), [
    (8, 10, 0.01, 50, 0),
    (8, 10, 0.01, 50, 1),
    (4, 16, 0.005, 30, 2),
    (32, 8, 0.02, 60, 3),
])
def test_the_engine_knee_is_found_within_the_resolution(max_batch, output_len, step_s, ttft_ms, seed):
    knee = max_batch / (output_len * step_s)
    found, probes = find_capacity(max_batch, output_len, step_s, seed, ttft_ms=ttft_ms)
    assert found.bounded_by == BoundedBy.SLO and found.precise
    # The load that held is at most the knee, the one that failed above it, and the two within 5 %.
    assert found.capacity_load <= knee * 1.001
    assert found.fail_load >= knee / 1.05
    assert found.fail_load / found.capacity_load <= 1.05
    assert found.capacity_load >= knee / 1.05 ** 2
    assert found.slo_attainment >= 0.99 and found.ttft_p99_s <= ttft_ms / 1000
    assert len(probes) <= first_search_max_probes()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_under_poisson_arrivals_the_capacity_is_below_the_engine_knee(seed):
    # Random arrivals queue before the engine is full: the TTFT bound fails below the knee.
    knee = 8 / (10 * 0.01)
    found, _ = find_capacity(8, 10, 0.01, seed, arrival="poisson", ttft_ms=100)
    assert found.bounded_by == BoundedBy.SLO
    assert knee / 2 < found.capacity_load < knee


def first_search_max_probes() -> int:
    from sweeper.core.capacity import LoadSearch

    return LoadSearch(axis="request_rate", low=1, high=1000, resolution=0.05).max_probes()


def test_a_concurrency_search_finds_the_engines_batch_and_its_rate():
    # Every request at once, at most c in flight: past the engine's 8 slots requests queue inside
    # it, and a TTFT bound of a few steps fails. A closed loop offers no rate to fall behind, so
    # the client's own waiting (which saturation counts at rate inf) does not fail a probe.
    sweep = parse_sweep({"name": "conc", "models": "tiny-llama", "backends": "noop", "precisions": "fp32",
                         "backend_options": {"noop": {"step_s": 0.01, "max_batch": 8}},
                         "workload": {"mode": "serving", "input_len": 8, "output_len": 10, "num_prompts": 400,
                                      "request_rate": "inf", "slo": {"ttft_ms": 35},
                                      "max_concurrency": {"capacity": {"low": 1, "high": 64}}},
                         "measure": {"idle_s": 0, "min_window_s": 0.5}})
    first = expand(sweep)[0][0]
    search = first.load_search
    probes: list[Probe] = []
    while (ask := next_probe(search, probes)) is not None:
        trial = first.probe(ask.load, len(probes), ask.stretch)
        backend, clock = NoopBackend(), FakeClock(100.0)
        backend.clock, backend.sleep = clock, clock.sleep
        info = backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", trial.backend_options, serving=True))
        measured = measure_serving_trial(backend, trial, info, NullTelemetry(reason="test"), clock=clock)
        probes.append(Probe.from_row(search, ask.load, {**measured.row, "status": "ok", "trial_id": trial.trial_id},
                                     ask.stretch))
    found = capacity(search, probes, first.columns())
    assert (found.capacity_concurrency, found.fail_load, found.bounded_by) == (8, 9, BoundedBy.SLO)
    assert found.capacity_req_s == pytest.approx(8 / (10 * 0.01), rel=0.01)  # the engine's knee, in req/s
