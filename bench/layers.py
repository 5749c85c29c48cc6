"""GPU evidence for layer profiling (issue 4), in one process on one GPU, no Ray.

Runs the real actor code (``TrialRunner.run``: the headline measurement, then the
hooked profiling pass) for each batch size and granularity, and checks:

a. coverage: the per-module GPU times summed, against the model's forward GPU time
   measured without per-layer hooks (CUDA events around each top-level forward only,
   same prompts, same number of generate calls) -- expected within 10%;
b. the per-module energies summed, against the pass's measured window energy (taken
   from the telemetry handle itself, not from our rows) -- expected within 2%;
c. each granularity's overhead (``layer_profile_overhead``);
d. the decoder blocks' time shares per phase: min/max ratio (near 1 expected).

    python bench/layers.py --model llama-3.2-1b --batches 1,16 --out $OUT/layers.json

``--device cpu`` (or a machine without a GPU) runs the same code on the CPU with host
timing and no energy, e.g. ``--model tiny-llama --precision fp32`` as a smoke test.
Every (batch, granularity) step is independent: a failure is recorded in the output
and the rest still run; ``--out`` is rewritten after every step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

PHASES = ("prefill", "decode")


def make_trial(args, batch: int, granularity: str):
    from sweeper.plan import expand
    from sweeper.spec import parse_sweep

    sweep = parse_sweep({
        "name": "layers-bench", "models": args.model, "precisions": args.precision, "batch_sizes": batch,
        "workload": {"input_len": args.input_len, "output_len": args.output_len},
        "measure": {"warmup_iters": 1, "min_iters": args.iters, "min_duration_s": args.window_s,
                    "idle_s": args.idle_s, "min_window_s": args.window_s},
        "profile": {"layers": granularity},
    })
    trials, _ = expand(sweep)
    return trials[0]


def reference_forward_s(runner, trial, iterations: int) -> dict:
    """Forward GPU time per phase with only the model's own forward timed (no per-layer hooks)."""
    from actors.layers import LayerProfiler, forward_unit
    from actors.workload import RandomPrompts

    model = runner.backend.model
    prompts = RandomPrompts(runner.load_info.vocab_size, trial.input_len, trial.batch_size, trial.seed)
    runner.backend.generate(prompts.batch(-1), trial.output_len)  # warm: the first step may be the first use
    profiler = LayerProfiler(model, [forward_unit(model)])
    profiler.timer.reserve(2 * iterations * trial.output_len)
    runner.backend.sync()
    t0 = time.monotonic()
    with profiler:
        for i in range(iterations):  # the pass's prompts, in its order
            profiler.begin_generate()
            runner.backend.generate(prompts.batch(i), trial.output_len)
    runner.backend.sync()
    wall_s = time.monotonic() - t0
    times = {t.phase: t for t in profiler.results()}
    return {"timer": profiler.timer.kind, "iterations": iterations, "wall_s_per_iter": wall_s / iterations,
            **{f"{p}_forward_s": times[p].gpu_time_s if p in times else 0.0 for p in PHASES},
            **{f"{p}_forwards": times[p].calls if p in times else 0 for p in PHASES}}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(rows: list[dict], ref: dict, window_energy_j: float | None, row: dict) -> dict:
    out: dict = {"n_rows": len(rows), "overhead": row.get("layer_profile_overhead"),
                 "status": row.get("layer_profile_status"), "headline_tok_s": row.get("throughput_tok_s"),
                 "headline_s_per_iter": _ratio(row.get("duration_s"), row.get("n_iterations"))}
    # (a) coverage
    total_mod = total_ref = 0.0
    for p in PHASES:
        mod_s = sum(r["gpu_time_s"] for r in rows if r["phase"] == p)
        ref_s = ref[f"{p}_forward_s"]
        total_mod, total_ref = total_mod + mod_s, total_ref + ref_s
        out[f"{p}_module_time_s"] = mod_s
        out[f"{p}_forward_time_s"] = ref_s
        out[f"{p}_module_over_forward"] = _ratio(mod_s, ref_s)
        out[f"{p}_time_share_sum"] = sum(r["time_share"] for r in rows if r["phase"] == p)
    out["module_over_forward"] = _ratio(total_mod, total_ref)
    out["coverage_within_10pct"] = (out["module_over_forward"] is not None
                                    and abs(out["module_over_forward"] - 1) <= 0.10)
    # (b) energy
    energies = [r["energy_j"] for r in rows]
    out["module_energy_sum_j"] = sum(energies) if rows and all(e is not None for e in energies) else None
    out["window_energy_j"] = window_energy_j
    out["row_layer_profile_energy_j"] = row.get("layer_profile_energy_j")
    out["energy_sum_over_window"] = _ratio(out["module_energy_sum_j"], window_energy_j)
    out["energy_within_2pct"] = (None if out["energy_sum_over_window"] is None
                                 else abs(out["energy_sum_over_window"] - 1) <= 0.02)
    out["method"] = sorted({r["method"] for r in rows if r["method"]})
    for p in PHASES:
        e = [r["energy_j"] for r in rows if r["phase"] == p and r["energy_j"] is not None]
        out[f"{p}_energy_j"] = sum(e) if e else None
    # (d) per-block shares: the block's own row, or its submodules' rows summed
    for p in PHASES:
        per_block: dict[int, float] = {}
        for r in rows:
            if r["phase"] == p and r["layer_index"] is not None:
                per_block[r["layer_index"]] = per_block.get(r["layer_index"], 0.0) + r["time_share"]
        if per_block:
            shares = list(per_block.values())
            out[f"{p}_block_share_min"] = min(shares)
            out[f"{p}_block_share_max"] = max(shares)
            out[f"{p}_block_share_min_over_max"] = min(shares) / max(shares) if max(shares) > 0 else None
            out[f"{p}_block_share_cv"] = (statistics.stdev(shares) / statistics.fmean(shares)
                                          if len(shares) > 1 and statistics.fmean(shares) > 0 else None)
            out[f"{p}_blocks_share_sum"] = sum(shares)
    by_type: dict[str, float] = {}
    for r in rows:
        by_type[r["module_type"]] = by_type.get(r["module_type"], 0.0) + r["gpu_time_s"]
    out["gpu_time_s_by_type"] = by_type
    key = "energy_j" if out["module_energy_sum_j"] is not None else "gpu_time_s"
    out[f"top5_by_{key}"] = [(r["module"], r["phase"], r[key])
                             for r in sorted(rows, key=lambda r: r[key], reverse=True)[:5]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--granularities", default="block,submodule,leaf")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3, help="min_iters; the profiling pass runs max(2, this) calls")
    ap.add_argument("--window-s", type=float, default=10.0, help="headline window (min_duration_s)")
    ap.add_argument("--idle-s", type=float, default=2.0)
    ap.add_argument("--device", choices=("auto", "cpu"), default="auto",
                    help="cpu hides the GPUs (host timing, no energy): a smoke test of this script")
    ap.add_argument("--out", default="layers.json")
    args = ap.parse_args()
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported

    import torch

    from actors.actor import TrialRunner
    from actors.profile_pass import pass_iterations

    out_path = Path(args.out)
    report: dict = {
        "model": args.model, "precision": args.precision, "input_len": args.input_len,
        "output_len": args.output_len, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "argv": sys.argv[1:], "runs": [], "errors": [],
    }

    def save() -> None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(report, indent=2, default=str))

    granularities = [g.strip() for g in args.granularities.split(",") if g.strip()]
    runner = None
    try:
        for batch in (int(b) for b in args.batches.split(",")):
            trials = {g: make_trial(args, batch, g) for g in granularities}
            if runner is None:
                first = trials[granularities[0]]
                runner = TrialRunner()
                load = runner.load(first)
                if not load.ok:
                    report["errors"].append({"step": "load", "error": load.error})
                    save()
                    print(json.dumps(report["errors"][-1]), flush=True)
                    return 1
                report["load_s"] = load.load_s
                report["telemetry"] = type(runner.telemetry).__name__
                print(f"loaded {args.model} in {load.load_s:.1f} s on {report['device']} "
                      f"({report['telemetry']})", flush=True)
            for g in granularities:
                trial = trials[g]
                try:
                    # Right before each pass, so clocks and temperature drift between the two are small.
                    ref = reference_forward_s(runner, trial, pass_iterations(trial))
                except Exception:
                    report["errors"].append({"batch": batch, "granularity": g, "step": "reference",
                                             "error": traceback.format_exc()})
                    save()
                    print(report["errors"][-1]["error"], flush=True)
                    continue
                print(json.dumps({"batch": batch, "granularity": g, "reference": ref}), flush=True)
                handles: dict = {}
                tel = runner.telemetry
                orig_measure = tel.measure

                @contextlib.contextmanager
                def capture(name, _orig=orig_measure, _h=handles):
                    with _orig(name) as handle:
                        yield handle
                    _h[name] = handle

                tel.measure = capture
                try:
                    outcome = runner.run(trial)
                    row = outcome.row
                    if row.get("status") != "ok":
                        raise RuntimeError(f"trial {row.get('status')}: {row.get('error')}")
                    rows = outcome.tables.get("layers") or []
                    if not rows:
                        raise RuntimeError(f"no layer rows: {row.get('layer_profile_status')}")
                    pass_handle = handles.get(f"{trial.trial_id}/layers")
                    window = getattr(pass_handle, "window", None)
                    result = {"batch": batch, "granularity": g, "trial_id": trial.trial_id,
                              **summarize(rows, ref, window.energy_j if window is not None else None, row),
                              "pass_window_s": window.duration_s if window is not None else None,
                              "pass_energy_method": window.method if window is not None else None,
                              "reference": ref}
                    report["runs"].append(result)
                    print(json.dumps({k: v for k, v in result.items() if k != "reference"}, default=str), flush=True)
                except Exception:
                    report["errors"].append({"batch": batch, "granularity": g, "error": traceback.format_exc()})
                    print(report["errors"][-1]["error"], flush=True)
                finally:
                    tel.measure = orig_measure
                    save()
    finally:
        if runner is not None:
            runner.close()
        save()

    checks = {
        "coverage_within_10pct": [(r["batch"], r["granularity"], r["coverage_within_10pct"]) for r in report["runs"]],
        "energy_within_2pct": [(r["batch"], r["granularity"], r["energy_within_2pct"]) for r in report["runs"]],
        "overhead": [(r["batch"], r["granularity"], r["overhead"]) for r in report["runs"]],
        "decode_block_share_min_over_max": [(r["batch"], r["granularity"], r.get("decode_block_share_min_over_max"))
                                            for r in report["runs"]],
        "errors": len(report["errors"]),
    }
    report["checks"] = checks
    save()
    print(json.dumps({"checks": checks}, default=str), flush=True)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
