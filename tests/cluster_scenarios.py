"""Multi-node sweeps on a real local Ray cluster (``ray.cluster_utils.Cluster``), one per process.

Run as ``python -m tests.cluster_scenarios SCENARIO SWEEP OUT``; prints one JSON
line with the cluster's node ids and the run's summary. Nodes have logical GPUs
(Ray resources, no devices), so the noop backend stands in for a model.

- ``tp``: a 1-GPU and a 2-GPU worker behind a GPU-less head.
- ``remove``: three 1-GPU workers; the worker that wrote the first trial shard is
  removed (its processes killed, as a lost machine's would be) while its group
  still has trials to run.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
from ray.cluster_utils import Cluster

from sweeper.plan import make_plan
from sweeper.scheduler import connect, run_plan
from sweeper.spec import load_sweep
from sweeper.storage import ResultStore

# Notice a killed node in about a second, not Ray's default of ~15 s.
FAST_HEALTH_CHECK = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 200,
                     "health_check_failure_threshold": 5}


def _remove_first_writer(cluster: Cluster, workers: list, out: Path, removed: list[str],
                         stop: threading.Event) -> None:
    shards = out / "shards" / "trials"
    while not stop.is_set():
        done = sorted(shards.glob("*.parquet")) if shards.exists() else []
        if done:
            node_id = pq.read_table(done[0], columns=["ray_node_id"]).column(0)[0].as_py()
            node = next(w for w in workers if w.node_id == node_id)
            cluster.remove_node(node, allow_graceful=False)
            removed.append(node_id)
            return
        time.sleep(0.02)


def main(scenario: str, sweep_path: str, out: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "_system_config": FAST_HEALTH_CHECK})
    if scenario == "tp":
        workers = [cluster.add_node(num_cpus=2, num_gpus=1), cluster.add_node(num_cpus=3, num_gpus=2)]
    else:
        workers = [cluster.add_node(num_cpus=2, num_gpus=1) for _ in range(3)]
    cluster.wait_for_nodes()
    head_id, worker_ids = cluster.head_node.node_id, [w.node_id for w in workers]
    info = connect(cluster.address)
    plan = make_plan(load_sweep(sweep_path), info.device, sweep_path=sweep_path)
    removed: list[str] = []
    stop = threading.Event()
    watcher = None
    if scenario == "remove":
        watcher = threading.Thread(target=_remove_first_writer,
                                   args=(cluster, workers, Path(out), removed, stop), daemon=True)
        watcher.start()
    try:
        summary = run_plan(plan, ResultStore(out), info, quiet=True, max_retries=2)
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
        import ray

        ray.shutdown()
        cluster.shutdown()
    print(json.dumps({
        "workers": worker_ids, "head": head_id, "removed": removed,
        "gpus": info.gpus, "ok": summary.ok, "failed": summary.failed, "retries": summary.retries,
        "model_loads": summary.model_loads, "wall_s": summary.wall_s,
    }))


if __name__ == "__main__":
    main(*sys.argv[1:4])
