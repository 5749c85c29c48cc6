"""A ``SweepRun`` built over a results directory: the writer of its results, its searches and
where it starts (what the directory already answers, computed before it runs), and what each
group's actor is asked for. The scheduler is handed these and reads neither the directory nor
the environment itself; this is the one place that joins them."""

from __future__ import annotations

import time
from collections.abc import Callable

from sweeper.plan.expand import Plan
from sweeper.run.actor_runner import ActorRunner, RayActorRunner
from sweeper.run.cluster import ClusterInfo
from sweeper.run.group_launch import GroupLaunch
from sweeper.run.group_run import RunOptions
from sweeper.run.observer import Observer
from sweeper.run.recorder import Recorder
from sweeper.run.search import SearchRun
from sweeper.run.search_policy import SearchPolicy
from sweeper.run.storage import ResultStore
from sweeper.run.summary import RunSummary
from sweeper.run.sweep_run import SweepRun


def build_sweep_run(plan: Plan, store: ResultStore, cluster: ClusterInfo, runner: ActorRunner, *,
                    options: RunOptions | None = None, observer: Observer | None = None,
                    clock: Callable[[], float] = time.monotonic, search: SearchRun | None = None) -> SweepRun:
    """``plan``'s run over ``store``: its stored results resumed (the searches replayed to where
    they stopped) before anything starts, each result written there as it arrives."""
    options = options if options is not None else RunOptions()
    searches = SearchPolicy(store, options.retry_failed, search)
    return SweepRun(plan, cluster, runner, sink=Recorder(store), searches=searches,
                    start=searches.start(plan.runnable), launch=GroupLaunch(cluster, store.server_log_dir),
                    options=options, observer=observer, clock=clock)


def run_plan(plan: Plan, store: ResultStore, cluster: ClusterInfo, options: RunOptions | None = None, *,
             observer: Observer | None = None, runner: ActorRunner | None = None) -> RunSummary:
    """Run ``plan``'s missing trials on Ray actors (see ``SweepRun``), writing each one's shards
    as it ends; what happens goes to ``observer`` as events (the command line's live view)."""
    return build_sweep_run(plan, store, cluster, runner or RayActorRunner(), options=options,
                           observer=observer).run()
