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
(``RayActorRunner`` in production), so it is tested without a cluster too. What
happened it tells its listeners as typed events (``sweeper.run.events``): the writer of
its results (a ``ResultSink``), the run's accounting (``RunSummary``) and its ``Observer``
(the command line's live view); it writes, counts and draws nothing itself. It is handed
what it needs, built over a results directory (``sweeper.run.assembly``): the sink, the
searches, where the run starts (``Start``: the trials still to run) and what each group's
actor is asked for (``GroupLaunch``), so it reads neither the directory nor the environment.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from sweeper.core.capacity import Capacity
from sweeper.core.errors import SweeperError, first_line
from sweeper.core.outcome import LoadResult, TrialOutcome
from sweeper.core.results import Setup, TrialResult
from sweeper.core.stages import StageSpan
from sweeper.core.status import Reason, failed_outcome, skipped_outcome
from sweeper.core.trial import Trial
from sweeper.plan.expand import Plan, TrialGroup
from sweeper.run.actor_policies import HandOver, OpenGroup, ReferenceReaders, Retries
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
from sweeper.run.events import (
    ActorHandedOver,
    ActorRequested,
    CapacityFound,
    GroupEnded,
    GroupLoaded,
    GroupPlaced,
    GroupSplit,
    Placement,
    PlanSkipped,
    Polled,
    ResultSink,
    Resumed,
    Retrying,
    RunEnded,
    RunEvent,
    RunStarted,
    SearchPointFound,
    SplitWithdrawn,
    TrialAdded,
    TrialRecorded,
    TrialStarted,
    TrialTimed,
)
from sweeper.run.group_launch import GroupLaunch
from sweeper.run.group_run import Call, GroupRun, GroupState, RunOptions
from sweeper.run.observer import Observer, Quiet
from sweeper.run.oom_pruning import OomPruning
from sweeper.run.search_policy import Decision, SearchPolicy, Start
from sweeper.run.splitting import RunningGroup, Splitting
from sweeper.run.summary import RunSummary

# The seam to the cluster lives in its own module; these names stay importable from here.
__all__ = ["ACTOR_CLASS", "ActorDied", "ActorRunner", "CallFailed", "CallKind", "GroupRun", "GroupState",
           "RayActorRunner", "ResultsWriteError", "RunOptions", "RunSummary", "SweepRun"]


class ResultsWriteError(SweeperError):
    """A shard could not be written (a full disk, a lost mount): the sweep stops, what was written stays."""


class SweepRun:
    """The missing trials of a plan, run group by group on actors; each event one method.

    Faults end as rows, never as a stopped sweep: an actor that dies has its
    trial retried on a fresh actor up to ``max_retries`` times (then ``failed``,
    ``actor_died``); a trial past ``measure.timeout_s`` is ``failed``
    (``timeout``) and its actor replaced, since a hung generate cannot be
    interrupted from outside; an ``oom`` trial has the larger batches of its
    shape recorded ``skipped`` (``predicted_oom``) when ``oom_pruning``.
    """

    def __init__(self, plan: Plan, cluster: ClusterInfo, runner: ActorRunner, *, sink: ResultSink,
                 searches: SearchPolicy, start: Start, launch: GroupLaunch, options: RunOptions | None = None,
                 observer: Observer | None = None, clock: Callable[[], float] = time.monotonic):
        self.plan, self.cluster, self.runner = plan, cluster, runner
        # What each group's actor is asked for and handed (resources, its load's request).
        self.launch = launch
        # Where the run starts: what the results directory answered, the trials left to run.
        self.start = start
        self.options = options if options is not None else RunOptions()
        # The out-of-memory rule: told each result, it returns the pending trials to skip.
        self.oom_pruning = OomPruning(self.options.oom_pruning)
        # The split rule: told the running groups while a slot is idle, it picks one to split.
        self.splitting = Splitting(self.options.split_groups)
        # Whether work whose actor died is tried again (sweeper.run.actor_policies).
        self.retries = Retries(self.options.max_retries)
        self.clock = clock
        self.observer: Observer = observer if observer is not None else Quiet()
        self.recorder = sink
        self.summary = RunSummary(planned=len(plan.trials), slots=cluster.slots,
                                  slot_unit="GPU(s)" if cluster.device == "cuda" else "node(s)")
        # Who hears what happened: the accounting first, so that a view reads settled counts.
        # The recorder first: a result is handed to its writer before anyone is told of it.
        self.listeners: tuple[Callable[[RunEvent], None], ...] = (
            self.recorder.on_event, self.summary.on_event, self.observer.on_event)
        self.groups: list[GroupRun] = []
        # The groups not done yet, in the order they started: what hand-over and splitting
        # look through after every trial, so that finished groups cost them nothing.
        self.open: list[GroupRun] = []
        self.longest_load_s: dict[str, float] = {}  # per backend, placement to loaded, this run
        self.calls: dict[Any, Call] = {}  # future -> what it answers
        # The sweep's searches (capacity per configuration, a search over configurations): told
        # every trial recorded, they decide what runs next (sweeper.run.search_policy).
        self.searches = searches

    def emit(self, event: RunEvent) -> None:
        for listener in self.listeners:
            listener(event)

    # -- driving -----------------------------------------------------------------------
    def run(self) -> RunSummary:
        t_begin = self.clock()
        search = self.searches.search
        # A search's grid is its space, not its work: only its points run. A space with no
        # runnable point at all records the grid's skips, which say why.
        if search is None or not self.plan.runnable:
            self.emit(PlanSkipped(tuple((p.trial, TrialResult(skipped_outcome(Reason.UNSUPPORTED, p.skip_reason or "")))
                                        for p in self.plan.skipped)))
        todo = self._resume()
        self.emit(RunStarted(len(todo), self.cluster.slots))
        try:
            self._start_groups(self.plan.groups(todo))
            while self.calls:
                self.step()
            if search is not None:
                for key, point in search.point_rows():
                    self.emit(SearchPointFound(key, point))
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
                f"writing results to {self.recorder.uri} failed ({exc.strerror or first_line(exc)}); the sweep "
                f"stopped; the trial(s) it finished and wrote are kept: free space (or fix the "
                f"destination) and run the same command again to resume") from None
        except BaseException:
            # A caller whose process lives on (a notebook, a test) keeps its Ray driver, and with
            # it the job's actors: none may outlive the run still holding its GPU.
            self._kill_all()
            raise
        finally:
            self.recorder.shutdown()
            if search is not None:
                self.summary.search = search.outcome()
            self.emit(RunEnded(self.clock() - t_begin, self.recorder.write_s))
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
        self.emit(Polled())
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
        """What is left to run, as the run's start says: stored results stand, and the searches
        have replayed what is stored."""
        start = self.start
        if start.already_ok or start.kept:
            self.emit(Resumed(start.already_ok, start.kept, len(start.todo)))
        for label, found in start.decision.found:
            self._capacity_found(label, found)
        return start.todo

    # -- actions -------------------------------------------------------------------------
    def start_actor(self, g: GroupRun) -> None:
        g.actor = self.runner.start(g.resources)
        g.load, g.placement, g.state = None, None, GroupState.WAITING
        g.attempt += 1
        self.emit(ActorRequested(g, g.label, g.resources["num_gpus"]))
        # Actor calls run in order: the ping answers as soon as the actor is placed,
        # before its load, so the display shows where it is loading.
        self._submit(g, CallKind.PING)
        self._submit_load(g)

    def _submit(self, g: GroupRun, kind: CallKind, trial: Trial | None = None) -> None:
        self.calls[self.runner.call(g.actor, kind, trial)] = Call(g, kind, g.attempt)

    def _submit_load(self, g: GroupRun) -> None:
        future = self.runner.call(g.actor, CallKind.LOAD, g.group.trials[0], self.launch.load_request(g.group))
        self.calls[future] = Call(g, CallKind.LOAD, g.attempt)

    def _start_groups(self, groups: list[TrialGroup]) -> None:
        """Request an actor for every group, in the plan's start order, except the readers of a
        reference another group computes: those are requested once that group is placed."""
        runs = [GroupRun(group, self.launch.resources(group), list(group.trials)) for group in groups]
        for reader, provider in ReferenceReaders.held(groups).items():
            runs[provider].readers.append(runs[reader])
            runs[reader].state = GroupState.HELD
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
            self.emit(GroupEnded(g))

    def submit_next(self, g: GroupRun) -> None:
        """Run the group's current trial (a retry) or its next one; end the group when none is left."""
        if g.current is None:
            if not g.pending and not self._take_back_from_waiting_copy(g):
                self._done(g, close=True)
                return
            g.current, g.deaths = g.pending.pop(0), 0
        g.state = GroupState.RUNNING
        self.emit(TrialStarted(g, g.current))
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
        self.emit(GroupEnded(g))

    def _close_actor(self, g: GroupRun) -> None:
        """Ask the finished group's actor to release its backend, then (``on_closed``) end it, which
        frees its GPU for a waiting group. The driver goes on meanwhile: a vLLM engine takes
        seconds to end, and other GPUs' trials must not wait for it."""
        actor, g.actor = g.actor, None
        future = self.runner.close(actor)
        self.calls[future] = Call(g, CallKind.CLOSE, g.attempt, actor=actor,
                                   deadline_s=self.clock() + CLOSE_TIMEOUT_S)

    def on_closed(self, call: Call) -> None:
        """A finished group's actor has released its backend (or its close failed): end it."""
        self.runner.release(call.actor)

    def _split_long_group(self) -> bool:
        """Give the last trials of the running group that gains most to a second copy of its
        model on an idle slot (``sweeper.run.splitting``); True if one was split."""
        if not self.splitting.enabled or not self._idle_slot():
            return False
        # What another load costs: the longest placement-to-loaded of the backend this run
        # (a fresh process's imports included), so a cheap hand-over does not make splits look free.
        decision = self.splitting.decide([
            RunningGroup(key=i, running=g.state is GroupState.RUNNING, pending=len(g.pending),
                         mean_trial_s=g.mean_trial_s, gpus=g.resources["num_gpus"], withdrawn=g.splits_withdrawn > 0,
                         load_s=self.longest_load_s.get(g.group.backend, 0.0))
            for i, g in enumerate(self.open)])
        if decision is None:
            return False
        g, moved = self.open[decision.key], decision.moved
        h = GroupRun(g.group, g.resources, g.pending[-moved:])
        del g.pending[-moved:]
        self.emit(GroupSplit(g, h, moved))
        self._add(h)
        return True

    def _take_back_from_waiting_copy(self, g: GroupRun) -> bool:
        """``g`` has run its trials while a copy split off it still waits for a slot (a busy
        cluster placed it late): ``g`` runs the copy's trials on the model it has loaded and the
        copy's actor request is withdrawn. Handing ``g``'s actor to the copy instead would load
        the same model again on it. True if there was such a copy."""
        # Its first actor still queued: a copy whose actor died and is being replaced may hold a
        # trial to retry, and its retries are its own.
        copy = next((h for h in self.open if h is not g and h.group is g.group
                     and h.state is GroupState.WAITING and h.attempt == 1), None)
        if copy is None:
            return False
        g.pending, copy.pending = copy.pending, []
        g.splits_withdrawn += 1
        self._withdraw_actor(copy)
        self._close(copy)
        self.emit(SplitWithdrawn(g, copy, len(g.pending)))
        self.emit(GroupEnded(copy))
        return True

    def _withdraw_actor(self, g: GroupRun) -> None:
        """Forget ``g``'s calls and end its actor, placed or still queued for resources."""
        for future, call in list(self.calls.items()):
            if call.group is g:
                del self.calls[future]
        self.runner.kill(g.actor)
        g.actor = None

    def _idle_slot(self) -> bool:
        """A slot holds no actor and no group waits for one (a waiting group gets it first)."""
        if any(g.state in (GroupState.HELD, GroupState.WAITING) for g in self.open):
            return False
        if self.cluster.device == "cuda":
            # The GPUs alive at the start only: a split onto a node still to be launched would
            # wait minutes for it, which the split's saving does not count.
            return sum(g.resources["num_gpus"] for g in self.open) < self.cluster.gpus
        return len(self.open) < self.cluster.slots

    def _successor(self, g: GroupRun) -> GroupRun | None:
        """The waiting group ``g``'s actor goes on to, if any (``HandOver``)."""
        # Keyed by place in ``open``, as the split rule's snapshot is; ``g`` is closed already.
        key = HandOver.successor(
            OpenGroup(key=None, group=g.group, resources=g.resources, waiting=False),
            [OpenGroup(key=i, group=h.group, resources=h.resources, waiting=h.state is GroupState.WAITING)
             for i, h in enumerate(self.open)])
        return self.open[key] if isinstance(key, int) else None

    def hand_over(self, g: GroupRun, h: GroupRun) -> None:
        """``g`` is done: its actor, already started and holding its GPU, loads ``h``'s model
        next, and ``h``'s own actor (still queued for resources) is cancelled. A new
        process per group would start, import its backend and queue for the GPU again:
        seconds of an idle GPU per group."""
        self._withdraw_actor(h)
        h.actor, g.actor = g.actor, None
        h.attempt += 1
        h.load = None
        self.emit(ActorHandedOver())
        self.on_placed(h, g.placement)
        self._submit_load(h)

    @staticmethod
    def _failed(g: GroupRun, reason: Reason, text: str) -> TrialResult:
        """A trial the driver records failed (its actor died, hung or never loaded): what the
        driver knows of its group's load goes with it."""
        return TrialResult(failed_outcome(reason, g.redacted(text)), setup=Setup(load_s=g.load.load_s if g.load else None))

    def _record(self, g: GroupRun, trial: Trial, result: TrialResult, tables: dict[str, Any],
                stages: list[StageSpan], *, ran: bool) -> None:
        spans, g.load_stages = g.load_stages + stages, []
        self.emit(TrialRecorded(trial, result, ran, tuple(spans), self._width(g), tables=tables, placement=g.placement))
        self._apply(g, self.searches.on_recorded(trial, {**trial.columns(), **result.row()}))

    def _apply(self, g: GroupRun, decision: Decision) -> None:
        """Do what the searches decided: a capacity search's next probe first on the same group
        (the engine it has loaded), a search's new points each as a group of its own."""
        for label, found in decision.found:
            self._capacity_found(label, found)
        if decision.probe is not None:
            g.pending.insert(0, decision.probe)
            self.emit(TrialAdded(decision.probe))
        for trial in decision.points:
            group = TrialGroup(trial.load_key, (trial,))
            self.emit(TrialAdded(trial))
            self._add(GroupRun(group, self.launch.resources(group), [trial]))

    def _capacity_found(self, label: str, found: Capacity) -> None:
        self.emit(CapacityFound(label, found))

    def searched_plan(self) -> tuple[list[str], dict[str, list[str]]] | None:
        """What the results directory answers for after this run where searches asked for
        trials the plan did not list (``SearchPolicy.searched_plan``); None for a plain grid."""
        searched = self.searches.searched_plan([p.trial.trial_id for p in self.plan.trials])
        if searched is not None and not self.plan.runnable:
            return [p.trial.trial_id for p in self.plan.trials], searched[1]  # the skips, which say why
        return searched

    def finish(self, g: GroupRun, result: TrialResult, tables: dict[str, Any],
               stages: list[StageSpan] | None = None) -> None:
        """Record the current trial's result; prune what its OOM predicts."""
        trial, g.current = g.current, None
        if trial is None:
            raise RuntimeError(f"{g.label}: a result arrived with no trial running")
        self._record(g, trial, result, tables, stages or [], ran=True)
        # The group's trials may have been split among copies: the policy sees them all.
        copies = [h for h in self.open if h.group is g.group]
        for skip in self.oom_pruning.after(trial, result, [t for h in copies for t in h.pending]):
            next(h for h in copies if skip.trial in h.pending).pending.remove(skip.trial)
            self.emit(TrialRecorded(skip.trial, skip.result, ran=False))

    def fail_rest(self, g: GroupRun, reason: Reason, text: str) -> None:
        queue = ([g.current] if g.current is not None else []) + g.pending
        g.current, g.pending = None, []
        for t in queue:
            self._record(g, t, self._failed(g, reason, text), {}, [], ran=False)

    def add_busy(self, g: GroupRun, busy_s: float) -> None:
        g.trials_timed += 1
        g.trial_s_total += busy_s
        self.emit(TrialTimed(busy_s, self._width(g), g.placement))

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
            self.on_load_died(g, g.redacted(str(exc)))
        except CallFailed as exc:
            self.on_loaded(g, LoadResult(ok=False, reason=Reason.LOAD_FAILED, error=str(exc)))
        else:
            self.on_loaded(g, result)

    def _answer_run(self, g: GroupRun, future: Any) -> None:
        self.add_busy(g, self.clock() - g.started_s)
        try:
            outcome: TrialOutcome = self.runner.result(future)
        except ActorDied as exc:
            self.on_actor_died(g, g.redacted(str(exc)))
        except CallFailed as exc:
            self.on_trial_done(g, TrialOutcome(g.current.trial_id if g.current else "",
                                               self._failed(g, Reason.EXCEPTION, str(exc))))
        else:
            self.on_trial_done(g, outcome)

    # -- events --------------------------------------------------------------------------
    def on_placed(self, g: GroupRun, where: Placement | None) -> None:
        """The group's actor got its resources and answered (or was handed over): show where it runs."""
        g.placement = where
        g.state, g.placed_s = GroupState.LOADING, self.clock()
        self.emit(GroupPlaced(g, g.placement))
        self._release_readers(g)

    def on_loaded(self, g: GroupRun, load: LoadResult) -> None:
        """The model load ended: run the group's trials, or fail them all with the load's error."""
        g.load = load
        g.load_stages += load.stages
        backend = g.group.backend
        self.longest_load_s[backend] = max(self.longest_load_s.get(backend, 0.0), self.clock() - g.placed_s)
        self.emit(GroupLoaded(g))
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
        decision = self.retries.after_death(g.deaths)
        g.deaths = decision.deaths
        if decision.retry:
            self.emit(Retrying(decision.deaths, decision.max_retries, retry_text))
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
        decision = self.retries.after_death(g.deaths)
        g.deaths = decision.deaths
        if decision.retry:
            # g.current stays: it re-runs once the fresh actor has loaded.
            label = g.current.label() if g.current is not None else g.label
            self.emit(Retrying(decision.deaths, decision.max_retries, f"actor died running {label}: {text}"))
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

