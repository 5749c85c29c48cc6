"""Where a transformers trial's warm-up goes: its first generate call against the steady ones.

A sweep's transformers trial spends one unrecorded generate call warming up, and on GPUs
that call has cost 3-6 s where a steady call of the same shape costs under 1 s (bf16 and
int8; nf4 not). This bench finds out which part of the trial's situation makes the first
call slow. One process (``TrialRunner``, no Ray) loads the model once per precision, then
for each batch size in turn:

  trial     ``TrialRunner.run`` of a real trial of that batch size (warm-up, idle baseline,
            window), and its stages: what a sweep records;
  calls     N generate calls of the trial's shape right after, each synchronized and timed:
            steady state;
  idle      one call after ``--idle-s`` seconds with the GPU idle (clocks ramp down; a
            trial's warm-up follows the previous trial's baseline or the load);
  emptied   one call after ``torch.cuda.empty_cache()`` (the caching allocator refills
            from the device, as after a fidelity pass);
  newshape  one call of a batch size the process has never run (``batch + 1``): a new
            shape for every kernel heuristic and the allocator's block sizes.

With ``--profile``, the first call of every batch size's trial is not run by the trial
but here, under ``torch.profiler``, and the top operations by host and device time are
recorded beside the same for a steady call.

    python3 -m bench warmup --model llama-3.2-1b --precisions bf16,int8,nf4 --batches 1,32 \\
        --output-len 64 --profile --out $OUT/warmup.json
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.benchkit import environment, make_trial, median, write_record


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--precisions", default="bf16,int8,nf4")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--calls", type=int, default=4, help="steady calls timed after each trial")
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--window-s", type=float, default=3.0, help="each trial's measured window")
    ap.add_argument("--profile", action="store_true", help="profile a first call and a steady call")
    ap.add_argument("--out", default="warmup.json")


def _timed(backend: Any, batch: Any) -> float:
    backend.sync()
    t0 = time.perf_counter()
    backend.generate_batch(batch)
    backend.sync()
    return time.perf_counter() - t0


def _profiled(backend: Any, batch: Any, top: int = 12) -> dict[str, Any]:
    """One call under torch.profiler: its seconds and its top operations by host and device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    mallocs0 = torch.cuda.memory_stats().get("num_device_alloc", 0) if torch.cuda.is_available() else 0
    with profile(activities=activities) as prof:
        seconds = _timed(backend, batch)
    events = prof.key_averages()

    def rows(key: str) -> list[dict[str, Any]]:
        ranked = sorted(events, key=lambda e: getattr(e, key, 0.0), reverse=True)[:top]
        return [{"op": e.key, "calls": e.count, "self_cpu_s": e.self_cpu_time_total / 1e6,
                 "device_s": getattr(e, "self_device_time_total", 0.0) / 1e6} for e in ranked]

    mallocs = (torch.cuda.memory_stats().get("num_device_alloc", 0) - mallocs0) if torch.cuda.is_available() else 0
    return {"seconds": seconds, "device_allocs": mallocs, "by_host": rows("self_cpu_time_total"),
            "by_device": rows("self_device_time_total")}


def _stage_seconds(outcome: Any) -> dict[str, float]:
    out: dict[str, float] = {}
    for span in outcome.stages:
        out[span.stage] = out.get(span.stage, 0.0) + span.duration_s
    return out


def _probe(runner: Any, backend: Any, sources: Any, trial: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One batch size: (profiled first call,) the real trial, steady calls, then one call each
    after idle, after ``empty_cache`` and at a new shape."""
    import torch

    b = trial.batch_size
    source = sources.for_trial(trial)
    entry: dict[str, Any] = {"precision": trial.precision, "batch": b}
    if args.profile:
        # The shape's first call, under the profiler, instead of the trial's warm-up.
        entry["first_profiled"] = _profiled(backend, source.batch(-100, b))
    outcome = runner.run(trial)
    row = outcome.row
    entry["trial"] = {"status": row.get("status"), "error": row.get("error"),
                      "iteration_s": row["duration_s"] / row["n_iterations"] if row.get("n_iterations") else None,
                      "stages_s": _stage_seconds(outcome)}
    entry["calls_s"] = [_timed(backend, source.batch(-200 - i, b)) for i in range(args.calls)]
    entry["steady_s"] = median(entry["calls_s"][1:]) or entry["calls_s"][0]
    time.sleep(args.idle_s)
    entry["idle_s"] = _timed(backend, source.batch(-300, b))
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    entry["emptied_s"] = _timed(backend, source.batch(-301, b))
    entry["newshape_batch"] = b + 1
    entry["newshape_s"] = _timed(backend, source.batch(-302, b + 1))
    entry["newshape_again_s"] = _timed(backend, source.batch(-303, b + 1))
    if args.profile:
        entry["steady_profiled"] = _profiled(backend, source.batch(-304, b))
    return entry


def run(args: argparse.Namespace) -> None:
    from actors.actor import TrialRunner
    from actors.workload import PromptSources

    results: list[dict[str, Any]] = []
    for precision in args.precisions.split(","):
        trials = [make_trial(args.model, batch=int(b), input_len=args.input_len, output_len=args.output_len,
                             compile=False, precision=precision, window_s=args.window_s, idle_s=1.0)
                  for b in args.batches.split(",")]
        runner = TrialRunner()
        load = runner.load(trials[0])
        if not load.ok:
            results.append({"precision": precision, "load_error": load.error})
            continue
        backend, load_info = runner._loaded()
        sources = PromptSources(load_info.vocab_size, trials[0].model_ref.max_positions)
        try:
            for trial in trials:
                e = _probe(runner, backend, sources, trial, args)
                print(f"{precision} batch {e['batch']}: steady {e['steady_s']:.3f} s; trial warm-up "
                      f"{e['trial']['stages_s'].get('warmup', float('nan')):.3f} s; after idle {e['idle_s']:.3f}; "
                      f"after empty_cache {e['emptied_s']:.3f}; new shape {e['newshape_s']:.3f} then "
                      f"{e['newshape_again_s']:.3f}"
                      + (f"; profiled first {e['first_profiled']['seconds']:.3f}" if args.profile else ""), flush=True)
                results.append(e)
        finally:
            runner.close()
    write_record(args.out, "warmup", {"environment": environment(), "args": vars(args), "results": results})
