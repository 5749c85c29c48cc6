"""The measurement method of one trial, backend-agnostic.

warmup (unrecorded) -> idle baseline -> measured window: repeat generate until
both ``min_iters`` and ``min_duration_s`` are reached, device-synchronized at
both ends -> per-request timing, throughput, memory, energy.

Warm-up and the compilation of the trial's shape stay outside the window, so
the window holds steady-state work only; the idle baseline is taken just before
it, on the same GPUs, so that active energy is the window's excess over idle.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from actors.backends.base import Backend, Generation, LoadInfo
from actors.workload import RandomPrompts
from sweeper.core.trial import Trial

if TYPE_CHECKING:
    import pyarrow as pa

    from actors.telemetry import TelemetryBase


@dataclass
class Measurement:
    row: dict[str, Any]
    requests: list[dict[str, Any]]
    timeline: pa.Table | None  # the telemetry's samples over the trial, or None without GPUs


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def _mean(values: list[float]) -> float | None:
    return float(np.mean(values)) if values else None


def request_rows(generations: list[Generation], t0: float, input_len: int) -> list[dict[str, Any]]:
    rows = []
    for i, gen in enumerate(generations):
        for j, r in enumerate(gen.requests):
            ttft = r.t_first_token_s - r.t_start_s
            e2e = r.t_end_s - r.t_start_s
            rows.append({
                "iteration": i, "request_index": j, "input_len": input_len,
                "output_tokens": r.output_tokens, "t_start_s": r.t_start_s - t0,
                "ttft_s": ttft, "e2e_s": e2e,
                # vLLM's definition: the first token is prefill's, not decode's.
                "tpot_s": (e2e - ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else None,
            })
    return rows


def latency_columns(requests: list[dict[str, Any]]) -> dict[str, float | None]:
    ttft = [r["ttft_s"] for r in requests]
    tpot = [r["tpot_s"] for r in requests if r["tpot_s"] is not None]
    e2e = [r["e2e_s"] for r in requests]
    return {
        "ttft_s": _mean(ttft), "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
        "tpot_s": _mean(tpot), "tpot_p50_s": _pct(tpot, 50), "tpot_p99_s": _pct(tpot, 99),
        "e2e_s": _mean(e2e), "e2e_p50_s": _pct(e2e, 50),
    }


def measure_trial(backend: Backend, trial: Trial, load: LoadInfo, telemetry: TelemetryBase,
                  clock: Callable[[], float] = time.monotonic) -> Measurement:
    m = trial.measure
    prompts = RandomPrompts(load.vocab_size, trial.input_len, trial.batch_size, trial.seed)

    # Compilation and graph capture for the shape, timed apart: never in the window.
    prepared = backend.prepare(trial.batch_size, trial.input_len, trial.output_len)
    backend.reset_peak_memory()
    t_warm, warmed = clock(), 0
    while warmed < m.warmup_iters or clock() - t_warm < m.warmup_s:
        backend.generate(prompts.batch(-1 - warmed), trial.output_len)
        warmed += 1

    backend.sync()
    t_idle = clock()
    idle_power_w = telemetry.idle_baseline(m.idle_s) if telemetry.active and m.idle_s > 0 else None

    generations: list[Generation] = []
    with telemetry.measure(trial.trial_id) as handle:
        backend.sync()
        t0 = clock()
        while True:
            generations.append(backend.generate(prompts.batch(len(generations)), trial.output_len))
            if len(generations) >= m.min_iters and clock() - t0 >= m.min_duration_s:
                break
        backend.sync()
        t1 = clock()
    duration_s = t1 - t0

    requests = request_rows(generations, t0, trial.input_len)
    output_tokens = sum(g.output_tokens for g in generations)
    n_requests = len(requests)
    row: dict[str, Any] = {
        "n_iterations": len(generations), "n_requests": n_requests,
        "duration_s": duration_s, "output_tokens": output_tokens,
        "throughput_tok_s": output_tokens / duration_s,
        "requests_per_s": n_requests / duration_s,
        **latency_columns(requests),
        "peak_memory_bytes": backend.peak_memory_bytes(),
        "compile_s": prepared.compile_s, "compile_status": prepared.compile_status,
    }
    marks = [mark for g in generations for mark in g.marks]
    decode_tokens = sum(max(r.output_tokens - 1, 0) for g in generations for r in g.requests)
    row.update(telemetry.trial_columns(
        handle, idle_power_w=idle_power_w, marks=marks, output_tokens=output_tokens,
        requests=n_requests, decode_tokens=decode_tokens,
        iteration_bounds=[(g.t_start_s, g.t_end_s) for g in generations],
        min_window_s=m.min_window_s, max_iteration_cv=m.max_iteration_cv,
        duration_s=duration_s,
    ))
    if load.architecture is not None:
        from sweeper.core.gpus import held_gpu_names
        from sweeper.core.precisions import PRECISIONS
        from sweeper.core.roofline import roofline_columns

        row.update(roofline_columns(
            load.architecture, PRECISIONS[trial.precision], batch_size=trial.batch_size,
            input_len=trial.input_len, output_len=trial.output_len,
            gpu_names=held_gpu_names(telemetry.environment()["gpu_names"], load.device_name,
                                     trial.tensor_parallel),
            throughput_tok_s=row["throughput_tok_s"], tpot_s=row["tpot_s"],
        ))
    timeline = None
    if telemetry.active:
        table = telemetry.timeline_table(trial.trial_id, t_idle, t1, marks=marks)
        import pyarrow.compute as pc

        timeline = table.set_column(table.schema.get_field_index("t_s"), "t_s",
                                    pc.subtract(table.column("t_s"), t0))
    return Measurement(row=row, requests=[{"trial_id": trial.trial_id, **r} for r in requests],
                       timeline=timeline)
