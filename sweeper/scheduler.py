"""Running a plan on Ray: one actor per trial group, results written as they arrive.

Each group's actor holds one GPU (or, on a CPU-only cluster, a whole node's
CPUs, so no two measured trials ever share a device). Ray queues actors whose
resources are busy, so groups run concurrently up to what the cluster has. The
driver receives every outcome and writes its shards itself: results land in
the driver's output directory whatever filesystem the workers see.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sweeper.outcome import LoadResult, TrialOutcome
from sweeper.plan import Plan, TrialGroup
from sweeper.progress import ProgressView
from sweeper.storage import ResultStore
from sweeper.trial import Trial


@dataclass(frozen=True)
class ClusterInfo:
    gpus: int
    cpus: int
    nodes: int
    min_node_cpus: int

    @property
    def device(self) -> str:
        return "cuda" if self.gpus > 0 else "cpu"

    @property
    def slots(self) -> int:
        return self.gpus if self.gpus else self.nodes


def connect(address: str | None) -> ClusterInfo:
    """Join ``address`` or start the embedded local Ray; describe what is there."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import logging

    import ray

    if not ray.is_initialized():
        common: dict[str, Any] = dict(logging_level=logging.ERROR, log_to_driver=False)
        if address:
            ray.init(address=address, **common)
        else:
            ray.init(include_dashboard=False, **common)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    resources = ray.cluster_resources()
    node_cpus = [int(n["Resources"].get("CPU", 0)) for n in nodes] or [1]
    return ClusterInfo(gpus=int(resources.get("GPU", 0)), cpus=int(resources.get("CPU", 0)),
                       nodes=len(nodes), min_node_cpus=max(min(node_cpus), 1))


@dataclass
class RunSummary:
    planned: int
    ran: int = 0
    ok: int = 0
    failed: int = 0
    skipped: int = 0
    resumed: int = 0  # already had an ok (or kept failed) shard
    wall_s: float = 0.0
    model_loads: int = 0
    failures: list[str] = field(default_factory=list)


def _resume_filter(trials: list[Trial], store: ResultStore, retry_failed: bool) -> tuple[list[Trial], int, int]:
    stored = store.stored_trials()
    todo, have_ok, kept_failed = [], 0, 0
    for t in trials:
        s = stored.get(t.trial_id)
        if s is not None and s.status == "ok":
            have_ok += 1
        elif s is not None and s.status == "failed" and not retry_failed:
            kept_failed += 1
        else:
            todo.append(t)
    return todo, have_ok, kept_failed


def _skipped_row(reason_code: str, text: str) -> dict:
    now = datetime.now(timezone.utc)
    return {"status": "skipped", "reason": reason_code, "error": text, "started_at": now, "finished_at": now}


def _failed_row(reason_code: str, text: str, extra: dict | None = None) -> dict:
    now = datetime.now(timezone.utc)
    return {**(extra or {}), "status": "failed", "reason": reason_code, "error": text,
            "started_at": now, "finished_at": now}


class Recorder:
    """Writes a trial's shards: auxiliary tables first, the trials row last (the commit)."""

    def __init__(self, store: ResultStore):
        self.store = store

    def record(self, trial: Trial, row: dict, tables: dict[str, Any] | None = None) -> None:
        for kind, table in (tables or {}).items():
            self.store.write_shard(kind, trial.trial_id, table)
        self.store.write_shard("trials", trial.trial_id, [{**trial.columns(), **row}])


@dataclass
class _GroupRun:
    group: TrialGroup
    actor: Any
    next_index: int = 0
    load: LoadResult | None = None

    def next_trial(self) -> Trial | None:
        if self.next_index >= len(self.group.trials):
            return None
        t = self.group.trials[self.next_index]
        self.next_index += 1
        return t


def _summary_text(row: dict) -> str:
    if row.get("status") != "ok":
        return (row.get("error") or "")[:200]
    parts = [f"{row['throughput_tok_s']:,.1f} tok/s", f"ttft {row['ttft_s'] * 1e3:,.1f} ms"]
    if row.get("energy_per_token_j") is not None:
        parts.append(f"{row['energy_per_token_j']:.4f} J/tok")
    return "  ".join(parts)


def run_plan(plan: Plan, store: ResultStore, cluster: ClusterInfo, *, retry_failed: bool = False,
             quiet: bool = False, console=None) -> RunSummary:
    import ray
    from ray.exceptions import RayError

    from actors.actor import TrialRunner

    t_begin = time.monotonic()
    recorder = Recorder(store)
    summary = RunSummary(planned=len(plan.trials))
    for p in plan.skipped:
        recorder.record(p.trial, _skipped_row("unsupported", p.skip_reason))
        summary.skipped += 1

    todo, have_ok, kept_failed = _resume_filter(plan.runnable, store, retry_failed)
    summary.resumed = have_ok + kept_failed
    if console is not None and (have_ok or kept_failed):
        msg = f"resuming: {have_ok} trial(s) already ok"
        if kept_failed:
            msg += f", {kept_failed} failed kept (use --retry-failed to re-run them)"
        console.print(msg + f"; {len(todo)} to run")

    groups = plan.groups(todo)
    remote_runner = ray.remote(TrialRunner)
    gpu = cluster.device == "cuda"
    runs: dict[Any, tuple[_GroupRun, str, Trial | None]] = {}
    active: list[_GroupRun] = []

    def submit_next(g: _GroupRun, view: ProgressView) -> None:
        trial = g.next_trial()
        if trial is None:
            ray.kill(g.actor)  # frees its GPU for a waiting group
            return
        view.trial_started(trial, g.group.label)
        runs[g.actor.run.remote(trial)] = (g, "run", trial)

    def fail_rest(g: _GroupRun, reason: str, text: str, view: ProgressView, extra: dict) -> None:
        while (t := g.next_trial()) is not None:
            recorder.record(t, _failed_row(reason, text, extra))
            summary.failed += 1
            summary.failures.append(f"{t.label()}: {text}")
            view.trial_finished(t, "failed", text)

    with ProgressView(len(todo), slots=cluster.slots, console=console, quiet=quiet) as view:
        for group in groups:
            # One GPU per group when there are GPUs; otherwise a whole node's CPUs.
            options = ({"num_gpus": group.num_gpus, "num_cpus": 1} if gpu
                       else {"num_gpus": 0, "num_cpus": cluster.min_node_cpus})
            g = _GroupRun(group, remote_runner.options(**options).remote())
            active.append(g)
            view.group_loading(group.label)
            runs[g.actor.load.remote(group.trials[0])] = (g, "load", None)
            summary.model_loads += 1
        try:
            while runs:
                ready, _ = ray.wait(list(runs), num_returns=1, timeout=0.25)
                view.refresh()
                for ref in ready:
                    g, what, trial = runs.pop(ref)
                    if what == "load":
                        try:
                            g.load = ray.get(ref)
                        except RayError as exc:
                            g.load = LoadResult(ok=False, reason="actor_died", error=str(exc).splitlines()[0])
                        view.group_loaded(g.group.label)
                        if g.load.ok:
                            submit_next(g, view)
                        else:
                            fail_rest(g, g.load.reason or "load_failed", f"model load failed: {g.load.error}",
                                      view, {})
                            ray.kill(g.actor)
                        continue
                    try:
                        outcome: TrialOutcome = ray.get(ref)
                        row, tables = outcome.row, outcome.tables
                    except RayError as exc:
                        row, tables = _failed_row("actor_died", str(exc).splitlines()[0]), {}
                    row.setdefault("load_s", g.load.load_s if g.load else None)
                    recorder.record(trial, row, tables)
                    summary.ran += 1
                    if row["status"] == "ok":
                        summary.ok += 1
                    else:
                        summary.failed += 1
                        summary.failures.append(f"{trial.label()}: {row.get('error')}")
                    view.trial_finished(trial, row["status"], _summary_text(row))
                    if row.get("reason") == "actor_died":
                        fail_rest(g, "actor_died", "the group's actor died in an earlier trial", view, {})
                        continue
                    submit_next(g, view)
        except KeyboardInterrupt:
            for g in active:
                ray.kill(g.actor)
            raise
    summary.wall_s = time.monotonic() - t_begin
    return summary
