"""Host-side preparation beside a host-bound trial: does it perturb the measurement?

A sweep could prepare the next group (draw and write synthetic weights, tokenise a
dataset, generate prompts) while the current group's trials run, if that leaves the
trials' numbers alone. The most sensitive trial is a host-bound one: an eager decode
loop at batch 1, where one CPU core sets the pace. One process loads it once
(``TrialRunner``, no Ray) and runs it in interleaved rounds, A B then B A, of:

  quiet   the trial alone;
  prep-N  the same trial while a second process, at the lowest CPU priority (nice 19)
          with N torch threads, does what preparing the next group does on the host:
          draws seeded weights on the CPU and writes them as safetensors shards
          (``actors.models._write_weights``'s work), over and over until stopped.

Reported per variant: the paired throughput ratio against quiet (geometric mean of the
per-round ratios, 95 % interval) and, as the noise it is compared with, the
round-to-round spread of quiet itself; J/token likewise where a GPU is metered. With
``--materialize``, also how long materialising a model's weights (drawn on the GPU, as
the actor does) takes: what an overlap could hide at most.

    python3 -m bench overlap --model llama-3.2-1b --threads 1,4 --rounds 6 --out $OUT/overlap.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchkit import environment, make_trial, paired_ratio, write_record

# What the second process runs: the host half of weight materialisation, in a loop.
PREP = r"""
import os, sys, time
os.nice(19)
import torch
from safetensors.torch import save_file
torch.set_num_threads(int(sys.argv[1]))
out, n = sys.argv[2], 0
g = torch.Generator().manual_seed(0)
print("ready", flush=True)
while True:
    t = torch.empty(64 * 2**20, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=g)
    save_file({"w": t}, os.path.join(out, f"shard-{n % 4}.safetensors"))
    n += 1
"""


class Prep:
    """The preparing process, started before the trial and stopped after it."""

    def __init__(self, threads: int, scratch: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PREP, str(threads), str(scratch)],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # torch imported: the work starts now
        if line.strip() != "ready":
            raise RuntimeError(f"the preparing process did not start ({self.proc.poll()})")

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


def quiet_spread(values: list[float]) -> dict[str, Any]:
    """Round-to-round noise of the undisturbed trial: CV, and consecutive rounds' ratio interval."""
    cv = statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else None
    return {"cv": cv, "consecutive": paired_ratio(values[1:], values[:-1])}


def materialize_s(model: str, root: Path) -> float:
    from actors.models import materialize_weights

    t0 = time.monotonic()
    materialize_weights(model, seed=12345, root=root)
    return time.monotonic() - t0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--window-s", type=float, default=5.0, help="each trial's measured window")
    ap.add_argument("--threads", default="1,4", help="torch threads of the preparing process, one variant each")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--materialize", default=None, help="also time materialising this model's weights")
    ap.add_argument("--out", default="overlap.json")


def run(args: argparse.Namespace) -> None:
    from actors.actor import TrialRunner

    t_begin = time.monotonic()
    variants = ["quiet"] + [f"prep-{n}" for n in args.threads.split(",")]
    trial = make_trial(args.model, batch=args.batch, input_len=args.input_len, output_len=args.output_len,
                       compile=False, window_s=args.window_s, idle_s=0.0)
    runner = TrialRunner()
    load = runner.load(trial)
    if not load.ok:
        raise SystemExit(f"load failed: {load.error}")
    scratch = Path(tempfile.mkdtemp(prefix="sweeper-overlap-"))
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        runner.run(trial)  # the shape's first call, unrecorded
        for r in range(args.rounds):
            for v in (variants if r % 2 == 0 else variants[::-1]):
                prep = Prep(int(v.split("-")[1]), scratch) if v != "quiet" else None
                try:
                    row = runner.run(trial).row
                finally:
                    if prep is not None:
                        prep.stop()
                rows[v].append({k: row.get(k) for k in ("throughput_tok_s", "energy_per_token_j", "duration_s",
                                                          "status", "unstable_reason")})
                print(f"round {r} {v:8s} {row.get('throughput_tok_s') or 0:9.2f} tok/s "
                      f"{row.get('energy_per_token_j') or float('nan'):.4f} J/tok", flush=True)
        materialized = None
        if args.materialize:
            materialized = {"model": args.materialize, "seconds": materialize_s(args.materialize, scratch)}
    finally:
        runner.close()
        shutil.rmtree(scratch, ignore_errors=True)

    def column(v: str, key: str) -> list[float]:
        return [x[key] for x in rows[v]]

    summary: dict[str, Any] = {"quiet_tok_s": quiet_spread(column("quiet", "throughput_tok_s"))}
    if all(x["energy_per_token_j"] for x in rows["quiet"]):
        summary["quiet_j_per_tok"] = quiet_spread(column("quiet", "energy_per_token_j"))
    for v in variants[1:]:
        summary[v] = {"tok_s_ratio": paired_ratio(column(v, "throughput_tok_s"), column("quiet", "throughput_tok_s"))}
        if all(x["energy_per_token_j"] for x in rows[v] + rows["quiet"]):
            summary[v]["j_per_tok_ratio"] = paired_ratio(column(v, "energy_per_token_j"), column("quiet", "energy_per_token_j"))
    report = {"args": vars(args), "environment": environment(), "cpus": os.cpu_count(), "rows": rows,
              "summary": summary, "materialize": materialized, "elapsed_s": time.monotonic() - t_begin}
    for v in variants[1:]:
        p = summary[v]["tok_s_ratio"]
        ci = p["ci95"] or [float("nan")] * 2
        print(f"{v}: tok/s ratio to quiet {p['geomean']:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]")
    q = summary["quiet_tok_s"]
    print(f"quiet round to round: CV {q['cv']:.3f}")
    if materialized:
        print(f"materialising {materialized['model']}'s weights: {materialized['seconds']:.1f} s")
    write_record(args.out, "overlap", report)
