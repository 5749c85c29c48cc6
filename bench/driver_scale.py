"""The driver's cost per trial against a bare Ray actor loop, in one run, on the embedded cluster.

Both sides run the same noop trials (``generate`` sleeps ``--step-s`` per token; no model)
on ``--gpus`` logical GPUs of one local Ray (``ray.init(num_gpus=...)``: the embedded
cluster ``sweeper run`` starts, its GPUs logical), one trial in flight per GPU:

- **sweeper**: ``run_plan`` over a plan of ``--trials`` trials in one group per GPU, the
  results written to a temporary results directory as ``sweeper run`` writes them;
- **bare**: one Ray actor per GPU holding a noop backend, driven by a loop that submits its
  next call when the last returns, keeping nothing but the returned row.

Both are timed from the moment their actors are requested (sweeper's run starts them
itself), so both pay the actors' start.

Per-trial overhead, for each: (GPUs x wall - sum of the trials' own time on their actors) /
trials, in GPU-seconds: everything a GPU spent not running a trial. The ratio of the two
is the figure. The sides run in alternating order ``--rounds`` times so that a drift in
the machine's load falls on both.

Usage: python3 -m bench driver-scale --trials 2000 --gpus 4 --out results/bench_driver_scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

from bench.benchkit import write_record
from bench.scheduling import MODELS
from sweeper.core.status import Status


def sweep_dict(trials: int, groups: int, step_s: float) -> dict[str, Any]:
    per_group = -(-trials // groups)
    return {
        "name": "driver-scale", "models": MODELS[:groups], "backends": "noop", "precisions": "bf16",
        "batch_sizes": 1, "workload": {"input_len": 8, "output_len": 4}, "repeats": per_group,
        "backend_options": {"noop": {"step_s": step_s}},
        "measure": {"warmup_iters": 0, "min_iters": 1, "min_duration_s": 0, "idle_s": 0, "min_window_s": 0},
    }


class BareActor:
    """What a hand-written Ray loop would hold: a loaded noop backend and a generate per call."""

    def __init__(self, step_s: float) -> None:
        import numpy as np

        from actors.backends.base import ModelSpec
        from actors.backends.noop import NoopBackend
        from sweeper.core.backends import NoopOptions

        self.backend = NoopBackend()
        self.backend.load(ModelSpec("synthetic", "tiny-llama", "bf16", NoopOptions(step_s=step_s)))
        self.prompt = np.arange(8)[None, :]  # one sequence of 8 tokens

    def run(self, i: int) -> dict[str, Any]:
        t0 = time.monotonic()
        gen = self.backend.generate(self.prompt, 4)
        t1 = time.monotonic()
        return {"i": i, "actor_s": t1 - t0, "tokens": gen.output_tokens}


def bare_loop(trials: int, gpus: int, step_s: float) -> dict[str, Any]:
    import ray

    remote: Any = ray.remote(num_gpus=1, num_cpus=1)(BareActor)  # what sweeper's GPU actors hold
    # Timed from the actors' creation, as sweeper's run is: both pay their actors' start.
    t0 = time.monotonic()
    actors: list[Any] = [remote.remote(step_s) for _ in range(gpus)]
    quota = [trials // gpus + (1 if k < trials % gpus else 0) for k in range(gpus)]
    inflight = {}
    for k, a in enumerate(actors):
        inflight[a.run.remote(0)] = k
        quota[k] -= 1
    rows = []
    while inflight:
        (done,), _ = ray.wait(list(inflight), num_returns=1)
        k = inflight.pop(done)
        rows.append(ray.get(done))
        if quota[k] > 0:
            quota[k] -= 1
            inflight[actors[k].run.remote(len(rows))] = k
    wall_s = time.monotonic() - t0
    for a in actors:
        ray.kill(a)
    actor_s = sum(r["actor_s"] for r in rows)
    return {"wall_s": wall_s, "trials": len(rows), "overhead_s_per_trial": (gpus * wall_s - actor_s) / len(rows)}


def sweeper_run(trials: int, gpus: int, step_s: float) -> dict[str, Any]:
    import resource

    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep
    from sweeper.run.assembly import run_plan
    from sweeper.run.cluster import ClusterInfo
    from sweeper.run.storage import ResultStore

    plan = make_plan(parse_sweep(sweep_dict(trials, gpus, step_s)), "cuda", check_hub=False)
    cpus = max(os.cpu_count() or 1, gpus + 1)
    cluster = ClusterInfo(gpus=gpus, cpus=cpus, nodes=1, min_node_cpus=cpus)
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultStore(tmp)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        summary = run_plan(plan, store, cluster)
        rows = store.read_shards("trials", columns=["started_at", "finished_at", "status"]).to_pylist()
    actor_s = sum((r["finished_at"] - r["started_at"]).total_seconds() for r in rows if r["status"] == Status.OK)
    return {"wall_s": summary.wall_s, "trials": len(rows), "ok": summary.ok,
            "overhead_s_per_trial": (gpus * summary.wall_s - actor_s) / len(rows),
            "write_s": getattr(summary, "write_s", None), "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "driver_peak_rss_mb_before": rss_before / 1024}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--gpus", type=int, default=4, help="logical GPUs of the embedded cluster")
    ap.add_argument("--step-s", type=float, default=0.025, help="noop seconds per token (4 tokens a trial: 0.1 s)")
    ap.add_argument("--rounds", type=int, default=2, help="sweeper and bare, alternating, this many times each")
    ap.add_argument("--out", default=None)


def run(args: argparse.Namespace) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    # Every GPU actor holds one CPU (sweeper's and the bare loop's alike): logical CPUs enough
    # for all of them, as a GPU node has, whatever this machine's core count.
    ray.init(num_gpus=args.gpus, num_cpus=max(os.cpu_count() or 1, args.gpus + 1), include_dashboard=False,
             log_to_driver=False)
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            order = ("sweeper", "bare") if r % 2 == 0 else ("bare", "sweeper")
            this: dict[str, Any] = {"order": order}
            for side in order:
                this[side] = (sweeper_run if side == "sweeper" else bare_loop)(args.trials, args.gpus, args.step_s)
            this["ratio"] = this["sweeper"]["overhead_s_per_trial"] / this["bare"]["overhead_s_per_trial"]
            rounds.append(this)
            print(f"round {r + 1}: sweeper {this['sweeper']['overhead_s_per_trial'] * 1e3:.1f} ms/trial, bare "
                  f"{this['bare']['overhead_s_per_trial'] * 1e3:.1f} ms/trial, ratio {this['ratio']:.2f}", flush=True)
    finally:
        ray.shutdown()
    ratios = [r["ratio"] for r in rounds]
    results = {"trials": args.trials, "gpus": args.gpus, "step_s": args.step_s, "rounds": rounds,
               "ratio_median": statistics.median(ratios), "load_average": os.getloadavg()}
    print(json.dumps({"ratio_median": results["ratio_median"], "ratios": ratios}))
    if args.out:
        write_record(args.out, "driver-scale", results)
