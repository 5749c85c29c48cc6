"""CPU benchmark of the scheduler itself: a noop sweep on a local multi-node Ray cluster.

Starts a ``ray.cluster_utils.Cluster`` (a GPU-less head and ``--nodes`` workers
with ``--gpus-per-node`` logical GPUs each), runs a sweep of ``--trials`` noop
trials of about ``--trial-s`` seconds each through the real scheduler
(``sweeper.run.sweep_run.run_plan``), and reports where the wall time went.

Definitions (all over the run's wall time W, from run_plan's start to its end,
with G GPUs and N trials):

- busy fraction (the one ``sweeper run`` prints): sum over trials of the
  driver-observed trial time (the actor's ``run`` submitted -> its result back
  on the driver) / (G x W).
- actor fraction: sum of (finished_at - started_at) as the actor stamps them
  inside ``run`` / (G x W).
- measured fraction: sum of duration_s (the measured windows) / (G x W).
- scheduling overhead per trial: (G x W - sum of actor-side trial times) / N, in
  GPU-seconds: everything a GPU spent not running a trial (actor start, model
  loads, driver round trips, idle tails), spread over the trials.
- round trip per trial: (driver-observed - actor-side) trial time, mean.
- gap between trials: next started_at - previous finished_at on one actor.
- actor start + load: first trial's started_at - run start, per group.

Usage: python3 -m bench scheduling --out results/bench_scheduling.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench.benchkit import write_record
from sweeper.core.status import Status

MODELS = ["tiny-llama", "tiny-qwen2", "tiny-mistral", "llama-3.2-1b", "qwen2.5-0.5b", "llama-3.2-3b",
          "llama-3.1-8b", "qwen2.5-7b", "mistral-7b"]
PRECISIONS = ["fp32", "bf16", "fp16"]
STEP_S, OUTPUT_LEN = 0.005, 8  # one generate call: 8 steps of 5 ms = 40 ms


def sweep_yaml(trials: int, groups: int, trial_s: float) -> str:
    """``groups`` load keys (model x precision) of as equal a number of trials as ``trials`` allows."""
    if groups > len(MODELS) * len(PRECISIONS):
        raise SystemExit(f"at most {len(MODELS) * len(PRECISIONS)} groups")
    keys = [(m, p) for p in PRECISIONS for m in MODELS][:groups]
    models = sorted({m for m, _ in keys}, key=MODELS.index)
    precisions = sorted({p for _, p in keys}, key=PRECISIONS.index)
    per_group = math.ceil(trials / groups)
    repeats = per_group  # one batch size, one shape: repeats make the trials
    exclude: list[dict[str, str | int]] = [{"model": m, "precision": p} for m in models for p in precisions
                                           if (m, p) not in keys]
    # Drop the last repeat of as many groups as needed to land on exactly ``trials``.
    extra = groups * per_group - trials
    exclude += [{"model": m, "precision": p, "repeat": per_group - 1} for m, p in keys[:extra]]
    warmup_s = STEP_S * OUTPUT_LEN
    measure = {"warmup_iters": 1, "min_iters": 1, "min_duration_s": round(trial_s - warmup_s, 3), "idle_s": 0}
    return json.dumps({
        "name": "bench-scheduling", "models": models, "backends": "noop", "precisions": precisions,
        "batch_sizes": 1, "workload": {"input_len": 16, "output_len": OUTPUT_LEN}, "repeats": repeats,
        "backend_options": {"noop": {"step_s": STEP_S}}, "measure": measure, "exclude": exclude,
    })


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--gpus-per-node", type=int, default=2)
    ap.add_argument("--groups", type=int, default=None, help="load keys (default: one per GPU)")
    ap.add_argument("--trial-s", type=float, default=2.0, help="target time of one trial on its actor")
    ap.add_argument("--out", type=Path, default=None, help="write everything measured as JSON here")


def run(args: argparse.Namespace) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    load_before = os.getloadavg()  # other work on the machine skews every number below

    import ray
    from ray.cluster_utils import Cluster

    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep
    from sweeper.run.assembly import run_plan
    from sweeper.run.cluster import connect
    from sweeper.run.storage import ResultStore

    gpus = args.nodes * args.gpus_per_node
    groups = args.groups or gpus
    sweep = parse_sweep(json.loads(sweep_yaml(args.trials, groups, args.trial_s)))

    t_cluster = time.monotonic()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
    for _ in range(args.nodes):
        cluster.add_node(num_cpus=args.gpus_per_node, num_gpus=args.gpus_per_node)
    cluster.wait_for_nodes()
    info = connect(cluster.address)
    cluster_start_s = time.monotonic() - t_cluster
    plan = make_plan(sweep, info.device)
    assert len(plan.runnable) == args.trials, (len(plan.runnable), args.trials)
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultStore(tmp)
        run_start = datetime.now(timezone.utc)
        try:
            summary = run_plan(plan, store, info)
        finally:
            ray.shutdown()
            cluster.shutdown()
        rows = store.read_shards("trials").to_pylist()

    ok = [r for r in rows if r["status"] == Status.OK]
    n, wall_s = len(rows), summary.wall_s
    actor_s = [(r["finished_at"] - r["started_at"]).total_seconds() for r in ok]
    measured_s = [r["duration_s"] for r in ok]
    by_group: dict[tuple, list[dict]] = {}
    for r in ok:
        by_group.setdefault((r["model"], r["precision"]), []).append(r)
    gaps, first_start = [], []
    for group_rows in by_group.values():
        group_rows.sort(key=lambda r: r["started_at"])
        first_start.append((group_rows[0]["started_at"] - run_start).total_seconds())
        gaps += [(b["started_at"] - a["finished_at"]).total_seconds() for a, b in zip(group_rows, group_rows[1:], strict=False)]
    gpu_s = gpus * wall_s
    result: dict[str, Any] = {
        "machine": {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "cpu": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "ray": ray.__version__,
                    "load_average_before": load_before},
        "date": run_start.isoformat(timespec="seconds"),
        "config": {"trials": n, "groups": len(by_group), "nodes": args.nodes, "gpus_per_node": args.gpus_per_node,
                   "gpus": gpus, "trial_s_target": args.trial_s, "measure": sweep.measure.model_dump(),
                   "noop": {"step_s": STEP_S, "output_len": OUTPUT_LEN}},
        "cluster_start_s": cluster_start_s,
        "wall_s": wall_s,
        "ideal_wall_s": sum(actor_s) / gpus if actor_s else None,
        "ok": summary.ok, "failed": summary.failed, "model_loads": summary.model_loads,
        "busy_fraction": summary.busy_fraction,
        "actor_fraction": sum(actor_s) / gpu_s if gpu_s else None,
        "measured_fraction": sum(measured_s) / gpu_s if gpu_s else None,
        "trial_actor_s": {"mean": _mean(actor_s), "min": min(actor_s, default=None), "max": max(actor_s, default=None)},
        "trial_measured_s_mean": _mean(measured_s),
        "overhead_gpu_s_per_trial": (gpu_s - sum(actor_s)) / n if n else None,
        "round_trip_s_per_trial": (summary.busy_s - sum(actor_s)) / n if n else None,
        "gap_between_trials_s": {"mean": _mean(gaps), "p50": _pct(gaps, 50), "p99": _pct(gaps, 99),
                                 "max": max(gaps, default=None)},
        "actor_start_and_load_s": {"mean": _mean(first_start), "max": max(first_start, default=None)},
        "load_s_mean": _mean([r["load_s"] for r in ok if r["load_s"] is not None]),
        "placements": {k: vars(v) for k, v in summary.placements.items()},
    }
    print(f"{n} trials ({summary.ok} ok) of ~{args.trial_s:g} s on {args.nodes} nodes x {args.gpus_per_node} "
          f"logical GPUs, {len(by_group)} groups: wall {wall_s:.1f} s (ideal {result['ideal_wall_s']:.1f} s)")
    print(f"busy fraction {result['busy_fraction']:.3f} (actor {result['actor_fraction']:.3f}, "
          f"measured {result['measured_fraction']:.3f}); overhead {result['overhead_gpu_s_per_trial']:.3f} GPU-s/trial, "
          f"round trip {result['round_trip_s_per_trial'] * 1e3:.1f} ms/trial, gap p50 "
          f"{result['gap_between_trials_s']['p50'] * 1e3:.1f} ms, actor start+load mean "
          f"{result['actor_start_and_load_s']['mean']:.2f} s; {summary.model_loads} model loads")
    if args.out:
        write_record(args.out, "scheduling", result)
