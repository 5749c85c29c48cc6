"""Running a plan: one actor per trial group, results written as they arrive.

Each group's actor holds one GPU (or, on a CPU-only cluster, a whole node's
CPUs, so no two measured trials ever share a device). The cluster queues
actors whose resources are busy, so groups run concurrently up to what it has.
The driver receives every outcome and writes its shards itself: results land
in the driver's output directory whatever filesystem the workers see.

``SweepRun`` is the scheduler: its state lives in fields (one ``GroupRun`` per
group, each with an explicit ``GroupState``), and each event — an actor placed,
a model loaded, a trial done, an actor dead, a trial past its time limit — has
one method. It talks to the cluster only through an ``ActorRunner``
(``RayActorRunner`` in production), so it is tested without a cluster too.
"""

from __future__ import annotations

import contextlib
import enum
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sweeper.core.backends import BACKENDS
from sweeper.core.errors import SweeperError, first_line
from sweeper.core.outcome import LoadResult, TrialOutcome
from sweeper.core.results import Setup, TrialResult
from sweeper.core.stages import StageSpan
from sweeper.core.status import Reason, Status, failed_outcome, skipped_outcome
from sweeper.core.trial import Trial
from sweeper.plan.expand import Plan, TrialGroup
from sweeper.run.actor_runner import (
    ACTOR_CLASS,
    CLOSE_TIMEOUT_S,
    ActorDied,
    ActorRunner,
    CallFailed,
    CallKind,
    RayActorRunner,
)
from sweeper.run.cluster import ClusterInfo
from sweeper.run.observer import Observer, Quiet
from sweeper.run.progress import Placement, ProgressView, trial_line
from sweeper.run.recorder import Recorder
from sweeper.run.resume import is_settled, predicted_oom, resume_filter
from sweeper.run.splitting import best_split
from sweeper.run.storage import ResultStore
from sweeper.run.summary import PlacementUse, RunSummary

# The seam and the writer live in their own modules; these names stay importable from here.
__all__ = ["ACTOR_CLASS", "ActorDied", "ActorRunner", "CallFailed", "CallKind", "GroupRun", "GroupState",
           "RayActorRunner", "Recorder", "ResultsWriteError", "RunOptions", "RunSummary", "SweepRun",
           "is_settled", "predicted_oom", "resume_filter", "run_plan"]


class ResultsWriteError(SweeperError):
    """A shard could not be written (a full disk, a lost mount): the sweep stops, what was written stays."""


# -- records -----------------------------------------------------------------------------

@dataclass(frozen=True)
class RunOptions:
    retry_failed: bool = False  # re-run trials whose stored result is failed
    max_retries: int = 2  # re-runs of a trial whose actor died, before it is recorded failed
    oom_pruning: bool = True  # skip larger batches of a shape that ran out of memory
    split_groups: bool = True  # give a long group's last trials to an idle slot (sweeper.run.splitting)
    poll_s: float = 0.25  # how often the display refreshes and time limits are checked


# -- the state machine -------------------------------------------------------------------

class GroupState(enum.Enum):
    # Its actor is not requested yet: the group reads a fidelity reference that another group
    # of this run computes, and waits until that group holds its resources. Ray does not place
    # actors queued for the same resources in the order they were asked for; asked for at
    # once, a reader could get the slot first and load the reference precision itself.
    HELD = "held"
    WAITING = "waiting"  # its actor is requested; the cluster may be holding it back for resources
    LOADING = "loading"  # the actor is placed and loading the group's model
    RUNNING = "running"  # a trial is submitted (or about to be)
    DONE = "done"  # every trial recorded; its actor is gone


@dataclass(eq=False)  # identity: a group's run is a key of the progress view
class GroupRun:
    """One group's progress: its actor (replaced when it dies or hangs) and its queue."""

    group: TrialGroup
    resources: dict[str, Any]  # what the group's actor holds
    pending: list[Trial]
    state: GroupState = GroupState.WAITING
    actor: Any = None
    load: LoadResult | None = None
    current: Trial | None = None  # submitted, or waiting for a fresh actor to retry it
    # Times the current trial's actor died under it (loading or running it); before
    # the first trial, deaths while loading the group's model.
    deaths: int = 0
    started_s: float = 0.0  # monotonic time the current attempt was submitted
    placed_s: float = 0.0  # monotonic time the actor got its resources (its load's clock starts)
    attempt: int = 0  # actors started for this group; tells a stale actor's replies apart
    placement: Placement | None = None
    # The load's stage spans (and the actor's start), recorded with the next trial recorded.
    load_stages: list[StageSpan] = field(default_factory=list)
    # What a split weighs: the driver's seconds per finished trial.
    trials_timed: int = 0
    trial_s_total: float = 0.0
    # The groups whose actors are requested once this one is placed (or closed): those that
    # read the fidelity reference this group computes.
    readers: list[GroupRun] = field(default_factory=list)

    @property
    def mean_trial_s(self) -> float | None:
        return self.trial_s_total / self.trials_timed if self.trials_timed else None

    @property
    def label(self) -> str:
        return self.group.label

    def timed_out(self, now_s: float) -> bool:
        limit_s = self.current.measure.timeout_s if self.current is not None else None
        return limit_s is not None and now_s - self.started_s > limit_s

    def load_timed_out(self, now_s: float) -> bool:
        # Only once placed: an actor queued behind other groups for a GPU is not loading yet.
        limit_s = self.group.trials[0].measure.load_timeout_s
        return self.state is GroupState.LOADING and now_s - self.placed_s > limit_s


@dataclass(frozen=True)
class _Call:
    group: GroupRun
    kind: CallKind
    attempt: int  # the group's actor attempt the call went to
    # A close: the actor it ends (the group may have handed its own on) and when it is killed
    # if it has not closed by then.
    actor: Any = None
    deadline_s: float = 0.0


class SweepRun:
    """The missing trials of a plan, run group by group on actors; each event one method.

    Faults end as rows, never as a stopped sweep: an actor that dies has its
    trial retried on a fresh actor up to ``max_retries`` times (then ``failed``,
    ``actor_died``); a trial past ``measure.timeout_s`` is ``failed``
    (``timeout``) and its actor replaced, since a hung generate cannot be
    interrupted from outside; an ``oom`` trial has the larger batches of its
    shape recorded ``skipped`` (``predicted_oom``) when ``oom_pruning``.
    """

    def __init__(self, plan: Plan, store: ResultStore, cluster: ClusterInfo, runner: ActorRunner, *,
                 options: RunOptions = RunOptions(), observer: Observer | None = None, quiet: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        self.plan, self.cluster, self.runner, self.options = plan, cluster, runner, options
        self.clock = clock
        # What the run says (resuming, retries) goes to the observer; the live view to its console.
        self.observer: Observer = observer if observer is not None else Quiet()
        self.quiet = quiet
        self.recorder = Recorder(store)
        self.store = store
        self.summary = RunSummary(planned=len(plan.trials), slots=cluster.slots,
                                  slot_unit="GPU(s)" if cluster.gpus else "node(s)")
        self.groups: list[GroupRun] = []
        # The groups not done yet, in the order they started: what hand-over and splitting
        # look through after every trial, so that finished groups cost them nothing.
        self.open: list[GroupRun] = []
        self.longest_load_s: dict[str, float] = {}  # per backend, placement to loaded, this run
        self.calls: dict[Any, _Call] = {}  # future -> what it answers
        self.view: ProgressView | None = None

    # -- driving -----------------------------------------------------------------------
    def run(self) -> RunSummary:
        t_begin = self.clock()
        for p in self.plan.skipped:
            self.recorder.record(p.trial, TrialResult(skipped_outcome(Reason.UNSUPPORTED, p.skip_reason or "")))
            self.summary.skipped += 1
        todo = self._resume()
        with ProgressView(len(todo), slots=self.cluster.slots, console=self.observer.console,
                          quiet=self.quiet) as view:
            self.view = view
            self._start_groups(self.plan.groups(todo))
            try:
                while self.calls:
                    self.step()
                self.recorder.flush()
            except KeyboardInterrupt:
                # Running trials are dropped, not recorded: a second run finds them missing.
                # Finished ones are written before the interrupt goes on.
                self._kill_all()
                self._flush_quietly()
                raise
            except OSError as exc:
                self._kill_all()
                self._flush_quietly()
                raise ResultsWriteError(
                    f"writing results to {self.store.uri} failed ({exc.strerror or first_line(exc)}); the sweep "
                    f"stopped; the trial(s) it finished and wrote are kept: free space (or fix the "
                    f"destination) and run the same command again to resume") from None
            finally:
                self.recorder.shutdown()
        self.summary.wall_s = self.clock() - t_begin
        self.summary.write_s = self.recorder.write_s
        return self.summary

    def _flush_quietly(self) -> None:
        """Write what finished; a write that fails now was already reported (or will be resumed)."""
        with contextlib.suppress(OSError):
            self.recorder.flush()

    def _kill_all(self) -> None:
        for g in self.groups:
            if g.actor is not None and g.state is not GroupState.DONE:
                self.runner.kill(g.actor)
        for call in self.calls.values():
            if call.kind is CallKind.CLOSE:
                self.runner.kill(call.actor)

    def step(self) -> None:
        """Handle the calls that have returned, then the trials past their time limit."""
        ready = self.runner.wait(list(self.calls), self.options.poll_s)
        self._view.refresh()
        for future in ready:
            call = self.calls.pop(future)
            g = call.group
            if call.kind is CallKind.PING:
                self._answer_ping(g, future, call.attempt)
            elif call.kind is CallKind.LOAD:
                self._answer_load(g, future)
            elif call.kind is CallKind.CLOSE:
                self.on_closed(call)
            else:
                self._answer_run(g, future)
        now_s = self.clock()
        for future, call in list(self.calls.items()):
            if call.kind is CallKind.CLOSE and now_s > call.deadline_s:
                del self.calls[future]
                self.runner.kill(call.actor)  # a close that hangs must not hold its GPU
            elif call.kind is CallKind.RUN and call.group.timed_out(now_s):
                del self.calls[future]
                self.on_timeout(call.group)
            elif call.kind is CallKind.LOAD and call.group.load_timed_out(now_s):
                del self.calls[future]
                self.on_load_timeout(call.group)

    def _resume(self) -> list[Trial]:
        todo, have_ok, kept_failed = resume_filter(self.plan.runnable, self.store, self.options.retry_failed)
        self.summary.resumed = have_ok + kept_failed
        if have_ok or kept_failed:
            msg = f"resuming: {have_ok} trial(s) already ok"
            if kept_failed:
                msg += f", {kept_failed} failed or predicted out of memory kept (use --retry-failed to re-run them)"
            self.observer.say(msg + f"; {len(todo)} to run")
        return todo

    def _resources(self, group: TrialGroup) -> dict[str, Any]:
        # One GPU per group (tensor parallel: several) when there are GPUs; otherwise
        # a whole node's CPUs, so no two measured trials share a device.
        t = group.trials[0]
        extra = BACKENDS[t.backend].ray_resources(t.backend_options)
        placed: dict[str, Any] = {"resources": extra} if extra else {}
        # Variables the actor needs from the driver's environment (an external server's key):
        # in the actor's runtime environment, so they reach whichever node it lands on.
        needed = {name: os.environ[name] for name in BACKENDS[t.backend].actor_env(t.backend_options)
                  if name in os.environ}
        if needed:
            placed["runtime_env"] = {"env_vars": needed}
        if self.cluster.device == "cuda":
            return {"num_gpus": group.num_gpus, "num_cpus": 1, **placed}
        return {"num_gpus": 0, "num_cpus": self.cluster.min_node_cpus, **placed}

    @property
    def _view(self) -> ProgressView:
        if self.view is None:
            raise RuntimeError("the sweep run has not started")
        return self.view

    # -- actions -------------------------------------------------------------------------
    def start_actor(self, g: GroupRun) -> None:
        g.actor = self.runner.start(g.resources)
        g.load, g.placement, g.state = None, None, GroupState.WAITING
        g.attempt += 1
        self._view.group_waiting(g, g.label, g.resources["num_gpus"])
        # Actor calls run in order: the ping answers as soon as the actor is placed,
        # before its load, so the display shows where it is loading.
        self._submit(g, CallKind.PING)
        self._submit_load(g)
        self.summary.model_loads += 1

    def _submit(self, g: GroupRun, kind: CallKind, trial: Trial | None = None) -> None:
        self.calls[self.runner.call(g.actor, kind, trial)] = _Call(g, kind, g.attempt)

    def _submit_load(self, g: GroupRun) -> None:
        future = self.runner.call(g.actor, CallKind.LOAD, g.group.trials[0], g.group.load_request)
        self.calls[future] = _Call(g, CallKind.LOAD, g.attempt)

    def _start_groups(self, groups: list[TrialGroup]) -> None:
        """Request an actor for every group, in the plan's start order, except the readers of a
        reference another group computes: those are requested once that group is placed."""
        runs = [GroupRun(group, self._resources(group), list(group.trials)) for group in groups]
        computes = {t.load_key: g for g in runs for t in g.group.serves_reference}
        for g in runs:
            provider = computes.get(g.group.load_key)
            if provider is not None:
                provider.readers.append(g)
                g.state = GroupState.HELD
        for g in runs:
            self.groups.append(g)
            self.open.append(g)
            if g.state is not GroupState.HELD:
                self.start_actor(g)

    def _add(self, g: GroupRun) -> None:
        self.groups.append(g)
        self.open.append(g)
        self.start_actor(g)

    def _release_readers(self, g: GroupRun) -> None:
        """``g`` holds its resources (its calls run in order: the reference's claim comes first
        in its load), or has ended: the groups that read its reference may ask for theirs."""
        readers, g.readers = g.readers, []
        for h in readers:
            if h.state is GroupState.HELD:
                self.start_actor(h)

    def _close(self, g: GroupRun) -> None:
        g.state = GroupState.DONE
        self.open.remove(g)
        self._release_readers(g)

    def replace_actor(self, g: GroupRun) -> None:
        self.runner.kill(g.actor)
        if g.current is not None or g.pending:
            self.start_actor(g)
        else:
            self._close(g)
            self._view.group_done(g)

    def submit_next(self, g: GroupRun) -> None:
        """Run the group's current trial (a retry) or its next one; end the group when none is left."""
        if g.current is None:
            if not g.pending:
                self._done(g, close=True)
                return
            g.current, g.deaths = g.pending.pop(0), 0
        g.state = GroupState.RUNNING
        self._view.trial_started(g.current, g)
        g.started_s = self.clock()
        self._submit(g, CallKind.RUN, g.current)

    def _done(self, g: GroupRun, *, close: bool) -> None:
        self._close(g)  # its slot is free from here: a split may now use it
        successor = self._successor(g) if close else None
        if successor is None and close and self._split_long_group():
            successor = self._successor(g)  # the new copy takes this actor if it can
        if successor is not None:
            self.hand_over(g, successor)
        elif close:
            self._close_actor(g)
        else:
            self.runner.kill(g.actor)
        self._view.group_done(g)

    def _close_actor(self, g: GroupRun) -> None:
        """Ask the finished group's actor to release its backend, then (``on_closed``) end it, which
        frees its GPU for a waiting group. The driver goes on meanwhile: a vLLM engine takes
        seconds to end, and other GPUs' trials must not wait for it."""
        actor, g.actor = g.actor, None
        future = self.runner.close(actor)
        self.calls[future] = _Call(g, CallKind.CLOSE, g.attempt, actor=actor,
                                   deadline_s=self.clock() + CLOSE_TIMEOUT_S)

    def on_closed(self, call: _Call) -> None:
        """A finished group's actor has released its backend (or its close failed): end it."""
        self.runner.release(call.actor)

    def _split_long_group(self) -> bool:
        """Give the last trials of the running group that gains most to a second copy of its
        model on an idle slot (``sweeper.run.splitting``); True if one was split."""
        if not self.options.split_groups or not self._idle_slot():
            return False
        best: tuple[float, GroupRun, int] | None = None
        for g in self.open:
            # Tensor-parallel groups stay whole: the free GPUs may sit on different nodes.
            if g.state is not GroupState.RUNNING or g.mean_trial_s is None or g.resources["num_gpus"] > 1:
                continue
            # What another load costs: the longest placement-to-loaded of the backend this run
            # (a fresh process's imports included), so a cheap hand-over does not make splits look free.
            load_s = self.longest_load_s.get(g.group.backend, 0.0)
            split = best_split(len(g.pending), g.mean_trial_s, load_s)
            if split is not None and (best is None or split.saving_s > best[0]):
                best = (split.saving_s, g, split.moved)
        if best is None:
            return False
        _, g, moved = best
        h = GroupRun(g.group, g.resources, g.pending[-moved:])
        del g.pending[-moved:]
        self.summary.group_splits += 1
        self._add(h)
        return True

    def _idle_slot(self) -> bool:
        """A slot holds no actor and no group waits for one (a waiting group gets it first)."""
        if any(g.state in (GroupState.HELD, GroupState.WAITING) for g in self.open):
            return False
        if self.cluster.device == "cuda":
            return sum(g.resources["num_gpus"] for g in self.open) < self.cluster.gpus
        return len(self.open) < self.cluster.slots

    def _successor(self, g: GroupRun) -> GroupRun | None:
        """The first group still waiting for an actor that ``g``'s could serve: the same
        resources, and backends that let an actor go on after closing them."""
        return next((h for h in self.open if h.state is GroupState.WAITING and h.resources == g.resources
                     and h.group.may_follow(g.group)), None)

    def hand_over(self, g: GroupRun, h: GroupRun) -> None:
        """``g`` is done: its actor, already started and holding its GPU, loads ``h``'s model
        next, and ``h``'s own actor (still queued for resources) is cancelled. A new
        process per group would start, import its backend and queue for the GPU again:
        seconds of an idle GPU per group."""
        for future, call in list(self.calls.items()):
            if call.group is h:
                del self.calls[future]
        self.runner.kill(h.actor)
        h.actor, g.actor = g.actor, None
        h.attempt += 1
        h.load = None
        self.summary.actor_handovers += 1
        self.on_placed(h, g.placement)
        self._submit_load(h)

    @staticmethod
    def _failed(g: GroupRun, reason: Reason, text: str) -> TrialResult:
        """A trial the driver records failed (its actor died, hung or never loaded): what the
        driver knows of its group's load goes with it."""
        return TrialResult(failed_outcome(reason, text), setup=Setup(load_s=g.load.load_s if g.load else None))

    def _record(self, g: GroupRun, trial: Trial, result: TrialResult, tables: dict[str, Any],
                stages: list[StageSpan]) -> None:
        spans, g.load_stages = g.load_stages + stages, []
        self.summary.add_stages(spans, slots=self._width(g))
        self.recorder.record(trial, result, tables, spans, g.placement)

    def finish(self, g: GroupRun, result: TrialResult, tables: dict[str, Any],
               stages: list[StageSpan] | None = None) -> None:
        """Record the current trial's result; prune what its OOM predicts."""
        trial, g.current = g.current, None
        if trial is None:
            raise RuntimeError(f"{g.label}: a result arrived with no trial running")
        self._record(g, trial, result, tables, stages or [])
        self.summary.ran += 1
        outcome = result.outcome
        status = outcome.status or Status.FAILED
        if status == Status.OK:
            self.summary.ok += 1
        else:
            self.summary.failed += 1
            self.summary.failures.append(f"{trial.label()}: {outcome.error}")
        self._view.trial_finished(trial, status, trial_line(result))
        if self.options.oom_pruning and outcome.reason == Reason.OOM:
            # The group's trials may have been split among copies: prune them all.
            for t, copy in [(t, h) for h in self.open if h.group is g.group for t in predicted_oom(trial, h.pending)]:
                copy.pending.remove(t)
                text = (f"predicted out of memory: batch {trial.batch_size} of the same shape ran out "
                        f"({trial.trial_id})")
                self.recorder.record(t, TrialResult(skipped_outcome(Reason.PREDICTED_OOM, text)))
                self.summary.skipped += 1
                self._view.trial_finished(t, Status.SKIPPED, text)

    def fail_rest(self, g: GroupRun, reason: Reason, text: str) -> None:
        queue = ([g.current] if g.current is not None else []) + g.pending
        g.current, g.pending = None, []
        for t in queue:
            self._record(g, t, self._failed(g, reason, text), {}, [])
            self.summary.failed += 1
            self.summary.failures.append(f"{t.label()}: {text}")
            self._view.trial_finished(t, Status.FAILED, text)

    def add_busy(self, g: GroupRun, busy_s: float) -> None:
        # Slot-seconds: a tensor-parallel trial keeps each of its GPUs busy for its time.
        self.summary.busy_s += busy_s * self._width(g)
        g.trials_timed += 1
        g.trial_s_total += busy_s
        for slot in g.placement.slots if g.placement is not None else ():
            use = self.summary.placements.setdefault(slot, PlacementUse())
            use.trials += 1
            use.busy_s += busy_s

    @staticmethod
    def _width(g: GroupRun) -> int:
        """Slots the group's actor holds: its GPUs, or one (a CPU-only node's slot)."""
        return max(int(g.resources["num_gpus"]), 1)

    # -- replies -------------------------------------------------------------------------
    def _answer_ping(self, g: GroupRun, future: Any, attempt: int) -> None:
        try:
            info = self.runner.result(future)
        except (ActorDied, CallFailed):
            return  # the actor died before it answered: its load reports that
        if attempt == g.attempt:
            self.on_placed(g, info)

    def _answer_load(self, g: GroupRun, future: Any) -> None:
        try:
            result = self.runner.result(future)
        except ActorDied as exc:
            self.on_load_died(g, str(exc))
        except CallFailed as exc:
            self.on_loaded(g, LoadResult(ok=False, reason=Reason.LOAD_FAILED, error=str(exc)))
        else:
            self.on_loaded(g, result)

    def _answer_run(self, g: GroupRun, future: Any) -> None:
        self.add_busy(g, self.clock() - g.started_s)
        try:
            outcome: TrialOutcome = self.runner.result(future)
        except ActorDied as exc:
            self.on_actor_died(g, str(exc))
        except CallFailed as exc:
            self.on_trial_done(g, TrialOutcome(g.current.trial_id if g.current else "",
                                               self._failed(g, Reason.EXCEPTION, str(exc))))
        else:
            self.on_trial_done(g, outcome)

    # -- events --------------------------------------------------------------------------
    def on_placed(self, g: GroupRun, where: dict[str, Any] | Placement | None) -> None:
        """The group's actor got its resources and answered (or was handed over): show where it runs."""
        if isinstance(where, dict):
            where = Placement(where["hostname"], where["ray_node_id"] or "", where.get("ray_gpu_ids"))
        g.placement = where
        g.state, g.placed_s = GroupState.LOADING, self.clock()
        for slot in g.placement.slots if g.placement is not None else ():
            self.summary.placements.setdefault(slot, PlacementUse()).model_loads += 1
        if g.placement is not None:
            self._view.group_placed(g, g.placement)
        self._release_readers(g)

    def on_loaded(self, g: GroupRun, load: LoadResult) -> None:
        """The model load ended: run the group's trials, or fail them all with the load's error."""
        g.load = load
        g.load_stages += load.stages
        backend = g.group.backend
        self.longest_load_s[backend] = max(self.longest_load_s.get(backend, 0.0), self.clock() - g.placed_s)
        self._view.group_loaded(g)
        if load.ok:
            self.submit_next(g)
            return
        self.fail_rest(g, load.reason or Reason.LOAD_FAILED, f"model load failed: {load.error}")
        self._done(g, close=False)

    def on_load_died(self, g: GroupRun, text: str) -> None:
        """The actor died while loading (a node lost, the OOM killer): retry on a fresh actor."""
        self._load_lost(g, Reason.ACTOR_DIED, f"actor died loading {g.label}: {text}",
                        lambda n: f"actor died {n} time(s) loading it: {text}")

    def on_load_timeout(self, g: GroupRun) -> None:
        """The model load ran past ``measure.load_timeout_s``: a hung load is handled as a death."""
        limit_s = g.group.trials[0].measure.load_timeout_s
        self._load_lost(g, Reason.LOAD_TIMEOUT, f"load of {g.label} ran past measure.load_timeout_s = {limit_s:g} s",
                        lambda n: f"load ran past measure.load_timeout_s = {limit_s:g} s, {n} time(s); actor "
                                  f"replaced each time")

    def _load_lost(self, g: GroupRun, reason: Reason, retry_text: str, error: Callable[[int], str]) -> None:
        g.deaths += 1
        if g.deaths <= self.options.max_retries:
            self.summary.retries += 1
            self.observer.say(f"retry {g.deaths}/{self.options.max_retries}: {retry_text}")
            self.replace_actor(g)
            return
        # on_loaded ends the group and kills its actor: a hung one must not hold its GPU.
        self.on_loaded(g, LoadResult(ok=False, reason=reason, error=error(g.deaths)))

    def on_trial_done(self, g: GroupRun, outcome: TrialOutcome) -> None:
        self.finish(g, outcome.result, outcome.tables, outcome.stages)
        self._split_long_group()
        self.submit_next(g)

    def on_actor_died(self, g: GroupRun, text: str) -> None:
        """The actor died running a trial: retry it on a fresh actor, or record it failed."""
        g.deaths += 1
        if g.deaths <= self.options.max_retries:
            self.summary.retries += 1  # g.current stays: it re-runs once the fresh actor has loaded
            label = g.current.label() if g.current is not None else g.label
            self.observer.say(f"retry {g.deaths}/{self.options.max_retries}: actor died running {label}: {text}")
        else:
            self.finish(g, self._failed(g, Reason.ACTOR_DIED, f"actor died {g.deaths} time(s) running this trial: "
                                                             f"{text}"), {})
        self.replace_actor(g)

    def on_timeout(self, g: GroupRun) -> None:
        """The current trial ran past ``measure.timeout_s``: fail it, replace the hung actor."""
        self.add_busy(g, self.clock() - g.started_s)
        limit_s = g.current.measure.timeout_s if g.current is not None else None
        self.finish(g, self._failed(g, Reason.TIMEOUT, f"trial ran past measure.timeout_s = {limit_s:g} s; actor "
                                                       "replaced"), {})
        self.replace_actor(g)


def run_plan(plan: Plan, store: ResultStore, cluster: ClusterInfo, options: RunOptions | None = None, *,
             quiet: bool = False, observer: Observer | None = None, runner: ActorRunner | None = None) -> RunSummary:
    """Run ``plan``'s missing trials on Ray actors (see ``SweepRun``), writing each one's shards
    as it ends; what the run says goes to ``observer`` (its console carries the live view)."""
    return SweepRun(plan, store, cluster, runner or RayActorRunner(), options=options or RunOptions(),
                    observer=observer, quiet=quiet).run()
