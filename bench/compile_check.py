"""Quick GPU check of the compiled path (about 3 minutes on an H200): run before the big sweeps.

One model, one batch size, bf16, through the real actor code (``TrialRunner``,
no Ray, NVML telemetry on), eager and compiled loaded side by side:

1. compiled trial: compile_s and compile_status from its row (prepare), then the
   same trial again, counting graphs dynamo compiled during it (must be 0);
2. eager and compiled trials interleaved (E C E C ...): throughput, tpot, MBU,
   J/token; speedup = median compiled / median eager throughput;
3. greedy tokens on the same prompts: eager vs compiled, and eager vs the static
   cache with dynamo switched off (separates the cache path from compiled numerics).

    PYTHONPATH=/tmp/site python3 -m bench compile-check --out $OUT/compile_check.json

The compiled path's goal: >= 3x eager throughput at batch 1 on llama-3.2-1b.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.benchkit import (
    ROW_COLUMNS,
    environment,
    make_trial,
    median,
    output_ids,
    row_subset,
    write_record,
)
from sweeper.core.status import Status


def token_comparison(a, b, input_len: int) -> dict:
    """Where two (batch, input_len + n) token arrays differ, per sequence."""
    new_a, new_b = a[:, input_len:], b[:, input_len:]
    diff = (new_a != new_b)
    first = []
    for row in diff:
        idx = row.nonzero()
        first.append(int(idx[0][0]) if len(idx) else None)
    return {"identical": bool(not diff.any()), "tokens_differing": int(diff.sum()),
            "tokens": int(diff.numel()), "first_divergence_step": first}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--mode", default="reduce-overhead", choices=["reduce-overhead", "max-autotune", "default"])
    ap.add_argument("--window-s", type=float, default=5.0, help="measured window of each trial")
    ap.add_argument("--pairs", type=int, default=2, help="eager/compiled trial pairs, interleaved")
    ap.add_argument("--prompts", type=int, default=4, help="prompt batches compared for token equality")
    ap.add_argument("--compile-devices", default="cuda",
                    help="devices the compiled path may use (add cpu for a CPU smoke run)")
    ap.add_argument("--out", default="compile_check.json")


def run(args: argparse.Namespace) -> None:

    import torch
    import torch._dynamo

    from actors.actor import TrialRunner
    from actors.backends.transformers import compiled
    from actors.backends.transformers.compiled import compiled_graphs
    from actors.workload import RandomPrompts

    compiled.COMPILE_DEVICES = tuple(args.compile_devices.split(","))
    t_begin = time.monotonic()
    report: dict = {"args": vars(args), "environment": environment()}
    shape = dict(batch=args.batch, input_len=args.input_len, output_len=args.output_len,
                 precision=args.precision, window_s=args.window_s)
    trials = {name: make_trial(args.model, compile=name == "compiled", compile_mode=args.mode, **shape)
              for name in ("eager", "compiled")}
    runners = {}
    for name, trial in trials.items():
        runner = TrialRunner()
        load = runner.load(trial)
        if not load.ok:
            raise SystemExit(f"{name} load failed: {load.error}")
        runners[name] = runner
        report[f"{name}_load_s"] = load.load_s
    print(f"loaded {args.model} {args.precision} twice on {report['environment']['device']}", flush=True)

    def run_trial(name: str) -> dict:
        outcome = runners[name].run(trials[name])
        row = outcome.row
        if row["status"] != Status.OK:
            raise SystemExit(f"{name} trial failed: {row.get('error')}")
        return row

    # 1. compile, then the same shape again: no graph may be compiled the second time.
    first = run_trial("compiled")
    report["compile_s"], report["compile_status"] = first["compile_s"], first["compile_status"]
    print(f"compiled: compile_s {first['compile_s']}, status {first['compile_status']!r}", flush=True)
    graphs = compiled_graphs()
    again = run_trial("compiled")

    # 2. interleaved throughput
    rows: dict[str, list[dict]] = {"eager": [], "compiled": [again]}
    run_trial("eager")  # the eager runner's first trial warms its allocator, like the compiled one's
    for i in range(args.pairs):
        for name in (("eager", "compiled") if i % 2 == 0 else ("compiled", "eager")):
            rows[name].append(run_trial(name))
    report["graphs_compiled_after_prepare"] = compiled_graphs() - graphs
    report["rows"] = {name: [row_subset(r, ROW_COLUMNS) for r in rs] for name, rs in rows.items()}
    summary: dict[str, dict[str, Any]] = {name: {c: median([r[c] for r in rs if r.get(c) is not None])
                      for c in ("throughput_tok_s", "tpot_s", "ttft_s", "mbu", "energy_per_token_j")}
               for name, rs in rows.items()}
    report["median"] = summary
    report["speedup"] = summary["compiled"]["throughput_tok_s"] / summary["eager"]["throughput_tok_s"]

    # 3. token equality on the same prompts
    eager_b, compiled_b = runners["eager"].backend, runners["compiled"].backend
    eager_info = runners["eager"].load_info
    assert eager_b is not None and compiled_b is not None and eager_info is not None
    prompts = RandomPrompts(eager_info.vocab_size, args.input_len, args.batch, seed=123)
    equality: dict[str, list[dict]] = {"compiled_vs_eager": [], "static_cache_no_compile_vs_eager": []}
    with output_ids(eager_b) as refs:
        for i in range(args.prompts):
            eager_b.generate(prompts.batch(i), args.output_len)
    graphs = compiled_graphs()
    with output_ids(compiled_b) as outs:
        for i, ref in enumerate(refs):
            compiled_b.generate(prompts.batch(i), args.output_len)
            equality["compiled_vs_eager"].append(token_comparison(ref, outs[-1], args.input_len))
    report["graphs_compiled_during_equality"] = compiled_graphs() - graphs
    # Last: calls made with dynamo off can leave its frames marked to skip.
    with torch._dynamo.config.patch(disable=True), output_ids(compiled_b) as outs:
        for i, ref in enumerate(refs):
            compiled_b.generate(prompts.batch(i), args.output_len)
            equality["static_cache_no_compile_vs_eager"].append(token_comparison(ref, outs[-1], args.input_len))
    report["equality"] = equality
    report["elapsed_s"] = time.monotonic() - t_begin
    for runner in runners.values():
        runner.close()

    print(f"\n{args.model} {args.precision} batch {args.batch}, {args.input_len}+{args.output_len} tokens, "
          f"mode {args.mode}, on {report['environment']['device']}")
    for name, s in summary.items():
        mbu = f"{s['mbu']:.1%}" if s["mbu"] is not None else "n/a"
        ept = f"{s['energy_per_token_j']:.4f}" if s["energy_per_token_j"] is not None else "n/a"
        print(f"  {name:9s} {s['throughput_tok_s']:9.1f} tok/s  tpot {s['tpot_s'] * 1e3:7.3f} ms  "
              f"MBU {mbu:>6s}  J/token {ept}")
    print(f"  speedup {report['speedup']:.2f}x (goal >= 3x at batch 1 on llama-3.2-1b)")
    print(f"  compile_s {report['compile_s']}  status {report['compile_status']!r}  "
          f"graphs compiled after prepare: {report['graphs_compiled_after_prepare']} (want 0)")
    for name, cmp in equality.items():
        same = sum(c["identical"] for c in cmp)
        print(f"  tokens {name}: {same}/{len(cmp)} prompt batches identical; "
              f"first divergence steps {[c['first_divergence_step'] for c in cmp]}")
    print(f"  elapsed {report['elapsed_s']:.0f} s")
    write_record(args.out, "compile-check", report)
