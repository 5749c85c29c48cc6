"""How long ``sweeper plan`` takes on a large grid, in both output modes (the real command line).

Writes a noop sweep of about ``--trials`` grid points (five presets x two precisions x
batch sizes x input lengths x output lengths x repeats, with three exclude rules), then
runs ``sweeper plan --device cpu`` (the table) and ``sweeper plan --device cpu --json``
in fresh processes and records each one's wall time and peak memory (``/usr/bin/time``
where it exists, else wall time only). Imports, Ray-free planning and printing are all
inside the time: it is what a user waits for.

Usage: python3 -m bench plan-scale --trials 100000 --out results/bench_plan_scale.json
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchkit import write_record

MODELS = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "llama-3.2-1b", "qwen2.5-0.5b"]
INPUT_LENS = [8, 16, 32, 64, 128, 256, 512, 1024, 1536, 2000]
OUTPUT_LENS = [4, 8, 16, 32, 64, 128, 256, 512, 768, 1000]


def sweep_yaml(trials: int) -> str:
    """A grid of about ``trials`` points: the batch sizes make up what the other axes do not."""
    per_batch = len(MODELS) * 2 * len(INPUT_LENS) * len(OUTPUT_LENS) * 5
    batches = max(1, math.ceil(trials / per_batch))
    return json.dumps({
        "name": "plan-scale", "models": MODELS, "backends": "noop", "precisions": ["fp32", "bf16"],
        "batch_sizes": list(range(1, batches + 1)),
        "workload": {"input_len": INPUT_LENS, "output_len": OUTPUT_LENS}, "repeats": 5,
        "exclude": [{"model": "tiny-llama", "batch_size": 3}, {"precision": "fp32", "input_len": 8, "output_len": 4},
                    {"model": "qwen2.5-0.5b", "batch_size": [5, 6]}],
    })


def timed(args: list[str]) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {done.stderr.strip()[-500:]}")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"wall_s": round(wall_s, 2), "stdout_bytes": len(done.stdout),
            # the children's peak so far: a later, smaller child does not lower it
            "peak_rss_mb_children": round(max(peak_kb, before) / 1024, 1)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--trials", type=int, default=100_000, help="grid points, about (default 100000)")
    ap.add_argument("--out", default="results/bench_plan_scale.json")


def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sweep = Path(tmp) / "plan-scale.yaml"
        sweep.write_text(sweep_yaml(args.trials))
        base = [sys.executable, "-m", "sweeper", "plan", str(sweep), "--device", "cpu"]
        listed = json.loads(subprocess.run(base + ["--json"], capture_output=True, text=True, check=True).stdout)
        results = {"grid_points": listed["trials"] + listed["excluded"], "trials": listed["trials"],
                   "excluded": listed["excluded"], "groups": listed["groups"],
                   "table": timed(base), "json": timed(base + ["--json"])}
    print(f"{results['trials']:,} trials ({results['grid_points']:,} grid points): "
          f"table {results['table']['wall_s']} s, json {results['json']['wall_s']} s")
    write_record(args.out, "plan-scale", results)
