"""One serving-mode trial: requests arriving at a rate, measured over the steady state.

warm-up (a burst of requests, unrecorded) -> idle baseline -> the run, inside one
energy window: every request sent at its arrival time, every token stamped ->
the steady-state window (actors.serving.stats) -> throughput, latency, goodput
and energy over that window; each request's energy over the whole run
(actors.serving.attribution).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from actors.backends.base import Backend, LoadInfo
from actors.measure import Measurement, reply_length_columns
from actors.serving import attribution
from actors.serving.arrivals import serving_requests
from actors.serving.records import ServedRun
from actors.serving.stats import (
    SteadyWindow,
    achieved_rate,
    in_flight,
    latency_columns,
    meets,
    running,
    saturation,
    steady_window,
    window_output_tokens,
)
from actors.stability import Verdict
from actors.stages import stage
from actors.telemetry.baseline import trial_baseline
from actors.workload import prompt_source
from sweeper.core.status import Reason, Status
from sweeper.core.trial import Trial

if TYPE_CHECKING:
    from actors.telemetry import TelemetryBase

log = logging.getLogger(__name__)

# Warm-up bursts hold at most this many requests: enough to fill an engine's first
# batches (and, for transformers, build its paged cache), few enough to stay short.
WARMUP_REQUESTS = 8
# Without a trial time limit, a run gives up this long after its last arrival.
DEFAULT_RUN_LIMIT_S = 3600.0
# Share of the trial's time limit the run may use, leaving time to write what it measured.
RUN_SHARE_OF_TIMEOUT = 0.8


def _run_deadline(trial: Trial, last_arrival_s: float, started_s: float, now_s: float) -> float:
    timeout_s = trial.measure.timeout_s
    if timeout_s is not None:
        return started_s + RUN_SHARE_OF_TIMEOUT * timeout_s
    return now_s + last_arrival_s + DEFAULT_RUN_LIMIT_S


def measure_serving_trial(backend: Backend, trial: Trial, load: LoadInfo, telemetry: TelemetryBase,
                          clock: Callable[[], float] = time.monotonic) -> Measurement:
    settings, m = trial.serving, trial.measure
    rate = trial.request_rate
    if settings is None or rate is None:
        raise ValueError(f"trial {trial.trial_id} is not a serving-mode trial")
    started = clock()

    source = prompt_source(trial, load.vocab_size, trial.model_ref.max_positions)

    def requests(stream: int, count: int | None = None) -> list:
        made = serving_requests(settings, request_rate=rate, source=source, seed=trial.seed, stream=stream)
        return made[:count] if count is not None else made

    # Warm-up: bursts of requests at once, until both warmup_iters bursts and warmup_s are done.
    t_warm, warmed = clock(), 0
    with stage("warmup"):
        while warmed < max(m.warmup_iters, 1) or clock() - t_warm < m.warmup_s:
            burst = [dataclasses.replace(r, arrival_offset_s=0.0)
                     for r in requests(stream=1 + warmed, count=WARMUP_REQUESTS)]
            backend.serve(burst, max_concurrency=trial.max_concurrency,
                          deadline_s=_run_deadline(trial, 0.0, started, clock()))
            warmed += 1
        backend.sync()

    t_idle = clock()
    with stage("idle_baseline"):
        baseline, baseline_cols = trial_baseline(telemetry, m)
    idle_power_w = baseline.power_w if baseline is not None else None

    measured = requests(stream=0)
    last_arrival_s = max(r.arrival_offset_s for r in measured)
    with stage("measure"), telemetry.measure(trial.trial_id) as handle:
        run = backend.serve(measured, max_concurrency=trial.max_concurrency,
                            deadline_s=_run_deadline(trial, last_arrival_s, started, clock()))
        backend.sync()
    t_end = clock()

    window = steady_window(run)
    row, request_energy = _columns(trial, run, window, telemetry, handle, idle_power_w, last_arrival_s)
    row.update(baseline_cols)
    if source.varies():
        done = [r for r in run.requests if r.ok]
        row.update(reply_length_columns([r.prompt_tokens for r in done], [r.output_tokens for r in done]))
    row.update(_verdict(row, window, trial, baseline, telemetry, handle).columns())
    if len(run.failed) == len(run.requests):
        raise RuntimeError(f"every request of the run failed: {run.failed[0].error}")
    cut = sum(1 for r in run.failed if r.cut_by_time_limit)
    if cut:
        # The trial's time limit cut the run: failed (and re-run by --retry-failed), with what it measured.
        row.update(status=Status.FAILED, reason=Reason.TIMEOUT,
                   error=f"{cut} of {len(run.requests)} requests had not finished when the run's time limit "
                         f"({RUN_SHARE_OF_TIMEOUT:.0%} of measure.timeout_s) passed")
    marks = _marks(run, window)
    timeline = None
    if telemetry.active:
        import pyarrow.compute as pc

        table = telemetry.timeline_table(trial.trial_id, t_idle, t_end, marks=marks)
        timeline = table.set_column(table.schema.get_field_index("t_s"), "t_s",
                                    pc.subtract(table.column("t_s"), run.t_start_s))
    return Measurement(row=row, requests=_request_rows(trial, run, window, request_energy), timeline=timeline)


def _marks(run: ServedRun, window: SteadyWindow | None) -> list[tuple[str, float, float]]:
    if window is None:
        return []
    return [("ramp", run.t_start_s, window.t_start_s), ("steady", window.t_start_s, window.t_end_s),
            ("drain", window.t_end_s, run.t_end_s)]


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _columns(trial: Trial, run: ServedRun, window: SteadyWindow | None, telemetry: TelemetryBase,
             handle: Any, idle_power_w: float | None, last_arrival_s: float
             ) -> tuple[dict[str, Any], list[float] | None]:
    settings = trial.serving
    assert settings is not None
    rate = trial.request_rate or math.inf
    ok = run.completed
    offered = rate if math.isinf(rate) or last_arrival_s <= 0 else len(run.requests) / last_arrival_s
    run_s = run.t_end_s - run.t_start_s
    bounds = settings.slo.bounds_s() if settings.slo is not None else {}
    good = sum(meets(r, bounds) for r in run.requests) if bounds else None
    row: dict[str, Any] = {
        "n_requests": len(run.requests), "n_failed_requests": len(run.failed),
        "offered_rate_req_s": offered, "run_duration_s": run_s,
        "max_concurrency_reached": int(in_flight(run.requests, run.t_end_s).values.max(initial=0)),
        "goodput_req_s": _ratio(good, run_s) if good is not None else None,
        "slo_attainment": good / len(run.requests) if good is not None and run.requests else None,
        **latency_columns(run.requests),
    }
    if window is None or window.duration_s <= 0:
        row.update(duration_s=0.0, output_tokens=0, throughput_tok_s=None, requests_per_s=None)
        return row, None
    w0, w1 = window.t_start_s, window.t_end_s
    in_window = window_output_tokens(run, window)
    prompt_tokens = sum(r.prompt_tokens for r in ok if r.first_token_s is not None and w0 < r.first_token_s <= w1)
    achieved = achieved_rate(run, window)
    sat = saturation(run, window, offered, achieved)
    row.update(
        duration_s=window.duration_s, output_tokens=in_window,
        throughput_tok_s=in_window / window.duration_s,
        total_throughput_tok_s=(in_window + prompt_tokens) / window.duration_s,
        requests_per_s=achieved, achieved_rate_req_s=achieved,
        window_start_s=w0 - run.t_start_s, window_end_s=w1 - run.t_start_s,
        mean_running_batch=running(ok).mean(w0, w1), steady_batch=window.level,
        saturated=sat.saturated, saturation_reason=sat.reason, queue_growth=sat.queue_growth,
    )
    row.update(_energy_columns(telemetry, handle, window, in_window, idle_power_w))
    request_energy = None
    row.update(dict.fromkeys(("request_energy_method", "energy_per_request_j", "energy_per_request_p50_j",
                              "energy_per_request_p90_j", "attributed_energy_j")))
    if handle.window is not None:
        # Over the run's energy window itself (its boundaries a moment outside the first
        # arrival and the last token), so that the requests' energies sum to run_energy_j.
        request_energy = attribution.request_energies(run.requests, handle.window.t_start_s,
                                                      handle.window.t_end_s, telemetry.energies_between)
        done = [e for e, r in zip(request_energy, run.requests, strict=True) if r.ok]
        row.update(request_energy_method=attribution.METHOD,
                   energy_per_request_j=float(np.mean(done)) if done else None,
                   energy_per_request_p50_j=float(np.percentile(done, 50)) if done else None,
                   energy_per_request_p90_j=float(np.percentile(done, 90)) if done else None,
                   attributed_energy_j=float(sum(request_energy)))
    return row, request_energy


def _energy_columns(telemetry: TelemetryBase, handle: Any, window: SteadyWindow, output_tokens: int,
                    idle_power_w: float | None) -> dict[str, Any]:
    """The steady window's energy (the headline), the whole run's beside it."""
    from actors.telemetry import TelemetryError

    cols: dict[str, Any] = dict.fromkeys(("energy_j", "energy_per_token_j", "avg_power_w", "peak_power_w",
                                          "p99_power_w", "active_energy_j", "energy_method",
                                          "energy_uncertainty_j", "energy_per_token_uncertainty_j",
                                          "run_energy_j", "run_energy_uncertainty_j"))
    cols.update(telemetry.environment())
    cols["idle_power_w"] = idle_power_w
    cols["cpu_energy_j"], cols["dram_energy_j"] = handle.cpu_energy_j, handle.dram_energy_j
    if handle.window is None:
        return cols
    try:
        steady = telemetry.interval("steady", window.t_start_s, window.t_end_s)
    except TelemetryError as exc:
        log.warning("no energy for the steady window: %s", exc)
        return cols
    cols.update(
        energy_j=steady.energy_j, energy_per_token_j=_ratio(steady.energy_j, output_tokens),
        avg_power_w=steady.avg_power_w, peak_power_w=steady.peak_power_w, p99_power_w=steady.p99_power_w,
        active_energy_j=None if idle_power_w is None else steady.energy_j - idle_power_w * steady.duration_s,
        energy_method=steady.method, energy_uncertainty_j=steady.uncertainty_j,
        energy_per_token_uncertainty_j=_ratio(steady.uncertainty_j, output_tokens),
        run_energy_j=handle.window.energy_j, run_energy_uncertainty_j=handle.window.uncertainty_j,
    )
    return cols


def _verdict(row: dict[str, Any], window: SteadyWindow | None, trial: Trial, baseline: Any,
             telemetry: TelemetryBase, handle: Any) -> Verdict:
    """A serving trial's verdict (``actors.stability``): a steady window long enough to judge,
    its energy where GPUs are metered, no saturation below ``inf``, no failed request, a
    settled baseline."""
    verdict = Verdict()
    if window is None:
        verdict.flag("no steady state: no request completed while others were still being admitted at the "
                     "steady level (the run is shorter than one request's life there; raise num_prompts)")
    else:
        verdict.window_length(window.duration_s, trial.measure.window_floor_s, what="steady window")
    # Without GPUs energy is not measured, which is no flaw of the trial.
    if telemetry.active and handle.window is None:
        verdict.no_energy_window(handle.error)
    elif telemetry.active and window is not None and window.duration_s > 0 and row.get("energy_j") is None:
        verdict.flag("no energy for the steady window (see the actor's log)")
    rate = trial.request_rate
    if row.get("saturated") and rate is not None and not math.isinf(rate):
        verdict.flag(f"saturated: {row['saturation_reason']}")
    if row.get("n_failed_requests"):
        verdict.flag(f"{row['n_failed_requests']} of {row['n_requests']} requests failed")
    verdict.baseline(baseline)
    return verdict


def _request_rows(trial: Trial, run: ServedRun, window: SteadyWindow | None,
                  energies: list[float] | None) -> list[dict[str, Any]]:
    settings = trial.serving
    bounds = settings.slo.bounds_s() if settings is not None and settings.slo is not None else {}
    t0 = run.t_start_s

    def rel(t: float | None) -> float | None:
        return None if t is None else t - t0

    rows = []
    for k, r in enumerate(run.requests):
        rows.append({
            "trial_id": trial.trial_id, "request_index": r.index, "input_len": r.prompt_tokens,
            "output_tokens": r.output_tokens, "arrival_s": rel(r.arrival_s), "t_start_s": rel(r.submit_s),
            "scheduled_s": rel(r.scheduled_s), "first_token_s": rel(r.first_token_s), "finish_s": rel(r.finish_s),
            "ttft_s": r.ttft_s, "tpot_s": r.tpot_s, "e2e_s": r.e2e_s, "queue_s": r.queue_s,
            "itl_s": r.itl_s if r.ok else None,
            "in_window": (window is not None and r.finish_s is not None
                          and window.t_start_s < r.finish_s <= window.t_end_s),
            "meets_slo": meets(r, bounds) if bounds else None,
            "energy_j": energies[k] if energies is not None else None,
            "error": r.error,
        })
    return rows
