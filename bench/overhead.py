"""What sweeper's harness costs: a bare ``model.generate`` loop against the actor path.

One process, one GPU, one loaded model per (model, mode). For each batch size,
interleaved blocks (A B C, then C B A, ...) of:

  bare     a hand-written loop of ``model.generate(ids, max_new_tokens=N,
           min_new_tokens=N, do_sample=False)`` on the very same model object
           (compiled mode: a loop of the compiled path's own decode call,
           ``CompiledDecode.generate``: static cache, eager prefill, compiled
           step, on the same cache and graphs), timed with synchronize at both
           ends, the NVML sampler thread stopped;
  sweeper  ``TrialRunner.run`` of a trial of the same shape (no Ray): the full
           measurement path with NVML telemetry on; its row's throughput_tok_s;
  every    the same with the old per-token method (a synchronize after every
           decode step's forward, ``benchkit.sync_every_step``; eager path only,
           the compiled loop is left as it is), to show what it cost;
  bare+nvml  the bare loop with the NVML sampler thread running, to tell the
           sampler's share of any gap from the rest of the harness.

ratio = median sweeper / median bare throughput (goal >= 0.98), and the geometric mean of
the per-round ratios with a 95 % interval (rounds are short, so drift cancels within one).

    PYTHONPATH=/tmp/site python3 -m bench overhead --models llama-3.2-1b --out $OUT/overhead_1b.json
    PYTHONPATH=/tmp/site python3 -m bench overhead --models llama-3.1-8b --out $OUT/overhead_8b.json

Each model takes about 3-5 minutes on an H200 (two loads, one compile per batch
size). If one run would pass 8 minutes, split it with --modes.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import time
from typing import Any

from bench.benchkit import (
    environment,
    make_trial,
    median,
    paired_ratio,
    sync_every_step,
    write_record,
)
from sweeper.core.status import Status

VARIANTS = ("bare", "bare+nvml", "sweeper", "every")


def _counters():
    from torch._dynamo.utils import counters

    return counters


def bare_block(call, ids, output_len: int, block_s: float, sync) -> float:
    """Tokens/s of back-to-back ``call()`` for at least ``block_s`` (one unrecorded call first)."""
    import torch

    with torch.inference_mode():
        call()
        sync()
        t0, calls = time.monotonic(), 0
        while calls < 3 or time.monotonic() - t0 < block_s:
            call()
            calls += 1
        sync()
        elapsed = time.monotonic() - t0
    return ids.shape[0] * output_len * calls / elapsed


def run_mode(model_name: str, compiled: bool, args) -> dict:
    import torch

    from actors.actor import TrialRunner
    from actors.backends.transformers.compiled import compiled_graphs
    from actors.telemetry import SamplingPolicy, Telemetry
    from actors.workload import RandomPrompts

    batches = [int(b) for b in args.batches.split(",")]
    trials = {b: make_trial(model_name, batch=b, input_len=args.input_len, output_len=args.output_len,
                            compile=compiled, compile_mode=args.mode, precision=args.precision,
                            window_s=args.block_s, min_iters=3)
              for b in batches}
    runner = TrialRunner()
    load = runner.load(trials[batches[0]])
    if not load.ok:
        raise SystemExit(f"load failed: {load.error}")
    backend: Any = runner.backend  # the transformers backend: its model, device and compiled path
    tel = runner.telemetry
    assert runner.load_info is not None
    if isinstance(tel, Telemetry):
        tel.policy = SamplingPolicy(energy_every=args.energy_every, energy_read=args.energy_read)
    model = backend.model
    out: dict = {"load_s": load.load_s, "batches": {}}
    for batch in batches:
        trial = trials[batch]
        first = runner.run(trial).row  # compiles the shape (prepare) and checks the row
        if first["status"] != Status.OK:
            raise SystemExit(f"trial failed: {first.get('error')}")
        prompts = RandomPrompts(runner.load_info.vocab_size, args.input_len, batch, seed=99)
        ids = torch.from_numpy(prompts.batch(0)).to(backend.device)
        mask = torch.ones_like(ids)
        if compiled:
            eos = model.generation_config.eos_token_id

            def call(ids=ids, eos=eos, b=backend):
                return b._compiled.generate(ids, args.output_len, eos, b.sync, time.monotonic)
        else:
            def call(ids=ids, mask=mask, m=model):
                return m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.output_len,
                                      min_new_tokens=args.output_len, do_sample=False)
        t = time.monotonic()
        bare_block(call, ids, args.output_len, 0.0, backend.sync)  # bare path's own warm-up
        bare_warm_s = time.monotonic() - t
        graphs = compiled_graphs()
        inductor_before = dict(_counters()["inductor"])
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        statuses = set()
        for i in range(args.rounds):
            order = VARIANTS if i % 2 == 0 else tuple(reversed(VARIANTS))
            for variant in order:
                if variant.startswith("bare"):
                    stopped = tel.sampler if isinstance(tel, Telemetry) and variant == "bare" else None
                    if stopped is not None:
                        stopped.stop()
                    try:
                        rates[variant].append(bare_block(call, ids, args.output_len, args.block_s,
                                                         backend.sync))
                    finally:
                        if stopped is not None:
                            stopped.start()
                else:
                    with sync_every_step(backend) if variant == "every" else contextlib.nullcontext():
                        row = runner.run(trial).row
                    if row["status"] != Status.OK:
                        raise SystemExit(f"trial failed: {row.get('error')}")
                    statuses.add(row["compile_status"])
                    rates[variant].append(row["throughput_tok_s"])
            print(f"  {model_name} {'compiled' if compiled else 'eager'} bs{batch} round {i}: "
                  + "  ".join(f"{k} {v[-1]:.1f}" for k, v in rates.items()) + " tok/s", flush=True)
        med: dict[str, Any] = {k: median(v) for k, v in rates.items()}
        paired = {k: paired_ratio(rates[k], rates["bare"]) for k in VARIANTS if k != "bare"}
        inductor = {k: v - inductor_before.get(k, 0) for k, v in _counters()["inductor"].items()
                    if v != inductor_before.get(k, 0)}
        out["batches"][str(batch)] = {
            "tok_s": rates, "median_tok_s": med,
            "ratio_sweeper_over_bare": med["sweeper"] / med["bare"],
            # Each round's variants ran back to back: their ratio cancels drift slower
            # than a round, which medians of whole columns do not.
            "paired_ratio_over_bare": paired,
            "ratio_every_sync_over_bare": med["every"] / med["bare"],
            "ratio_bare_nvml_over_bare": med["bare+nvml"] / med["bare"],
            "compile_s": first["compile_s"], "compile_status": sorted(s for s in statuses if s),
            "graphs_compiled_during_blocks": compiled_graphs() - graphs,
            # cudagraph re-recordings, skips, ... counted by inductor during the blocks
            "inductor_counters_during_blocks": inductor,
            "bare_first_calls_s": bare_warm_s, "mbu_first_trial": first.get("mbu"),
        }
    runner.close()
    del runner, backend, model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    import torch._dynamo

    torch._dynamo.reset()
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", default="llama-3.2-1b,llama-3.1-8b")
    ap.add_argument("--modes", default="eager,compiled")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--mode", default="reduce-overhead", help="compile mode of the compiled runs")
    ap.add_argument("--block-s", type=float, default=2.5, help="seconds per timed block")
    ap.add_argument("--rounds", type=int, default=8, help="interleaved rounds of the four variants")
    ap.add_argument("--energy-every", type=int, default=1, help="the sampler's SamplingPolicy.energy_every")
    ap.add_argument("--energy-read", choices=("call", "field"), default="call",
                    help="the sampler's energy-counter read: the plain call or the field-values API")
    ap.add_argument("--out", default="overhead.json")


def run(args: argparse.Namespace) -> None:

    t_begin = time.monotonic()
    report: dict = {"args": vars(args), "environment": environment(), "results": {}}
    print(f"device: {report['environment']['device']}", flush=True)
    for model_name in args.models.split(","):
        for mode in args.modes.split(","):
            res = run_mode(model_name, mode == "compiled", args)
            report["results"][f"{model_name}/{mode}"] = res
    report["elapsed_s"] = time.monotonic() - t_begin

    print(f"\n{'model/mode':28s} {'bs':>3s} {'bare':>9s} {'sweeper':>9s} {'ratio':>6s} {'every-sync':>10s} "
          f"{'ratio':>6s} {'bare+nvml':>9s} {'ratio':>6s}")
    for key, res in report["results"].items():
        for batch, b in res["batches"].items():
            m = b["median_tok_s"]
            print(f"{key:28s} {batch:>3s} {m['bare']:9.1f} {m['sweeper']:9.1f} "
                  f"{b['ratio_sweeper_over_bare']:6.3f} {m['every']:10.1f} {b['ratio_every_sync_over_bare']:6.3f} "
                  f"{m['bare+nvml']:9.1f} {b['ratio_bare_nvml_over_bare']:6.3f}"
                  + (f"   compile_s {b['compile_s']:.1f} {b['compile_status']}" if b["compile_s"] else ""))
            p = b["paired_ratio_over_bare"]["sweeper"]
            print(f"{'':28s}     sweeper/bare paired over {p['rounds']} rounds: {p['geomean']:.3f} "
                  f"[{p['ci95'][0]:.3f}, {p['ci95'][1]:.3f}]")
    print("goal: sweeper/bare >= 0.98 everywhere")
    print(f"elapsed {report['elapsed_s']:.0f} s")
    write_record(args.out, "overhead", report)
