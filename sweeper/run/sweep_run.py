"""Running a plan on Ray: one actor per trial group, results written as they arrive.

Each group's actor holds one GPU (or, on a CPU-only cluster, a whole node's
CPUs, so no two measured trials ever share a device). Ray queues actors whose
resources are busy, so groups run concurrently up to what the cluster has. The
driver receives every outcome and writes its shards itself: results land in
the driver's output directory whatever filesystem the workers see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sweeper.core.outcome import LoadResult, TrialOutcome
from sweeper.plan.expand import Plan, TrialGroup
from sweeper.run.cluster import ClusterInfo
from sweeper.run.progress import Placement, ProgressView
from sweeper.run.storage import ResultStore
from sweeper.core.trial import Trial


@dataclass
class PlacementUse:
    trials: int = 0
    busy_s: float = 0.0
    model_loads: int = 0


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
    retries: int = 0  # trial attempts re-run after their actor died
    busy_s: float = 0.0  # sum over trials of the time an actor spent running them
    slots: int = 1  # GPUs (or, CPU-only, nodes) the sweep could use at once
    failures: list[str] = field(default_factory=list)
    # Per node and GPU set (as placed): trials run there and their busy seconds.
    placements: dict[str, PlacementUse] = field(default_factory=dict)

    @property
    def busy_fraction(self) -> float | None:
        """Share of the slots' wall time spent running trials (loads and idle slots are the rest)."""
        if self.wall_s <= 0:
            return None
        return self.busy_s / (max(self.slots, 1) * self.wall_s)


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


def predicted_oom(oom_trial: Trial, pending: list[Trial]) -> list[Trial]:
    """The pending trials that ``oom_trial`` running out of memory predicts will too.

    Same loaded model (group), same workload shape, a larger batch: they need
    at least the memory that was not there. The repeat index does not change
    memory, so every repeat of a larger batch is predicted alike.
    """
    return [t for t in pending
            if t.load_key == oom_trial.load_key and t.batch_size > oom_trial.batch_size
            and (t.input_len, t.output_len, t.layer_profile) == (oom_trial.input_len, oom_trial.output_len,
                                                                 oom_trial.layer_profile)]


@dataclass(eq=False)  # identity: a group's state is a key of the progress view
class _GroupRun:
    """One group's progress: its actor (replaced when it dies or hangs) and its queue."""

    group: TrialGroup
    options: dict[str, Any]  # Ray resources of the group's actor
    pending: list[Trial]
    actor: Any = None
    load: LoadResult | None = None
    current: Trial | None = None  # submitted, or waiting for a fresh actor to retry it
    # Times the current trial's actor died under it (loading or running it); before
    # the first trial, deaths while loading the group's model.
    deaths: int = 0
    started_s: float = 0.0  # monotonic time the current attempt was submitted
    attempt: int = 0  # actors started for this group; tells a stale actor's replies apart
    placement: Placement | None = None

    def timed_out(self, now_s: float) -> bool:
        limit_s = self.current.measure.timeout_s if self.current is not None else None
        return limit_s is not None and now_s - self.started_s > limit_s


def _summary_text(row: dict) -> str:
    if row.get("status") != "ok":
        return (row.get("error") or "")[:200]
    parts = [f"{row['throughput_tok_s']:,.1f} tok/s", f"ttft {row['ttft_s'] * 1e3:,.1f} ms"]
    if row.get("energy_per_token_j") is not None:
        parts.append(f"{row['energy_per_token_j']:.4f} J/tok")
    return "  ".join(parts)


def run_plan(plan: Plan, store: ResultStore, cluster: ClusterInfo, *, retry_failed: bool = False,
             quiet: bool = False, console=None, max_retries: int = 2, oom_pruning: bool = True) -> RunSummary:
    """Run ``plan``'s missing trials, writing each one's shards as it ends.

    Faults end as rows, never as a stopped sweep: an actor that dies has its
    trial retried on a fresh actor up to ``max_retries`` times (then ``failed``,
    ``actor_died``); a trial past ``measure.timeout_s`` is ``failed``
    (``timeout``) and its actor replaced, since a hung generate cannot be
    interrupted from outside; an ``oom`` trial has the larger batches of its
    shape recorded ``skipped`` (``predicted_oom``) when ``oom_pruning``.
    """
    import ray
    from ray.exceptions import RayActorError, RayError

    from actors.actor import TrialRunner

    t_begin = time.monotonic()
    recorder = Recorder(store)
    summary = RunSummary(planned=len(plan.trials), slots=cluster.slots)
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

    remote_runner = ray.remote(TrialRunner)
    gpu = cluster.device == "cuda"
    # object ref -> (group, "ping" | "load" | "run", the group's actor attempt)
    runs: dict[Any, tuple[_GroupRun, str, int]] = {}
    active: list[_GroupRun] = []

    def start_actor(g: _GroupRun, view: ProgressView) -> None:
        g.actor = remote_runner.options(**g.options).remote()
        g.load, g.placement = None, None
        g.attempt += 1
        view.group_waiting(g, g.group.label, g.options["num_gpus"])
        # Actor calls run in order: the ping answers as soon as Ray has placed the
        # actor, before its load, so the display shows where it is loading.
        runs[g.actor.ping.remote()] = (g, "ping", g.attempt)
        runs[g.actor.load.remote(g.group.trials[0])] = (g, "load", g.attempt)
        summary.model_loads += 1

    def replace_actor(g: _GroupRun, view: ProgressView) -> None:
        ray.kill(g.actor)  # a dead one is already gone; a hung one must not hold its GPU
        if g.current is not None or g.pending:
            start_actor(g, view)
        else:
            view.group_done(g)

    def submit(g: _GroupRun, view: ProgressView) -> None:
        if g.current is None:
            if not g.pending:
                # close() first: a backend whose engine runs in child processes (vLLM)
                # must end them, or they keep the GPU after the actor is killed.
                ray.wait([g.actor.close.remote()], timeout=CLOSE_TIMEOUT_S)
                ray.kill(g.actor)  # frees its GPU for a waiting group
                view.group_done(g)
                return
            g.current, g.deaths = g.pending.pop(0), 0
        view.trial_started(g.current, g)
        g.started_s = time.monotonic()
        runs[g.actor.run.remote(g.current)] = (g, "run", g.attempt)

    def finish(g: _GroupRun, row: dict, tables: dict[str, Any], view: ProgressView) -> None:
        """Record the current trial's final row; prune what its OOM predicts."""
        trial, g.current = g.current, None
        row.setdefault("load_s", g.load.load_s if g.load else None)
        recorder.record(trial, row, tables)
        summary.ran += 1
        if row["status"] == "ok":
            summary.ok += 1
        else:
            summary.failed += 1
            summary.failures.append(f"{trial.label()}: {row.get('error')}")
        view.trial_finished(trial, row["status"], _summary_text(row))
        if oom_pruning and row.get("reason") == "oom":
            for t in predicted_oom(trial, g.pending):
                g.pending.remove(t)
                text = f"predicted out of memory: batch {trial.batch_size} of the same shape ran out ({trial.trial_id})"
                recorder.record(t, _skipped_row("predicted_oom", text))
                summary.skipped += 1
                view.trial_finished(t, "skipped", text)

    def fail_rest(g: _GroupRun, reason: str, text: str, view: ProgressView) -> None:
        queue = ([g.current] if g.current is not None else []) + g.pending
        g.current, g.pending = None, []
        for t in queue:
            recorder.record(t, _failed_row(reason, text))
            summary.failed += 1
            summary.failures.append(f"{t.label()}: {text}")
            view.trial_finished(t, "failed", text)

    def on_ping(g: _GroupRun, ref: Any, attempt: int, view: ProgressView) -> None:
        try:
            info = ray.get(ref)
        except RayError:
            return  # the actor died before it answered: its load reports that
        if attempt != g.attempt:
            return
        g.placement = Placement(info["hostname"], info["ray_node_id"] or "", info.get("ray_gpu_ids"))
        use = summary.placements.setdefault(str(g.placement), PlacementUse())
        use.model_loads += 1
        view.group_placed(g, g.placement)

    def on_load(g: _GroupRun, ref: Any, view: ProgressView) -> None:
        try:
            g.load = ray.get(ref)
        except RayActorError as exc:
            # Like a death mid-trial (a node lost, the OOM killer): retry on a fresh actor.
            g.deaths += 1
            if g.deaths <= max_retries:
                summary.retries += 1
                view.console.print(f"retry {g.deaths}/{max_retries}: actor died loading {g.group.label}: "
                                   f"{_first_line(exc)}", highlight=False, markup=False)
                replace_actor(g, view)
                return
            g.load = LoadResult(ok=False, reason="actor_died",
                                error=f"actor died {g.deaths} time(s) loading it: {_first_line(exc)}")
        except RayError as exc:
            g.load = LoadResult(ok=False, reason="load_failed", error=_first_line(exc))
        view.group_loaded(g)
        if g.load.ok:
            submit(g, view)
            return
        fail_rest(g, g.load.reason or "load_failed", f"model load failed: {g.load.error}", view)
        ray.kill(g.actor)
        view.group_done(g)

    def on_run(g: _GroupRun, ref: Any, view: ProgressView) -> None:
        add_busy(g, time.monotonic() - g.started_s)
        try:
            outcome: TrialOutcome = ray.get(ref)
        except RayActorError as exc:
            on_actor_death(g, _first_line(exc), view)
            return
        except RayError as exc:  # the call itself failed (e.g. an argument that did not deserialize)
            finish(g, _failed_row("exception", _first_line(exc)), {}, view)
        else:
            finish(g, outcome.row, outcome.tables, view)
        submit(g, view)

    def on_actor_death(g: _GroupRun, text: str, view: ProgressView) -> None:
        g.deaths += 1
        if g.deaths <= max_retries:
            summary.retries += 1  # g.current stays: it re-runs once the fresh actor has loaded
            view.console.print(f"retry {g.deaths}/{max_retries}: actor died running {g.current.label()}: {text}",
                               highlight=False, markup=False)
        else:
            finish(g, _failed_row("actor_died", f"actor died {g.deaths} time(s) running this trial: {text}"),
                   {}, view)
        replace_actor(g, view)

    def add_busy(g: _GroupRun, busy_s: float) -> None:
        summary.busy_s += busy_s
        if g.placement is not None:
            use = summary.placements.setdefault(str(g.placement), PlacementUse())
            use.trials += 1
            use.busy_s += busy_s

    def on_timeout(ref: Any, g: _GroupRun, view: ProgressView) -> None:
        runs.pop(ref)
        add_busy(g, time.monotonic() - g.started_s)
        limit_s = g.current.measure.timeout_s
        finish(g, _failed_row("timeout", f"trial ran past measure.timeout_s = {limit_s:g} s; actor replaced"),
               {}, view)
        replace_actor(g, view)

    groups = plan.groups(todo)
    with ProgressView(len(todo), slots=cluster.slots, console=console, quiet=quiet) as view:
        for group in groups:
            # One GPU per group when there are GPUs; otherwise a whole node's CPUs.
            options = ({"num_gpus": group.num_gpus, "num_cpus": 1} if gpu
                       else {"num_gpus": 0, "num_cpus": cluster.min_node_cpus})
            g = _GroupRun(group, options, list(group.trials))
            active.append(g)
            start_actor(g, view)
        try:
            while runs:
                ready, _ = ray.wait(list(runs), num_returns=1, timeout=0.25)
                view.refresh()
                for ref in ready:
                    g, what, attempt = runs.pop(ref)
                    if what == "ping":
                        on_ping(g, ref, attempt, view)
                    else:
                        (on_load if what == "load" else on_run)(g, ref, view)
                now_s = time.monotonic()
                for ref, (g, what, _) in list(runs.items()):
                    if what == "run" and g.timed_out(now_s):
                        on_timeout(ref, g, view)
        except KeyboardInterrupt:
            # Running trials are dropped, not recorded: a second run finds them missing.
            for g in active:
                if g.actor is not None:
                    ray.kill(g.actor)
            raise
    summary.wall_s = time.monotonic() - t_begin
    return summary


# How long a finished group's actor may take to release its backend before it is killed.
CLOSE_TIMEOUT_S = 60.0


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
