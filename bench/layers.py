"""GPU evidence for layer profiling, in one process on one GPU, no Ray.

Runs the real actor code (``TrialRunner.run``: the headline measurement, then the
profiling pass, which times modules by kernel time under torch.profiler) for each
batch size and granularity, and checks:

a. coverage: the rows' GPU times summed (units and ``_rest`` rows; also units only),
   against the forward's kernel time in a reference pass with no module hooks (the
   same prompts and generate calls, under the profiler, the whole forward in one
   range: the same kernels, sampling and logits processors excluded from both)
   -- expected within 10%;
b. the per-module energies summed, against the pass's measured window energy (taken
   from the telemetry handle itself, not from our rows) -- expected within 2%;
c. each granularity's overhead (``layer_profile_overhead``), and the profiler's own
   share of it (the reference pass's time per call over the headline's);
d. the decoder blocks' time shares per phase: max/min and block 0 over the median of
   the others (near 1 expected);
e. (``--event-compare``, on) the same coverage with the CUDA-event-pair timer, for
   comparison; and a check of our kernel attribution against torch's own
   ``FunctionEvent.device_time_total`` of each range on a short run.

    python3 -m bench layers --out $OUT/layers.json     # llama-3.2-1b bf16, batches 1,16

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
import time
import traceback
from pathlib import Path
from typing import Any

from bench.benchkit import driver_version, version, write_record
from sweeper.core.status import Status

PHASES = ("prefill", "decode")


def make_trial(args, batch: int, granularity: str):
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    sweep = parse_sweep({
        "name": "layers-bench", "models": args.model, "precisions": args.precision, "batch_sizes": batch,
        "workload": {"input_len": args.input_len, "output_len": args.output_len},
        "measure": {"warmup_iters": 1, "min_iters": args.iters, "min_duration_s": args.window_s,
                    "idle_s": args.idle_s, "min_window_s": args.window_s},
        "profile": {"layers": granularity},
    })
    trials, _ = expand(sweep)
    return trials[0]


def _prompts(runner, trial):
    from actors.workload import RandomPrompts

    return RandomPrompts(runner.load_info.vocab_size, trial.input_len, trial.batch_size, trial.seed)


def timed_pass(runner, trial, iterations: int, units: list, timer=None) -> dict:
    """The pass's workload with ``units`` profiled by ``timer`` (None: the pass's own; no units: the forward only)."""
    from actors.layers.profiler import LayerProfiler
    from actors.layers.timers import timer_for

    model = runner.backend.model
    prompts = _prompts(runner, trial)
    runner.backend.generate(prompts.batch(-1), trial.output_len)  # warm: the first step may be the first use
    profiler = LayerProfiler(model, units, timer if timer is not None else timer_for(model))
    profiler.reserve(iterations * trial.output_len)
    runner.backend.sync()
    with profiler:  # the profiler session starts and stops outside the timed span, as in the pass
        t0 = time.monotonic()
        for i in range(iterations):  # the pass's prompts, in its order
            profiler.begin_generate()
            runner.backend.generate(prompts.batch(i), trial.output_len)
        runner.backend.sync()
        wall_s = time.monotonic() - t0
    t1 = time.monotonic()
    rows = profiler.results()
    forward = profiler.forward_time_s()
    stats = getattr(profiler.timer, "stats", None)
    out: dict[str, Any]
    out = {"timer": profiler.method, "iterations": iterations, "wall_s_per_iter": wall_s / iterations,
           "readout_s": time.monotonic() - t1,
           **{f"{p}_forward_s": forward[p][1] if p in forward else 0.0 for p in PHASES},
           **{f"{p}_forwards": forward[p][0] if p in forward else 0 for p in PHASES},
           **{f"{p}_rows_s": sum(r.gpu_time_s for r in rows if r.phase == p) for p in PHASES},
           **{f"{p}_units_s": sum(r.gpu_time_s for r in rows if r.phase == p and not r.module_type.endswith("_rest"))
              for p in PHASES}}
    if stats is not None:
        out["kernel_stats"] = {k: v for k, v in stats.items() if k != "items_per_key"}
        root_keys = {0: "prefill", 1: "decode"}  # with no units, range 0 is the root
        if not units:
            for key, phase in root_keys.items():
                n = out[f"{phase}_forwards"]
                out[f"{phase}_kernels_per_forward"] = stats["items_per_key"].get(key, 0) / n if n else None
    return out


def reference_forward_s(runner, trial, iterations: int, timer=None) -> dict:
    """Forward GPU time per phase with only the model's whole forward ranged (no module hooks)."""
    return timed_pass(runner, trial, iterations, [], timer)


def attribution_check(runner, trial, granularity: str) -> dict:
    """Our kernel attribution against torch's ``FunctionEvent.device_time_total`` per range (one short call).

    ``device_time_total`` of a CPU event is its own kernels plus its CPU children's
    (recursively, torch 2.11-2.13): the inclusive kernel time of a range.
    """
    from actors.layers.profiler import LayerProfiler
    from actors.layers.select import select_units
    from actors.layers.timers import KernelTimer, range_name

    model = runner.backend.model
    timer = KernelTimer("cuda")
    profiler = LayerProfiler(model, select_units(model, granularity), timer)
    prompts = _prompts(runner, trial)
    with profiler:
        profiler.begin_generate()
        runner.backend.generate(prompts.batch(0), min(trial.output_len, 16))
    prof = timer.profiles[0]
    ours = timer.attribute(prof.profiler.kineto_results.events())
    by_name: dict[str, float] = {}
    for e in prof.events():
        if e.name.startswith("sweeper.layers#"):
            by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time_total / 1e6
    theirs = {key: by_name.get(range_name(key), 0.0) for key in set(ours) | {int(n.rsplit("#", 1)[1]) for n in by_name}}
    diffs = [abs(ours.get(k, 0.0) - v) / v for k, v in theirs.items() if v > 0]
    return {"ranges": len(theirs), "ours_total_s": sum(ours.values()), "torch_total_s": sum(theirs.values()),
            "max_rel_diff": max(diffs) if diffs else None,
            "stats": {k: v for k, v in timer.stats.items() if k != "items_per_key"}}


def event_pair_coverage(runner, trial, granularity: str) -> dict:
    """The same pass and reference timed with CUDA event pairs: the launch-gap comparison."""
    from actors.layers.profile_pass import pass_iterations
    from actors.layers.select import select_units
    from bench.layer_timers import event_timer_for

    model = runner.backend.model
    iterations = pass_iterations(trial)
    ref = reference_forward_s(runner, trial, iterations, event_timer_for(model))
    hooked = timed_pass(runner, trial, iterations, select_units(model, granularity), event_timer_for(model))
    rows_s = sum(hooked[f"{p}_rows_s"] for p in PHASES)
    ref_s = sum(ref[f"{p}_forward_s"] for p in PHASES)
    return {"coverage": _ratio(rows_s, ref_s),
            "coverage_units_only": _ratio(sum(hooked[f"{p}_units_s"] for p in PHASES), ref_s),
            "reference": ref, "pass": hooked}




def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _block_shares(rows: list[dict], phase: str) -> dict:
    """Per decoder block, its rows' summed time share (the block, or its submodules and rest)."""
    per_block: dict[int, float] = {}
    for r in rows:
        if r["phase"] == phase and r["layer_index"] is not None:
            per_block[r["layer_index"]] = per_block.get(r["layer_index"], 0.0) + r["time_share"]
    if not per_block:
        return {}
    shares = [per_block[i] for i in sorted(per_block)]
    others = shares[1:]
    return {f"{phase}_block_shares": shares,
            f"{phase}_block_share_max_over_min": max(shares) / min(shares) if min(shares) > 0 else None,
            f"{phase}_block0_over_median_rest": (shares[0] / statistics.median(others)
                                                 if others and statistics.median(others) > 0 else None),
            f"{phase}_block_share_cv": (statistics.stdev(shares) / statistics.fmean(shares)
                                        if len(shares) > 1 and statistics.fmean(shares) > 0 else None),
            f"{phase}_blocks_share_sum": sum(shares)}


def summarize(rows: list[dict], ref: dict, window_energy_j: float | None, row: dict) -> dict:
    headline_s_per_iter = _ratio(row.get("duration_s"), row.get("n_iterations"))
    out: dict = {"n_rows": len(rows), "gpu_time_method": sorted({r.get("gpu_time_method") for r in rows} - {None}),
                 "overhead": row.get("layer_profile_overhead"),
                 "profiler_only_overhead": (ref["wall_s_per_iter"] / headline_s_per_iter - 1
                                            if headline_s_per_iter and ref.get("timer") == "cuda_kernel_time"
                                            else None),
                 "status": row.get("layer_profile_status"), "headline_tok_s": row.get("throughput_tok_s"),
                 "headline_s_per_iter": headline_s_per_iter}
    # (a) coverage: every row (units and rests), and the units alone
    totals = {"rows": 0.0, "units": 0.0, "ref": 0.0}
    for p in PHASES:
        rows_s = sum(r["gpu_time_s"] for r in rows if r["phase"] == p)
        units_s = sum(r["gpu_time_s"] for r in rows if r["phase"] == p and not r["module_type"].endswith("_rest"))
        ref_s = ref[f"{p}_forward_s"]
        totals["rows"] += rows_s
        totals["units"] += units_s
        totals["ref"] += ref_s
        out[f"{p}_rows_time_s"] = rows_s
        out[f"{p}_units_time_s"] = units_s
        out[f"{p}_forward_time_s"] = ref_s
        out[f"{p}_coverage"] = _ratio(rows_s, ref_s)
        out[f"{p}_coverage_units_only"] = _ratio(units_s, ref_s)
        out[f"{p}_time_share_sum"] = sum(r["time_share"] for r in rows if r["phase"] == p)
    out["coverage"] = _ratio(totals["rows"], totals["ref"])
    out["coverage_units_only"] = _ratio(totals["units"], totals["ref"])
    out["coverage_within_10pct"] = out["coverage"] is not None and abs(out["coverage"] - 1) <= 0.10
    rest_s: dict[str, float] = {}
    for r in rows:
        if r["module_type"].endswith("_rest"):
            rest_s[r["module_type"]] = rest_s.get(r["module_type"], 0.0) + r["gpu_time_s"]
    out["rest_share_by_type"] = {t: v / totals["rows"] for t, v in rest_s.items()} if totals["rows"] else {}
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
    # (d) per-block shares
    for p in PHASES:
        out.update(_block_shares(rows, p))
    by_type: dict[str, float] = {}
    for r in rows:
        by_type[r["module_type"]] = by_type.get(r["module_type"], 0.0) + r["gpu_time_s"]
    out["gpu_time_s_by_type"] = by_type
    key = "energy_j" if out["module_energy_sum_j"] is not None else "gpu_time_s"
    out[f"top5_by_{key}"] = [(r["module"], r["phase"], r[key])
                             for r in sorted(rows, key=lambda r: r[key], reverse=True)[:5]]
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--granularities", default="block,submodule")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--iters", type=int, default=3, help="min_iters; the profiling pass runs max(2, this) calls")
    ap.add_argument("--window-s", type=float, default=10.0, help="headline window (min_duration_s)")
    ap.add_argument("--idle-s", type=float, default=2.0)
    ap.add_argument("--device", choices=("auto", "cpu"), default="auto",
                    help="cpu hides the GPUs (host timing, no energy): a smoke test of this script")
    ap.add_argument("--event-compare", action=argparse.BooleanOptionalAction, default=True,
                    help="also time each pass with CUDA event pairs, and check the kernel attribution "
                         "against torch's FunctionEvent.device_time_total (CUDA only)")
    ap.add_argument("--out", default="layers.json")


def run(args: argparse.Namespace) -> int:
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported

    import torch

    from actors.actor import TrialRunner
    from actors.layers.profile_pass import pass_iterations

    out_path = Path(args.out)
    report: dict = {
        "model": args.model, "precision": args.precision, "input_len": args.input_len,
        "output_len": args.output_len, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "transformers": version("transformers"), "driver": driver_version(),
        "runs": [], "errors": [],
    }
    on_cuda = torch.cuda.is_available()

    def save() -> None:
        write_record(out_path, "layers", report, quiet=True)

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
                tel: Any = runner.telemetry  # its measure is wrapped below, to keep each window's handle
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
                    if row.get("status") != Status.OK:
                        raise RuntimeError(f"trial {row.get('status')}: {row.get('error')}")
                    layers = outcome.tables.get("layers")
                    rows = layers.to_pylist() if layers is not None else []
                    if not rows:
                        raise RuntimeError(f"no layer rows: {row.get('layer_profile_status')}")
                    pass_handle = handles.get(f"{trial.trial_id}/layers")
                    window = getattr(pass_handle, "window", None)
                    result = {"batch": batch, "granularity": g, "trial_id": trial.trial_id,
                              **summarize(rows, ref, window.energy_j if window is not None else None, row),
                              "pass_window_s": window.duration_s if window is not None else None,
                              "pass_energy_method": window.method if window is not None else None,
                              "reference": ref}
                    if args.event_compare and on_cuda:
                        result["event_pairs"] = event_pair_coverage(runner, trial, g)
                        if "attribution_check" not in report:
                            report["attribution_check"] = {"batch": batch, "granularity": g,
                                                           **attribution_check(runner, trial, g)}
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

    def per_run(key: str) -> list:
        return [(r["batch"], r["granularity"], r.get(key)) for r in report["runs"]]

    checks = {
        "coverage": per_run("coverage"),
        "coverage_units_only": per_run("coverage_units_only"),
        "coverage_within_10pct": per_run("coverage_within_10pct"),
        "coverage_event_pairs": [(r["batch"], r["granularity"], r.get("event_pairs", {}).get("coverage"))
                                 for r in report["runs"]],
        "energy_within_2pct": per_run("energy_within_2pct"),
        "overhead": per_run("overhead"),
        "profiler_only_overhead": per_run("profiler_only_overhead"),
        "decode_block_share_max_over_min": per_run("decode_block_share_max_over_min"),
        "decode_block0_over_median_rest": per_run("decode_block0_over_median_rest"),
        "attribution_max_rel_diff": report.get("attribution_check", {}).get("max_rel_diff"),
        "errors": len(report["errors"]),
    }
    report["checks"] = checks
    save()
    print(json.dumps({"checks": checks}, default=str), flush=True)
    return 1 if report["errors"] else 0

