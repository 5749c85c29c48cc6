"""Multi-node sweeps on a real local Ray cluster (``ray.cluster_utils.Cluster``), one per process.

Run as ``python -m tests.cluster_scenarios SCENARIO SWEEP OUT [SWEEP OUT ...]``: the sweeps
run one after another on one cluster (each starts once the one before has given back every
GPU), and each prints one JSON line with the cluster's node ids and its run's summary. Nodes
have logical GPUs (Ray resources, no devices), so the noop backend stands in for a model.

- ``spread``: two 1-GPU workers behind a GPU-less head. The summary says which node each
  split's copy ran on and which trials it was given; where the sweep names a gate file, the
  group waits at it from each split until the copy runs (``RecordSplits``).
- ``tp``: a 1-GPU and a 2-GPU worker behind a GPU-less head. Every trial waits at the sweep's
  gate file (``backend_options.noop.gate_file``), opened once a one-GPU trial runs on the
  one-GPU worker: no tensor-parallel trial can finish before that, so whether the waiting
  tp=2 groups held the one-GPU groups back is shown by construction, not by timing.
- ``remove``: three 1-GPU workers; the worker that wrote the first trial shard is
  removed (its processes killed, as a lost machine's would be) while its group
  still has trials to run.
- ``search4``: one worker with four GPUs; the sweep's ``search:`` block runs as a configuration
  search, and every trial waits at the sweep's gate until four run at once (``OpenGateWhenAllRun``):
  that the search keeps every GPU busy with a point is shown by construction, not by timing.
- ``single``: one node, a 1-GPU head. The plan is made without a capability probe,
  as a stale probe would, so a trial may reach a worker that lacks its library.

Tests call ``run_scenario``, which runs this module in a fresh process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
from ray.cluster_utils import Cluster

from sweeper.plan.expand import make_plan
from sweeper.plan.spec import load_sweep
from sweeper.run.assembly import build_sweep_run
from sweeper.run.cluster import ClusterInfo, connect
from sweeper.run.events import GroupPlaced, GroupSplit, RunEvent, TrialRecorded, TrialStarted
from sweeper.run.observer import Quiet
from sweeper.run.search import SearchRun
from sweeper.run.storage import ResultStore
from sweeper.run.sweep_run import RayActorRunner, RunOptions

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


# How long a scenario's gate stays closed before its watchdog opens it (the run then goes on,
# and the test fails on the summary's ``gate``, which says why the gate opened).
GATE_WAIT_S = 120.0


class Gate(Quiet):
    """The sweep's gate file (``backend_options.noop.gate_file``), at which every noop trial
    waits while it is missing, opened and closed on run events by a scenario's observer. A
    watchdog opens it once it has been closed ``GATE_WAIT_S``; ``openings`` says why it opened,
    each time. ``path`` None: no gate, the observer only records."""

    def __init__(self, path: Path | None, *, closed: bool) -> None:
        super().__init__()
        self.path, self.openings = path, list[str]()
        self._lock = threading.Lock()
        self._closed_s: float | None = None
        if path is None:
            return
        if closed:
            self.close()
        else:
            path.touch()
        threading.Thread(target=self._watch, daemon=True).start()

    def close(self) -> None:
        if self.path is not None:
            with self._lock:
                self.path.unlink(missing_ok=True)
                self._closed_s = time.monotonic()

    def open(self, why: str) -> None:
        with self._lock:
            if self.path is not None and self._closed_s is not None:
                self.path.touch()
                self._closed_s = None
                self.openings.append(why)

    def _watch(self) -> None:
        while True:
            time.sleep(1.0)
            closed_s = self._closed_s
            if closed_s is not None and time.monotonic() - closed_s > GATE_WAIT_S:
                self.open(f"timed out after {GATE_WAIT_S:.0f} s")


class OpenGateWhenOneGpuNodeRuns(Gate):
    """Closed until a trial of one GPU starts on ``node_id``; ``opened_by`` says what opened it."""

    def __init__(self, gate: Path, node_id: str) -> None:
        super().__init__(gate, closed=True)
        self.node_id = node_id

    @property
    def opened_by(self) -> str:
        return self.openings[0] if self.openings else ""

    def on_event(self, event: RunEvent) -> None:
        super().on_event(event)
        placement = getattr(event.group, "placement", None) if isinstance(event, TrialStarted) else None
        if placement is not None and placement.node_id == self.node_id and event.trial.tensor_parallel == 1:
            self.open("a one-GPU trial on the one-GPU node")


class OpenGateWhenAllRun(Gate):
    """Closed until ``slots`` trials run at once (started, not yet recorded); ``most`` is the
    most that ever ran at once."""

    def __init__(self, gate: Path, slots: int) -> None:
        super().__init__(gate, closed=True)
        self.slots, self.running, self.most = slots, 0, 0

    @property
    def opened_by(self) -> str:
        return self.openings[0] if self.openings else ""

    def on_event(self, event: RunEvent) -> None:
        super().on_event(event)
        if isinstance(event, TrialStarted):
            self.running += 1
            self.most = max(self.most, self.running)
            if self.running >= self.slots:
                self.open(f"{self.slots} trials running at once")
        elif isinstance(event, TrialRecorded):
            self.running -= 1


class RecordSplits(Gate):
    """Where each group split's trials were sent: ``moved_to`` maps a moved trial to the node
    of the copy that took it last (a copy's trials may move again, to a later copy).

    With a gate, it is closed from each split until the copy's first trial starts: the group
    cannot run out before the copy holds a slot and take the copy's trials back (what it does
    on a cluster too busy to place the copy in time), so each copy runs trials on its node by
    construction."""

    def __init__(self, gate: Path | None) -> None:
        super().__init__(gate, closed=False)
        self.moved: list[int] = []
        self._copies: list[object] = []
        self._copy_of: dict[str, object] = {}
        self._node_of: dict[int, str] = {}
        self._waiting_for: object | None = None

    def on_event(self, event: RunEvent) -> None:
        super().on_event(event)
        if isinstance(event, GroupSplit):
            self.moved.append(event.moved)
            self._copies.append(event.copy)
            self._copy_of.update({t.trial_id: event.copy for t in event.copy.pending})
            self._waiting_for = event.copy
            self.close()
        elif isinstance(event, GroupPlaced) and event.placement is not None:
            self._node_of[id(event.group)] = event.placement.node_id
        elif isinstance(event, TrialStarted) and event.group is self._waiting_for:
            self._waiting_for = None
            self.open("a copy's first trial")

    @property
    def copy_nodes(self) -> list[str | None]:
        """The node of each split's copy, in the order of the splits."""
        return [self._node_of.get(id(copy)) for copy in self._copies]

    @property
    def moved_to(self) -> dict[str, str | None]:
        return {trial_id: self._node_of.get(id(copy)) for trial_id, copy in self._copy_of.items()}


WORKERS = {  # scenario -> (num_cpus, num_gpus) of each worker node
    "spread": [(2, 1), (2, 1)],
    "tp": [(2, 1), (3, 2)],
    "remove": [(2, 1), (2, 1), (2, 1)],
    "search4": [(5, 4)],
    "single": [],
}


def run_scenario(scenario: str, sweep_path: Path, out: Path, root: Path) -> dict:
    """Run ``scenario`` in its own process; its JSON summary line."""
    (summary,) = run_scenarios(scenario, [(sweep_path, out)], root)
    return summary


def run_scenarios(scenario: str, runs: list[tuple[Path, Path]], root: Path) -> list[dict]:
    """Run each (sweep, results directory) of ``runs`` in turn on one cluster of ``scenario``,
    in a process of its own (a cluster's nodes cost seconds of CPU to start); their summaries."""
    from tests.conftest import QUIET_NODE_ENV

    env = {**os.environ, **QUIET_NODE_ENV,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    argv = [str(p) for run in runs for p in run]
    r = subprocess.run([sys.executable, "-m", "tests.cluster_scenarios", scenario, *argv],
                       cwd=root, env=env, capture_output=True, text=True, timeout=300 * len(runs))
    assert r.returncode == 0, r.stderr[-3000:]
    # A summary is a line of its own; the nodes' daemons share the process's stdout and may
    # print between and after them (a removed node's raylet, say).
    lines = [line for line in r.stdout.splitlines() if line.startswith('{"workers": ')]
    assert len(lines) == len(runs), r.stdout[-3000:]
    return [json.loads(line) for line in lines]


def main(scenario: str, runs: list[tuple[str, str]]) -> None:
    head_gpus = 1 if scenario == "single" else 0
    # No dashboard, no log monitors and no autoscaler monitor: nothing here reads them (sweeper's
    # driver takes no worker logs; the cluster's nodes are the scenario's), and their processes
    # cost each scenario seconds of CPU (tests.conftest.QUIET_NODE_ENV: what else is left undone).
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2 if head_gpus else 1, "num_gpus": head_gpus, "include_dashboard": False,
        "include_log_monitor": False, "no_monitor": True, "_system_config": FAST_HEALTH_CHECK})
    workers = [cluster.add_node(num_cpus=c, num_gpus=g, include_log_monitor=False) for c, g in WORKERS[scenario]]
    cluster.wait_for_nodes()
    try:
        info = connect(cluster.address)
        for sweep_path, out in runs:
            _wait_for_every_gpu()
            print(json.dumps(_run(scenario, cluster, workers, info, Path(sweep_path), Path(out))), flush=True)
    finally:
        import ray

        ray.shutdown()
        cluster.shutdown()


def _wait_for_every_gpu(timeout_s: float = 60.0) -> None:
    """Until the run before has given back every GPU of the nodes alive now: its actors are
    killed as it ends, and a GPU comes back once its actor's process has exited."""
    import ray

    deadline = time.monotonic() + timeout_s
    while (free := ray.available_resources().get("GPU", 0)) < (gpus := ray.cluster_resources().get("GPU", 0)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{free:g} of the cluster's {gpus:g} GPUs free {timeout_s:.0f} s after a run")
        time.sleep(0.2)


def _run(scenario: str, cluster: Cluster, workers: list, info: ClusterInfo, sweep_path: Path, out: Path) -> dict:
    head_id, worker_ids = cluster.head_node.node_id, [w.node_id for w in workers]
    plan = make_plan(load_sweep(sweep_path), info.device, sweep_path=sweep_path)
    removed: list[str] = []
    stop = threading.Event()
    watcher = None
    gate = None
    gate_file = getattr(plan.trials[0].trial.backend_options, "gate_file", None)
    splits = RecordSplits(Path(gate_file) if gate_file else None) if scenario == "spread" else None
    if scenario == "tp":
        gate = OpenGateWhenOneGpuNodeRuns(Path(gate_file), worker_ids[0])
    if scenario == "remove":
        watcher = threading.Thread(target=_remove_first_writer,
                                   args=(cluster, workers, out, removed, stop), daemon=True)
        watcher.start()
    search = None
    if scenario == "search4":
        gate = OpenGateWhenAllRun(Path(gate_file), info.gpus)
        search = SearchRun(plan, plan.sweep.search, info.device, parallel=info.gpus)
    try:
        summary = build_sweep_run(plan, ResultStore(str(out)), info, RayActorRunner(), options=RunOptions(max_retries=2),
                           observer=gate or splits, search=search).run()
    finally:
        stop.set()
        if watcher is not None:
            watcher.join()
    return {
        "workers": worker_ids, "head": head_id, "removed": removed, "nodes": info.nodes,
        "runnable": len(plan.runnable), "gpus": info.gpus, "ok": summary.ok, "failed": summary.failed, "retries": summary.retries,
        "model_loads": summary.model_loads, "group_splits": summary.group_splits, "wall_s": summary.wall_s,
        "gate": gate.opened_by if gate is not None else splits.openings if splits else None,
        "moved": splits.moved if splits else None, "moved_to": splits.moved_to if splits else None,
        "copy_nodes": splits.copy_nodes if splits else None,
        "most_running": gate.most if isinstance(gate, OpenGateWhenAllRun) else None,
        "points": len(summary.search.points) if summary.search is not None else None,
    }


if __name__ == "__main__":
    args = sys.argv[2:]
    main(sys.argv[1], list(zip(args[::2], args[1::2], strict=True)))
