"""A sweep run as a library call: plan a sweep, or run it into a results directory.

The command line is one caller of this module (it parses, calls, renders and maps
exit codes); a notebook or a test is another. Nothing here prints: what a run says
on its way (connecting, resuming, warnings) and every event of the run go to an
``Observer`` (the command line's draws its live view from them), and every result
comes back typed.

    with open_run("sweeps/quickstart.yaml", output="results/q") as setup:
        result = run_sweep(setup, RunOptions())
    result.summary.ok, result.counts["trials"]

The sweep is expanded once per step that needs it: ``open_run`` resolves every model
(before a cluster starts), and ``run_sweep`` plans against the cluster it joined.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sweeper.core.settings import Device
from sweeper.core.status import Status
from sweeper.core.trial import Trial
from sweeper.plan.capabilities import Capabilities, NodeTypes
from sweeper.plan.expand import Plan, PlannedTrial, expand, make_plan
from sweeper.plan.servers import check_energy_sites, check_servers
from sweeper.plan.spec import Sweep, load_sweep
from sweeper.run.assembly import build_sweep_run
from sweeper.run.lock import RunLock
from sweeper.run.observer import Observer, Quiet
from sweeper.run.resume import is_settled
from sweeper.run.search_policy import SearchPolicy
from sweeper.run.storage import ResultStore, StoredTrial, check_destination
from sweeper.run.summary import RunSummary
from sweeper.run.sweep_run import RayActorRunner, RunOptions

if TYPE_CHECKING:

    from sweeper.run.cluster import ClusterInfo


# -- planning ------------------------------------------------------------------------------

@dataclass(frozen=True)
class PlanView:
    """A sweep's plan and, given a results directory, what a run there would do with each trial."""

    sweep: Sweep
    plan: Plan
    stored: dict[str, StoredTrial]
    retry_failed: bool = False

    def status(self, pt: PlannedTrial) -> str:
        """run | skipped | done (ok) | done (failed: reason) | space (a point a search may ask for)."""
        if self.sweep.search is not None:
            return "space" if pt.runnable else "skipped"
        found = self.stored.get(pt.trial.trial_id)
        if found is not None and pt.runnable and is_settled(found, self.retry_failed):
            return f"done ({found.status})" if found.status == Status.OK else f"done ({found.status}: {found.reason})"
        return "run" if pt.runnable else "skipped"

    def to_run(self) -> list[PlannedTrial]:
        return [pt for pt in self.plan.trials if self.status(pt) == "run"]

    def done(self) -> int:
        return sum(1 for pt in self.plan.trials if self.status(pt).startswith("done"))


def stored_trials(output: str | None, observer: Observer) -> dict[str, StoredTrial]:
    """The trials a results directory already holds (none without one)."""
    if output is None:
        return {}
    store = ResultStore(output, on_quarantine=observer.warn)
    return store.stored_trials() if store.exists() else {}


def plan_sweep(sweep_file: str | Path, device: Device | None = None, *, address: str | None = None,
               output: str | None = None, retry_failed: bool = False, observer: Observer | None = None,
               gpus_per_node: int | None = None) -> PlanView:
    """Expand a sweep into its plan for ``device`` (None: the cluster's, or this machine's).

    With ``address`` the cluster's nodes say what is installed, and its autoscaler's node types
    (or ``gpus_per_node``) what GPU nodes it can launch; without, this machine stands in for the
    cluster. With ``output``, the view knows the trials already done there.
    """
    from sweeper.plan.capabilities import local_capabilities, local_gpus

    observer = observer or Quiet()
    check_gpus_per_node(gpus_per_node, joins_cluster=bool(address))
    sweep = load_sweep(sweep_file)
    if address:
        from sweeper.run.cluster import connect

        cluster = declared(connect(address), gpus_per_node)
        plan = cluster_plan(sweep, device or cluster.device, str(sweep_file),
                            expand(sweep, sweep_path=str(sweep_file)), cluster.node_types)
    else:
        gpus = local_gpus()
        found: Device = "cuda" if gpus else "cpu"
        plan = make_plan(sweep, device or found, sweep_path=str(sweep_file), capabilities=local_capabilities(gpus))
        plan.notes[-1] += " (no --address: this machine stands in for the cluster)"
    return PlanView(sweep, plan, stored_trials(output, observer), retry_failed)


def cluster_plan(sweep: Sweep, device: Device, sweep_path: str, expanded: tuple[list[Trial], int],
                 node_types: NodeTypes | None = None) -> Plan:
    """The sweep's plan on the connected cluster, judged by what its nodes have installed and
    by the node types its autoscaler may launch (how wide a trial may be).

    This process's last answer for the same nodes is reused when the plan it gives skips no
    trial (a sweep run again, another sweep through the same driver); a plan that would skip
    one is made again from the nodes' answer now, since what was missing may be installed."""
    from sweeper.plan.capabilities import probe_cluster

    def probe(reuse: bool) -> Capabilities:
        return replace(probe_cluster(reuse=reuse), node_types=node_types or NodeTypes())

    capabilities = probe(reuse=True)
    plan = make_plan(sweep, device, sweep_path=sweep_path, capabilities=capabilities, expanded=expanded)
    if capabilities.reused and plan.skipped:
        plan = make_plan(sweep, device, sweep_path=sweep_path, capabilities=probe(reuse=False), expanded=expanded)
    return plan


def check_gpus_per_node(gpus_per_node: int | None, *, joins_cluster: bool) -> None:
    """``gpus_per_node`` declares the GPU nodes of a cluster's autoscaler: a count of at least
    one, for a cluster that is joined (not this machine, nor the embedded local Ray)."""
    from sweeper.core.errors import UserInputError

    if gpus_per_node is None:
        return
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise UserInputError(f"--gpus-per-node {gpus_per_node}: expected a whole number of GPUs, at least 1")
    if not joins_cluster:
        raise UserInputError("--gpus-per-node declares the GPU nodes a cluster's autoscaler launches: it needs "
                             "--address (the local Ray launches no node)")


def declared(cluster: ClusterInfo, gpus_per_node: int | None) -> ClusterInfo:
    """The cluster with the GPU nodes the user declares (``--gpus-per-node``) among its node types."""
    if gpus_per_node is None:
        return cluster
    return replace(cluster, node_types=cluster.node_types.declare(gpus_per_node))


# -- running -------------------------------------------------------------------------------

@dataclass
class RunSetup:
    """A sweep checked and its results directory taken (its lock held until ``close``)."""

    sweep: Sweep
    sweep_path: str
    expanded: tuple[list[Trial], int]  # the sweep's trials and how many its exclude rules removed
    store: ResultStore
    lock: RunLock
    low_space: str | None  # a warning: the destination's free space looks short

    def close(self) -> None:
        self.lock.release()


@contextmanager
def open_run(sweep_file: str | Path, output: str | None = None,
             observer: Observer | None = None) -> Iterator[RunSetup]:
    """Check the sweep (every model resolves, every external server answers) and take its
    results directory (default ``results/<name>``), before a cluster starts or a GPU spins.
    Raises ``UserInputError`` for bad input; the directory's lock is released on exit."""
    observer = observer or Quiet()
    sweep = load_sweep(sweep_file)
    expanded = expand(sweep, sweep_path=str(sweep_file))  # once: every model resolves, the dataset is read
    check_servers(sweep, str(sweep_file))
    store = ResultStore(output or str(Path("results") / sweep.name), on_quarantine=observer.warn)
    low_space = check_destination(store)
    lock = RunLock(store)
    lock.acquire()
    setup = RunSetup(sweep, str(sweep_file), expanded, store, lock, low_space)
    try:
        if low_space:
            observer.warn(low_space)
        if (took_over := lock.took_over_text()) is not None:
            observer.say(f"sweeper: {took_over}")
        yield setup
    finally:
        setup.close()


@dataclass(frozen=True)
class RunResult:
    """What a run did: its summary, and the rows of each aggregated table."""

    summary: RunSummary
    counts: dict[str, int]
    store: ResultStore


def run_sweep(setup: RunSetup, options: RunOptions | None = None, *, address: str | None = None,
              observer: Observer | None = None, gpus_per_node: int | None = None) -> RunResult:
    """Run the sweep's missing trials on Ray (joining ``address``, else an embedded local Ray),
    write each one's shards as it ends, then aggregate the tables. ``gpus_per_node``: the GPUs
    of the nodes the cluster's autoscaler launches, where sweeper cannot read its node types.

    Raises ``UserInputError`` (a cluster that cannot be joined, an energy site on no node of
    it) and ``ResultsWriteError`` (results that could not be written).
    """
    options, observer = options or RunOptions(), observer or Quiet()
    from sweeper.run.cluster import connected_gcs

    check_gpus_per_node(gpus_per_node, joins_cluster=bool(address) or connected_gcs() is not None)
    store, sweep = setup.store, setup.sweep
    # The store's first look lists the shard directories once: what is stored, and what a killed
    # run's writers left half-written, removed here under the run lock.
    store.stored_trials()
    store.remove_stale_temporaries()
    if not address:
        done = _nothing_to_run(setup, options.retry_failed, observer)
        if done is not None:
            return done
    cluster = declared(_join(address, observer), gpus_per_node)
    check_energy_sites(sweep, cluster.node_ips, setup.sweep_path)
    from sweeper.plan.capabilities import local_capabilities

    # The embedded local Ray's workers share this interpreter: no probe needed there.
    if cluster.embedded:
        plan = make_plan(sweep, cluster.device, sweep_path=setup.sweep_path,
                         capabilities=local_capabilities(cluster.gpus), expanded=setup.expanded)
    else:
        plan = cluster_plan(sweep, cluster.device, setup.sweep_path, setup.expanded, cluster.node_types)
    store.write_plan(sweep.name, [pt.trial.trial_id for pt in plan.trials], sweep.report)
    for warning in plan.warnings:
        observer.warn(warning)
    observer.say(f"sweeper: {sweep.name}: {_work(plan)}, {len(plan.skipped)} skipped, on {cluster.text()}; "
                 f"results in {store.uri}")
    search = None
    if sweep.search is not None:
        from sweeper.run.search import SearchRun

        widest = max((t.num_gpus for t in plan.runnable), default=1)
        search = SearchRun(plan, sweep.search, cluster.device, parallel=cluster.slots // max(widest, 1))
    sweep_run = build_sweep_run(plan, store, cluster, RayActorRunner(), options=options, observer=observer,
                                search=search)
    summary = sweep_run.run()
    searched = sweep_run.searched_plan()
    if searched is not None:
        store.write_plan(sweep.name, searched[0], sweep.report, derived=searched[1])
    return RunResult(summary, store.aggregate(), store)



def _join(address: str | None, observer: Observer) -> ClusterInfo:
    from sweeper.run.cluster import connect, connected_gcs

    gcs = connected_gcs()
    if gcs is not None:
        observer.say(f"sweeper: on the Ray cluster this process is connected to{' (GCS ' + gcs + ')' if gcs else ''}")
    else:
        observer.say(f"sweeper: {'connecting to ' + address if address else 'starting Ray (local)'} ...")
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    cluster = connect(address)
    if main:
        # Ray's driver installs a SIGTERM handler of its own (a C stack dump, exit 1): the caller's again.
        signal.signal(signal.SIGTERM, previous)
    return cluster


def _work(plan: Plan) -> str:
    """What the run will do, in words: its trials, or its searches' most."""
    from sweeper.plan.search_bounds import search_bounds

    bounds = search_bounds(plan)
    if plan.sweep.search is not None and bounds is not None:
        return (f"a search of {bounds.points} point(s) over {len(plan.runnable)} runnable grid point(s) and "
                f"its ranges (at most {bounds.probes} trial(s) a point)")
    if bounds is not None:
        return (f"{len(plan.runnable)} configuration(s) to search for their capacity (at most {bounds.probes} "
                f"probe(s) each) in {plan.load_count()} group(s)")
    return f"{len(plan.runnable)} trials to run in {plan.load_count()} group(s)"


def _nothing_to_run(setup: RunSetup, retry_failed: bool, observer: Observer) -> RunResult | None:
    """When every trial of the sweep already has its result here, the result without starting Ray.

    Only for the embedded cluster: this machine is the whole cluster, so a trial
    skipped here as unsupported would be skipped again (``still_unsupported``: no plan
    is made to ask).
    """
    sweep, store = setup.sweep, setup.store
    trials = setup.expanded[0]
    stored = store.stored_trials()
    if sweep.search is not None:
        return None  # what a search asks next is Optuna's to say: it runs (on stored points, at once)
    if not trials or not all(is_settled(stored.get(t.trial_id), retry_failed, still_unsupported=True)
                             for t in trials):
        return None
    # A capacity search is done when its stored probes answer it, not when its first one is stored:
    # the run's own policy replays them (sweeper.run.search_policy).
    searches = SearchPolicy(store, retry_failed)
    start = searches.start([t for t in trials if t.load_search is not None])
    if start.todo:
        return None
    grid_ids = [t.trial_id for t in trials]
    ids, derived = searches.searched_plan(grid_ids) or (grid_ids, {})
    store.write_plan(sweep.name, ids, sweep.report, derived=derived)
    for _, found in start.decision.found:  # the answers as the stored probes give them now
        store.write_derived("capacity", found.capacity_id or "", found)
    ids = list(dict.fromkeys(ids))  # a search's first probe is a grid trial too
    statuses = [stored[trial_id].status for trial_id in ids]
    ok, skipped = statuses.count(Status.OK), statuses.count(Status.SKIPPED)
    kept = len(ids) - ok - skipped
    observer.say(f"resuming: {ok} trial(s) already ok" + (f", {kept} failed kept" if kept else "")
                 + (f", {skipped} skipped" if skipped else "") + "; 0 to run (Ray not started)")
    counts = {"trials": len(ids)} if store.up_to_date() else store.aggregate()
    return RunResult(RunSummary(planned=len(ids), resumed=len(ids)), counts, store)
