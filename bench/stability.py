"""Where per-iteration noise comes from: bare ``LLM.generate`` loops against sweeper's vLLM path.

On an H100 VM, sweeper's vLLM trials showed per-iteration throughput CVs of
0.10-0.13 where earlier H200 runs stayed under 0.021. On ONE engine, loaded
through sweeper's own actor code (``TrialRunner.load``, no Ray), for each batch
size, in this order:

  bare          ``LLM.generate`` back to back, timed around each call alone;
  bare+nvml     the same with an NVML thread reading power and SM clock every
                100 ms (what sweeper's sampler adds to the process);
  bare-after-idle  the GPU left idle for ``--idle-s`` first (as the idle baseline
                does), then the same loop: are the first calls after idle slow?
  sweeper       ``TrialRunner.run`` of the trial (warm-up, settle, baseline,
                window, telemetry on);
  bare          again (drift).

Every series reports its per-call throughput CV (all calls, and without the
first two), the CV and 95 % interval over >= 1 s blocks (as sweeper's verdict
computes them), lag-1 autocorrelation, the host's CPU steal over the loop
(/proc/stat), and, where NVML was read, the SM clock's range and its
correlation with the call rate. If the bare loops are as noisy as sweeper's
path, the noise is the machine's, not the harness's.

    PYTHONPATH=/tmp/site:. python3 -m bench stability --model llama-3.2-1b --batches 1,32 \\
        --window-s 6 --out $OUT/stability.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import traceback
from typing import Any

from bench.benchkit import write_record


def cpu_times() -> dict[str, int]:
    """The host's aggregate CPU jiffies (user .. steal) from /proc/stat; empty where unreadable."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return {}
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    return {n: int(v) for n, v in zip(names, fields[1:], strict=False)}


def steal_share(before: dict[str, int], after: dict[str, int]) -> float | None:
    """The share of all CPU time the hypervisor took from this VM between two readings."""
    if not before or not after or "steal" not in after:
        return None
    total = sum(after.values()) - sum(before.values())
    return (after["steal"] - before["steal"]) / total if total > 0 else None


class ClockSampler:
    """An NVML thread reading SM clock and power of GPU 0 every ``interval_s``."""

    def __init__(self, interval_s: float = 0.1) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, float]] = []  # (t, sm MHz, W)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nv = self._nvml
        while not self._stop.is_set():
            t = time.perf_counter()
            self.samples.append((t, nv.nvmlDeviceGetClockInfo(self._handle, nv.NVML_CLOCK_SM),
                                 nv.nvmlDeviceGetPowerUsage(self._handle) / 1000.0))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ClockSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def clock_at(self, t0: float, t1: float) -> float | None:
        inside = [mhz for t, mhz, _ in self.samples if t0 <= t <= t1]
        return statistics.fmean(inside) if inside else None


def series_stats(calls: list[tuple[float, float, int]], sampler: ClockSampler | None = None) -> dict[str, Any]:
    """Statistics of one loop's calls ``(t_start, t_end, output_tokens)``."""
    from actors.telemetry.telemetry import MIN_STABILITY_BLOCK_S, iteration_blocks
    from sweeper.core.intervals import mean_interval

    rates = [n / (t1 - t0) for t0, t1, n in calls if t1 > t0]
    if len(rates) < 3:
        return {"calls": len(rates)}

    def cv(xs: list[float]) -> float | None:
        return statistics.stdev(xs) / statistics.fmean(xs) if len(xs) >= 2 else None

    blocks = iteration_blocks([(t0, t1) for t0, t1, _ in calls], MIN_STABILITY_BLOCK_S)
    block_rates, start = [], 0
    for b0, b1, count in blocks:
        tokens = sum(n for _, _, n in calls[start:start + count])
        block_rates.append(tokens / (b1 - b0))
        start += count
    interval = mean_interval(block_rates) if len(block_rates) >= 3 else None
    mean = statistics.fmean(rates)
    lag1 = (sum((a - mean) * (b - mean) for a, b in zip(rates, rates[1:], strict=False))
            / sum((r - mean) ** 2 for r in rates)) if len(set(rates)) > 1 else None
    med = statistics.median(rates)
    out: dict[str, Any] = {
        "calls": len(rates), "window_s": calls[-1][1] - calls[0][0],
        "throughput_tok_s": sum(n for *_, n in calls) / sum(t1 - t0 for t0, t1, _ in calls),
        "call_rate_cv": cv(rates), "call_rate_cv_without_first_two": cv(rates[2:]),
        "first_call_rate_vs_median": rates[0] / med, "min_rate_vs_median": min(rates) / med,
        "max_rate_vs_median": max(rates) / med, "lag1_autocorrelation": lag1,
        "blocks": len(block_rates), "block_rate_cv": cv(block_rates),
        "rel_ci95": interval.relative if interval is not None else None,
        # The slowest calls' positions: clustered (a slow phase) or spread (jitter)?
        "slowest_calls": sorted(range(len(rates)), key=rates.__getitem__)[:5],
    }
    if sampler is not None:
        clocks = [sampler.clock_at(t0, t1) for t0, t1, _ in calls]
        paired = [(c, r) for c, r in zip(clocks, rates, strict=True) if c is not None]
        all_mhz = [mhz for t, mhz, _ in sampler.samples if calls[0][0] <= t <= calls[-1][1]]
        if all_mhz:
            out["sm_clock_mhz"] = {"min": min(all_mhz), "median": statistics.median(all_mhz), "max": max(all_mhz)}
        if len(paired) >= 3 and len({c for c, _ in paired}) > 1:
            out["rate_vs_sm_clock_correlation"] = statistics.correlation([c for c, _ in paired],
                                                                         [r for _, r in paired])
    return out


def bare_loop(llm: Any, params: Any, vocab: int, batch: int, args: argparse.Namespace, seed: int,
              sampler: ClockSampler | None = None) -> dict[str, Any]:
    """``LLM.generate`` back to back for ``--window-s``, each call timed alone."""
    from actors.workload import RandomPrompts

    prompts = RandomPrompts(vocab, args.input_len, batch, seed)
    calls: list[tuple[float, float, int]] = []
    before = cpu_times()
    i = 0
    while i < 3 or calls[-1][1] - calls[0][0] < args.window_s:
        built = [{"prompt_token_ids": row} for row in prompts.batch(i).tolist()]
        t0 = time.perf_counter()
        outs = llm.generate(built, params, use_tqdm=False)
        t1 = time.perf_counter()
        calls.append((t0, t1, sum(len(o.outputs[0].token_ids) for o in outs)))
        i += 1
    stats = series_stats(calls, sampler)
    stats["cpu_steal_share"] = steal_share(before, cpu_times())
    return stats


def sweeper_series(outcome: Any) -> dict[str, Any]:
    """The sweeper trial's own calls, from its requests table (one iteration = one call)."""
    # An Arrow table (the requests schema), read here as rows.
    table = outcome.tables.get("requests")
    requests = table.to_pylist() if table is not None else []
    by_iter: dict[int, list[dict[str, Any]]] = {}
    for r in requests:
        by_iter.setdefault(r["iteration"], []).append(r)
    calls = [(min(r["t_start_s"] for r in rs), max(r["t_start_s"] + r["e2e_s"] for r in rs),
              sum(r["output_tokens"] for r in rs)) for _, rs in sorted(by_iter.items())]
    return series_stats(calls) if calls else {}


ROW_KEYS = ("status", "error", "throughput_tok_s", "duration_s", "n_iterations", "iteration_throughput_cv",
            "iteration_energy_cv", "throughput_rel_ci95", "energy_per_token_rel_ci95", "ci_blocks",
            "unstable", "unstable_reason", "noisy_host", "noisy_host_reason", "idle_baseline_reused",
            "idle_settle_s", "energy_per_token_j", "avg_power_w")


def run(args: argparse.Namespace) -> int:
    from actors.actor import TrialRunner
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    batches = [int(b) for b in args.batches.split(",")]
    sweep = parse_sweep({
        "name": "stability", "models": args.model, "backends": "vllm", "precisions": args.precision,
        "batch_sizes": batches, "workload": {"input_len": args.input_len, "output_len": args.output_len},
        "measure": {"warmup_iters": 1, "min_iters": 3, "min_duration_s": args.window_s, "idle_s": args.idle_s},
        "backend_options": {"vllm": json.loads(args.options)},
    })
    trials, _ = expand(sweep)
    result: dict[str, Any] = {"model": args.model, "precision": args.precision, "window_s": args.window_s,
                              "batches": {}}

    def save() -> None:
        write_record(args.out, "stability", result, quiet=True)

    runner = TrialRunner()
    load = runner.load(trials[0])
    result["load"] = {"ok": load.ok, "load_s": load.load_s, "error": load.error}
    save()
    if not load.ok:
        runner.close()
        return 1
    backend: Any = runner.backend
    assert runner.load_info is not None
    vocab = runner.load_info.vocab_size
    try:
        for trial in trials:
            b = trial.batch_size
            assert b is not None  # offline trials
            step: dict[str, Any] = {"trial_id": trial.trial_id}
            result["batches"][b] = step
            try:
                params = backend._sampling_params(trial.output_len)  # the object sweeper's path uses
                llm = backend.llm
                bare_loop(llm, params, vocab, b, args, seed=9)  # warm-up of this shape, unrecorded
                step["bare"] = bare_loop(llm, params, vocab, b, args, seed=1)
                with ClockSampler() as sampler:
                    step["bare_nvml"] = bare_loop(llm, params, vocab, b, args, seed=2, sampler=sampler)
                    time.sleep(args.idle_s)
                    step["bare_after_idle"] = bare_loop(llm, params, vocab, b, args, seed=3, sampler=sampler)
                outcome = runner.run(trial)
                step["sweeper_row"] = {k: outcome.row.get(k) for k in ROW_KEYS}
                step["sweeper"] = sweeper_series(outcome)
                step["bare_again"] = bare_loop(llm, params, vocab, b, args, seed=4)
            except Exception:
                step["error"] = traceback.format_exc()[-3000:]
            save()
            print(json.dumps({b: {k: (v.get("call_rate_cv"), v.get("block_rate_cv"), v.get("rel_ci95"),
                                      v.get("cpu_steal_share"))
                                  for k, v in step.items() if isinstance(v, dict) and "call_rate_cv" in v}},
                             default=str), flush=True)
    finally:
        runner.close()
        save()
    return 0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--window-s", type=float, default=6.0, help="each loop's length, and the trial's min_duration_s")
    ap.add_argument("--idle-s", type=float, default=2.0, help="idle before bare-after-idle, and the trial's idle_s")
    ap.add_argument("--options", default="{}", help="backend_options.vllm as JSON")
    ap.add_argument("--out", default="stability.json")
