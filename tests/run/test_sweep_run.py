"""The sweep run's state machine, event by event, without a cluster.

A scripted in-process ``ActorRunner`` stands in for Ray here: it answers each
call from a script (ok, out of memory, the actor dies, a hang), so every
fault path is exercised exactly and fast. The same ``SweepRun`` over real Ray
actors is tested in test_e2e.py, test_faults.py and test_scheduling.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from sweeper.core.outcome import LoadResult, Placement, TrialOutcome
from sweeper.core.results import TrialResult
from sweeper.core.trial import Trial
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import parse_sweep
from sweeper.run.assembly import build_sweep_run
from sweeper.run.cluster import ClusterInfo
from sweeper.run.events import Polled, TrialRecorded
from sweeper.run.observer import Quiet
from sweeper.run.storage import ResultStore
from sweeper.run.summary import RunSummary
from sweeper.run.sweep_run import ActorDied, CallKind, GroupState, RunOptions, SweepRun

CPU = ClusterInfo(gpus=0, cpus=2, nodes=1, min_node_cpus=2)
HANG = object()  # a call that never returns


def _sweep(**over: Any):
    return parse_sweep({"name": "fake", "models": "tiny-llama", "backends": "noop",
                        "precisions": ["fp32", "bf16"], "batch_sizes": [1, 2, 4],
                        "workload": {"input_len": 8, "output_len": 4},
                        "measure": {"min_iters": 1, "min_duration_s": 0, "idle_s": 0}, **over})


def ok_row(trial: Trial) -> dict[str, Any]:
    return {"status": "ok", "throughput_tok_s": 100.0 * trial.batch_size, "ttft_s": 0.01}


@dataclass(eq=False)  # hashable by identity, as a future is
class _Future:
    value: Any
    order: int


@dataclass
class ScriptedRunner:
    """Answers ``run(trial)`` with ``script(trial, attempt)``: a row, an exception to raise, or HANG."""

    script: Callable[[Trial, int], Any] = lambda trial, attempt: ok_row(trial)
    load: Callable[[Trial], Any] = lambda trial: LoadResult(ok=True, load_s=0.5)
    started: list[dict[str, Any]] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    released: list[int] = field(default_factory=list)  # ended after their close returned
    closes_hang: set[int] = field(default_factory=set)  # actors whose close never returns
    runs: list[str] = field(default_factory=list)
    _counter: Any = field(default_factory=itertools.count)
    _attempts: dict[str, int] = field(default_factory=dict)

    def start(self, resources: dict[str, Any]) -> int:
        self.started.append(resources)
        return len(self.started)

    def call(self, actor: Any, kind: CallKind, trial: Trial | None = None, group: Any = None) -> _Future:
        if kind is CallKind.PING:
            value: Any = Placement("fake", f"node{actor}", None)
        elif kind is CallKind.LOAD:
            value = self.load(trial)
        else:
            attempt = self._attempts.get(trial.trial_id, 0)
            self._attempts[trial.trial_id] = attempt + 1
            self.runs.append(trial.trial_id)
            result = self.script(trial, attempt)
            value = result if result is HANG or isinstance(result, BaseException) else TrialOutcome(
                trial.trial_id, TrialResult.from_row(result))
        return _Future(value, next(self._counter))

    def wait(self, futures: Sequence[_Future], timeout_s: float) -> list[_Future]:
        ready = [f for f in futures if f.value is not HANG]
        return [min(ready, key=lambda f: f.order)] if ready else []

    def result(self, future: _Future) -> Any:
        if isinstance(future.value, BaseException):
            raise future.value
        return future.value

    def close(self, actor: Any) -> _Future:
        # Closed at once, unless the script makes this actor's close hang (closes_hang).
        self.closed.append(actor)
        return _Future(HANG if actor in self.closes_hang else None, next(self._counter))

    def release(self, actor: Any) -> None:
        self.released.append(actor)

    def kill(self, actor: Any) -> None:
        self.killed.append(actor)


def _run(tmp_path, runner: ScriptedRunner, sweep=None, **options: Any) -> tuple[SweepRun, list[dict]]:
    plan = make_plan(sweep or _sweep(), "cpu")
    store = ResultStore(str(tmp_path / "out"))
    sweep_run = build_sweep_run(plan, store, CPU, runner, options=RunOptions(poll_s=0.01, **options),
                         observer=Quiet())
    sweep_run.run()
    store.aggregate()
    return sweep_run, pq.read_table(tmp_path / "out" / "trials.parquet").to_pylist()


def test_every_trial_runs_once_on_one_actor_per_group(tmp_path):
    runner = ScriptedRunner()
    run, rows = _run(tmp_path, runner)
    assert sorted(r["status"] for r in rows) == ["ok"] * 6
    assert len(runner.runs) == len(set(runner.runs)) == 6
    assert run.summary.model_loads == 2 and len(runner.started) == 2
    assert all(g.state is GroupState.DONE for g in run.groups)
    assert sorted(runner.closed) == [1, 2]  # a finished group's actor is closed, freeing its device
    # small batches first within a group: an OOM can then predict the larger ones
    fp32 = [r for r in rows if r["precision"] == "fp32"]
    assert [r["batch_size"] for r in sorted(fp32, key=lambda r: runner.runs.index(r["trial_id"]))] == [1, 2, 4]


def test_an_actor_death_retries_the_trial_on_a_fresh_actor(tmp_path):
    def script(trial: Trial, attempt: int) -> Any:
        return ActorDied("node lost") if trial.batch_size == 2 and attempt == 0 else ok_row(trial)

    runner = ScriptedRunner(script)
    run, rows = _run(tmp_path, runner, _sweep(precisions="fp32"))
    assert [r["status"] for r in rows] == ["ok"] * 3
    assert run.summary.retries == 1 and run.summary.model_loads == 2
    assert runner.killed[0] == 1  # the dead actor's handle is released before the fresh one starts
    # Said to the run's observer, not printed: the scheduler prints nothing itself.
    assert [line for line in run.observer.said if line.startswith("retry ")] == [
        "retry 1/2: actor died running tiny-llama noop/fp32 bs=2 in=8 out=4: node lost"]


def test_the_run_tells_what_happened_as_events_and_its_accounting_is_their_sum(tmp_path):
    def script(trial: Trial, attempt: int) -> Any:
        return ActorDied("node lost") if trial.batch_size == 2 and attempt == 0 else ok_row(trial)

    run, _ = _run(tmp_path, ScriptedRunner(script), _sweep(precisions="fp32"))
    events = run.observer.events
    assert not any(isinstance(e, Polled) for e in events)  # ticks are not kept
    kinds = [type(e).__name__ for e in events]
    assert kinds[:2] == ["PlanSkipped", "RunStarted"] and kinds[-1] == "RunEnded"
    # One group: its actor, placed, loaded, its first trial, then the death and the retry on a
    # fresh actor that loads again before the trial re-runs.
    assert kinds[2:8] == ["ActorRequested", "GroupPlaced", "GroupLoaded", "TrialStarted", "TrialTimed",
                          "TrialRecorded"]
    retry = kinds.index("Retrying")
    assert kinds[retry - 2:retry + 4] == ["TrialStarted", "TrialTimed", "Retrying", "ActorRequested", "GroupPlaced",
                                          "GroupLoaded"]
    assert [e.trial.batch_size for e in events if isinstance(e, TrialRecorded)] == [1, 2, 4]
    # The accounting holds nothing the events did not say: replayed into a fresh summary, they
    # give the run's.
    replayed = RunSummary(planned=run.summary.planned, slots=run.summary.slots, slot_unit=run.summary.slot_unit)
    for event in run.observer.events:
        replayed.on_event(event)
    assert replayed == run.summary
    assert (replayed.ran, replayed.ok, replayed.retries, replayed.model_loads) == (3, 3, 1, 2)


def test_a_trial_whose_actor_keeps_dying_is_failed_and_the_group_goes_on(tmp_path):
    def script(trial: Trial, attempt: int) -> Any:
        return ActorDied("segfault") if trial.batch_size == 2 else ok_row(trial)

    run, rows = _run(tmp_path, ScriptedRunner(script), _sweep(precisions="fp32"), max_retries=1)
    by_batch = {r["batch_size"]: r for r in rows}
    assert by_batch[2]["status"] == "failed" and by_batch[2]["reason"] == "actor_died"
    assert "2 time(s)" in by_batch[2]["error"]
    assert by_batch[1]["status"] == by_batch[4]["status"] == "ok"
    assert run.summary.retries == 1 and run.summary.failed == 1


def test_a_failed_load_fails_every_trial_of_its_group_only(tmp_path):
    def load(trial: Trial) -> LoadResult:
        return LoadResult(ok=False, reason="load_failed", error="no such weights") if trial.precision == "bf16" \
            else LoadResult(ok=True, load_s=0.1)

    run, rows = _run(tmp_path, ScriptedRunner(load=load))
    assert {(r["precision"], r["status"]) for r in rows} == {("fp32", "ok"), ("bf16", "failed")}
    assert all("no such weights" in r["error"] for r in rows if r["status"] == "failed")


def test_out_of_memory_prunes_larger_batches_of_the_same_shape(tmp_path):
    def script(trial: Trial, attempt: int) -> Any:
        return {"status": "failed", "reason": "oom", "error": "CUDA out of memory"} if trial.batch_size == 2 \
            else ok_row(trial)

    runner = ScriptedRunner(script)
    run, rows = _run(tmp_path, runner, _sweep(precisions="fp32"))
    by_batch = {r["batch_size"]: (r["status"], r["reason"]) for r in rows}
    assert by_batch == {1: ("ok", None), 2: ("failed", "oom"), 4: ("skipped", "predicted_oom")}
    assert len(runner.runs) == 2  # batch 4 never reached an actor

    runner = ScriptedRunner(script)
    _, rows = _run(tmp_path / "no-pruning", runner, _sweep(precisions="fp32"), oom_pruning=False)
    assert {r["batch_size"]: r["status"] for r in rows}[4] == "ok"


def test_a_hung_trial_times_out_and_its_actor_is_replaced(tmp_path):
    def script(trial: Trial, attempt: int) -> Any:
        return HANG if trial.batch_size == 2 else ok_row(trial)

    runner = ScriptedRunner(script)
    run, rows = _run(tmp_path, runner, _sweep(precisions="fp32", measure={
        "min_iters": 1, "min_duration_s": 0, "idle_s": 0, "timeout_s": 0.05}))
    by_batch = {r["batch_size"]: (r["status"], r["reason"]) for r in rows}
    assert by_batch == {1: ("ok", None), 2: ("failed", "timeout"), 4: ("ok", None)}
    assert 1 in runner.killed and len(runner.started) == 2  # the hung actor killed, a fresh one loaded
    assert run.summary.model_loads == 2


def test_a_resumed_run_submits_only_missing_trials(tmp_path):
    first = ScriptedRunner(lambda t, a: ok_row(t) if t.precision == "fp32" else ActorDied("x"))
    _run(tmp_path, first, max_retries=0)
    second = ScriptedRunner()
    run, rows = _run(tmp_path, second, retry_failed=True)
    assert len(second.runs) == 3 and run.summary.resumed == 3
    # a retried trial's new shard replaces its failed one: one row per trial
    assert sorted(r["status"] for r in rows) == ["ok"] * 6


def test_a_hung_load_is_retried_on_fresh_actors_then_its_group_fails_as_load_timeout(tmp_path):
    def load(trial: Trial) -> Any:
        return HANG if trial.precision == "bf16" else LoadResult(ok=True, load_s=0.1)

    runner = ScriptedRunner(load=load)
    run, rows = _run(tmp_path, runner, _sweep(measure={"min_iters": 1, "min_duration_s": 0, "idle_s": 0,
                                                         "load_timeout_s": 0.05}), max_retries=1)
    by_precision = {(r["precision"], r["status"], r["reason"]) for r in rows}
    assert by_precision == {("fp32", "ok", None), ("bf16", "failed", "load_timeout")}
    assert all("load ran past measure.load_timeout_s = 0.05 s, 2 time(s)" in r["error"]
               for r in rows if r["status"] == "failed")
    assert run.summary.retries == 1 and len(runner.started) == 3  # fp32, bf16, bf16's fresh actor
    assert {2, 3} <= set(runner.killed)  # both hung bf16 actors were ended


def test_a_queued_actor_is_not_loading_yet(tmp_path):
    """The load's clock starts when the actor is placed, not while it waits for a device."""
    from sweeper.run.sweep_run import GroupRun, GroupState

    plan = make_plan(_sweep(measure={"load_timeout_s": 1.0}), "cpu")
    g = GroupRun(plan.groups()[0], {}, [])
    assert g.state is GroupState.WAITING and not g.load_timed_out(now_s=1e9)
    g.state, g.placed_s = GroupState.LOADING, 100.0
    assert not g.load_timed_out(now_s=100.5) and g.load_timed_out(now_s=101.5)


def test_predicted_oom_skips_stay_skipped_on_resume_until_retry_failed(tmp_path):
    def script(trial: Trial, attempt: int) -> Any:
        return {"status": "failed", "reason": "oom", "error": "CUDA out of memory"} if trial.batch_size >= 2 \
            else ok_row(trial)

    _run(tmp_path, ScriptedRunner(script), _sweep(precisions="fp32"))
    again = ScriptedRunner(script)
    run, rows = _run(tmp_path, again, _sweep(precisions="fp32"))
    assert again.runs == [] and run.summary.resumed == 3  # not one more known-OOM trial per resume
    assert {r["batch_size"]: r["reason"] for r in rows} == {1: None, 2: "oom", 4: "predicted_oom"}
    retried = ScriptedRunner(script)
    _run(tmp_path, retried, _sweep(precisions="fp32"), retry_failed=True)
    assert len(retried.runs) == 1  # batch 2 again; its OOM predicts batch 4 once more


def test_resume_filter_and_the_clis_shortcut_follow_one_rule():
    """Every stored status and reason: the trials a resume runs are those whose result does
    not stand (``is_settled``); a plan-time skip stands only where no plan is made to say the
    trial now runs (the CLI's shortcut on the embedded cluster)."""
    from types import SimpleNamespace

    from sweeper.core.status import Reason, Status
    from sweeper.run.resume import is_settled, resume_filter
    from sweeper.run.storage import StoredTrial

    cases = [(Status.OK, None), *((Status.FAILED, r) for r in Reason), (Status.SKIPPED, Reason.PREDICTED_OOM),
             (Status.SKIPPED, Reason.UNSUPPORTED)]
    trials = make_plan(_sweep(batch_sizes=list(range(1, 8))), "cpu").runnable
    assert len(trials) > len(cases)  # the rest have nothing stored
    stored = {t.trial_id: StoredTrial(t.trial_id, str(status), None if reason is None else str(reason))
              for t, (status, reason) in zip(trials, cases, strict=False)}
    for retry_failed in (False, True):
        todo, have_ok, kept = resume_filter(trials, SimpleNamespace(stored_trials=lambda: stored), retry_failed)
        assert todo == [t for t in trials if not is_settled(stored.get(t.trial_id), retry_failed)]
        settled = [stored[t.trial_id] for t in trials if t not in todo]
        assert have_ok == sum(s.status == "ok" for s in settled) == 1 and kept == len(settled) - 1
        assert kept == (0 if retry_failed else len(Reason) + 1)  # failed for any reason, and predicted_oom
    unsupported = StoredTrial("t", "skipped", "unsupported")
    assert not is_settled(unsupported, False)  # the plan runs the trial now: run it
    assert is_settled(unsupported, False, still_unsupported=True)  # the shortcut: skipped again here
    assert not is_settled(None, False)


@dataclass
class OneSlotRunner(ScriptedRunner):
    """A cluster of one slot: an actor is placed (its ping and load answer) only once every
    actor started before it has been closed or killed, as Ray queues actors for a GPU."""

    def call(self, actor: Any, kind: CallKind, trial: Trial | None = None, group: Any = None) -> _Future:
        future = super().call(actor, kind, trial)
        future.queued_behind = range(1, actor) if kind in (CallKind.PING, CallKind.LOAD) else range(0)
        return future

    def wait(self, futures: Sequence[_Future], timeout_s: float) -> list[_Future]:
        gone = set(self.closed) | set(self.killed)
        placed = [f for f in futures if all(a in gone for a in getattr(f, "queued_behind", ()))]
        return super().wait(placed, timeout_s)


def test_a_finished_groups_actor_loads_the_next_waiting_group(tmp_path):
    runner = OneSlotRunner()
    run, rows = _run(tmp_path, runner)
    assert sorted(r["status"] for r in rows) == ["ok"] * 6
    # Two groups, two actors requested; the second, still queued, is cancelled and its group
    # loaded on the first, which is closed once, at the end.
    assert len(runner.started) == 2 and runner.killed == [2] and runner.closed == [1]
    assert run.summary.actor_handovers == 1 and run.summary.model_loads == 2
    assert all(g.state is GroupState.DONE for g in run.groups)


@dataclass
class LoggedOneSlotRunner(OneSlotRunner):
    """One slot, and a log of what the driver asked for and heard, in order."""

    log: list[str] = field(default_factory=list)

    def start(self, resources: dict[str, Any]) -> int:
        actor = super().start(resources)
        self.log.append(f"start {actor}")
        return actor

    def call(self, actor: Any, kind: CallKind, trial: Trial | None = None, group: Any = None) -> _Future:
        future = super().call(actor, kind, trial)
        future.note = f"{kind.value} {actor} {trial.precision}" if kind is CallKind.LOAD else f"{kind.value} {actor}"
        return future

    def result(self, future: _Future) -> Any:
        self.log.append(f"answered {future.note}")
        return super().result(future)


def test_a_group_that_reads_anothers_reference_asks_for_its_actor_once_that_group_is_placed(tmp_path):
    """Ray does not place actors queued for the same resources in the order they were asked
    for: the reader's actor is requested only once the reference's group holds the slot, so
    that group always computes the reference first and the reader finds it."""
    runner = LoggedOneSlotRunner()
    run, rows = _run(tmp_path, runner, _sweep(fidelity={"reference": "fp32"}))
    assert sorted(r["status"] for r in rows) == ["ok"] * 6
    assert runner.log.index("start 2") > runner.log.index("answered ping 1") > runner.log.index("start 1")
    loads = [line for line in runner.log if line.startswith("answered load")]
    assert loads == ["answered load 1 fp32", "answered load 1 bf16"]  # the reader on the handed-over actor
    assert run.summary.actor_handovers == 1 and all(g.state is GroupState.DONE for g in run.groups)


def test_an_actor_whose_model_ran_in_it_is_not_handed_to_an_engine_that_runs_apart(tmp_path, monkeypatch):
    """A transformers actor keeps a CUDA context on its GPU after closing its model: an engine
    that runs in processes of its own (as vLLM's does) and sizes itself by the GPU's free
    memory must start on a fresh actor. The other way round, and between groups of one
    backend, the actor is handed on."""
    import dataclasses

    from sweeper.core.backends import BACKENDS

    monkeypatch.setitem(BACKENDS, "noop", dataclasses.replace(BACKENDS["noop"], engine_in_processes=True))
    sweep = _sweep(backends=["transformers", "noop"], precisions="fp32")
    runner = OneSlotRunner()
    run, rows = _run(tmp_path, runner, sweep)
    assert [g.group.backend for g in run.groups] == ["transformers", "noop"]
    assert sorted(r["status"] for r in rows) == ["ok"] * 6
    assert run.summary.actor_handovers == 0 and runner.closed == [1, 2]

    monkeypatch.setitem(BACKENDS, "noop", dataclasses.replace(BACKENDS["noop"], engine_in_processes=False))
    run, rows = _run(tmp_path / "again", OneSlotRunner(), sweep)
    assert run.summary.actor_handovers == 1


def test_an_actor_is_not_handed_to_a_backend_that_needs_a_fresh_process(tmp_path, monkeypatch):
    import dataclasses

    from sweeper.core.backends import BACKENDS

    monkeypatch.setitem(BACKENDS, "noop", dataclasses.replace(BACKENDS["noop"], reuses_actor=False))
    runner = OneSlotRunner()
    run, rows = _run(tmp_path, runner)
    assert sorted(r["status"] for r in rows) == ["ok"] * 6
    # the first actor is closed, freeing the slot, and the queued second one is placed
    assert runner.closed == [1, 2] and runner.killed == [] and run.summary.actor_handovers == 0


class FailingStore(ResultStore):
    """A destination whose disk fills at the n-th trials shard."""

    def __init__(self, root: str, fail_at: int) -> None:
        super().__init__(root)
        self.fail_at, self.trials_written = fail_at, 0

    def write_shard(self, kind: str, trial_id: str, table: Any) -> None:
        if kind == "trials":
            self.trials_written += 1
            if self.trials_written == self.fail_at:
                raise OSError(28, "No space left on device")
        super().write_shard(kind, trial_id, table)


def test_shards_are_written_off_the_drivers_thread_in_order_and_a_failed_write_is_raised(tmp_path):
    from sweeper.run.recorder import Recorder

    trials = make_plan(_sweep(), "cpu").runnable
    store = FailingStore(str(tmp_path / "out"), fail_at=3)
    recorder = Recorder(store)
    for t in trials:
        recorder.record(t, TrialResult.from_row(ok_row(t)), {"requests": [{"trial_id": t.trial_id, "iteration": 0}]})
    try:
        recorder.flush()
        raise AssertionError("the failed write was not raised")
    except OSError as exc:
        assert exc.errno == 28
    finally:
        recorder.shutdown()
    written = {p.stem for p in (tmp_path / "out" / "shards" / "trials").glob("*.parquet")}
    # every trial but the one whose write failed is on disk: flush drains the queue whatever fails
    assert written == {t.trial_id for t in trials} - {trials[2].trial_id}
    # a trial's requests shard is written before its trials shard (the commit)
    assert trials[2].trial_id in {p.stem for p in (tmp_path / "out" / "shards" / "requests").glob("*.parquet")}


def test_the_recorder_writes_what_the_run_s_events_say_and_nothing_else(tmp_path):
    """The recorder is a listener: a recorded trial's row and tables, the plan's skips and a
    capacity search's answer reach disk through their events alone; other events write nothing."""
    from sweeper.core.capacity import Capacity
    from sweeper.core.status import Reason, skipped_outcome
    from sweeper.run.events import CapacityFound, PlanSkipped
    from sweeper.run.recorder import Recorder

    ran, skipped = make_plan(_sweep(), "cpu").runnable[:2]
    store = ResultStore(str(tmp_path / "out"))
    recorder = Recorder(store)
    try:
        recorder.on_event(Polled())
        recorder.on_event(TrialRecorded(ran, TrialResult.from_row(ok_row(ran)), ran=True,
                                        tables={"requests": [{"trial_id": ran.trial_id, "iteration": 0}]}))
        recorder.on_event(PlanSkipped(((skipped, TrialResult(skipped_outcome(Reason.UNSUPPORTED, "no GPU"))),)))
        recorder.on_event(CapacityFound("c", Capacity(capacity_id="c0ffee", bounded_by="low")))
        recorder.flush()
    finally:
        recorder.shutdown()
    shards = tmp_path / "out" / "shards"
    assert {p.stem for p in (shards / "trials").glob("*.parquet")} == {ran.trial_id, skipped.trial_id}
    assert {p.stem for p in (shards / "requests").glob("*.parquet")} == {ran.trial_id}
    assert [p.stem for p in (shards / "capacity").glob("*.parquet")] == ["c0ffee"]
    assert pq.read_table(shards / "trials" / f"{skipped.trial_id}.parquet").column("status").to_pylist() == ["skipped"]


def test_a_finished_groups_close_does_not_hold_up_the_sweep_and_a_hung_one_is_killed(tmp_path):
    """Closing an actor (a vLLM engine's processes ending) takes seconds: the driver asks for
    it and goes on with the other groups, ends the actor once its close returns, and kills one
    whose close has not returned within CLOSE_TIMEOUT_S (a clock the test sets: one second per
    reading)."""
    import itertools

    from sweeper.run.actor_runner import CLOSE_TIMEOUT_S

    ticks = itertools.count(step=1.0)
    runner = ScriptedRunner(closes_hang={1})
    store = ResultStore(str(tmp_path / "out"))
    run = build_sweep_run(make_plan(_sweep(), "cpu"), store, CPU, runner, options=RunOptions(poll_s=0.01),
                   observer=Quiet(), clock=lambda: next(ticks))
    summary = run.run()
    store.aggregate()
    rows = pq.read_table(tmp_path / "out" / "trials.parquet").to_pylist()
    assert sorted(r["status"] for r in rows) == ["ok"] * 6 and summary.ok == 6
    assert sorted(runner.closed) == [1, 2]
    assert runner.released == [2]  # its close returned: ended then
    assert runner.killed == [1]  # never returned: killed at its bound, not waited on for ever
    # The hung close kept the run going until its bound, and no longer.
    assert CLOSE_TIMEOUT_S <= summary.wall_s < CLOSE_TIMEOUT_S + 200


def test_a_run_that_raises_kills_its_actors_before_the_error_reaches_the_caller(tmp_path):
    """A caller whose process lives on (a notebook, a test) keeps its Ray driver: an actor left
    alive by a run that raised would hold its GPU for as long as that process lives."""

    class Broken(ScriptedRunner):
        def wait(self, futures: Sequence[_Future], timeout_s: float) -> list[_Future]:
            if self.runs:  # both groups' actors started, a trial submitted
                raise RuntimeError("the driver lost its cluster")
            return super().wait(futures, timeout_s)

    runner = Broken()
    plan = make_plan(_sweep(), "cpu")
    sweep_run = build_sweep_run(plan, ResultStore(str(tmp_path / "out")), CPU, runner, options=RunOptions(poll_s=0.01))
    try:
        sweep_run.run()
    except RuntimeError as exc:
        assert str(exc) == "the driver lost its cluster"
    else:
        raise AssertionError("the run's error did not reach its caller")
    assert len(runner.started) == 2 and sorted(runner.killed) == [1, 2]


def test_each_load_says_where_a_launched_server_logs(tmp_path):
    """The results directory's servers/, told with the load: not the job's environment, which a
    run in a process whose Ray driver someone else started cannot set."""
    loads: list[Any] = []

    class Recording(ScriptedRunner):
        def call(self, actor: Any, kind: CallKind, trial: Trial | None = None, group: Any = None) -> _Future:
            if kind is CallKind.LOAD:
                loads.append(group)
            return super().call(actor, kind, trial, group)

    _run(tmp_path, Recording())
    assert len(loads) == 2 and {g.server_log_dir for g in loads} == {str(tmp_path / "out" / "servers")}


def test_a_failure_the_driver_records_shows_no_secret_flag_value(tmp_path):
    from sweeper.core.secrets import REDACTED
    from sweeper.run.actor_runner import CallFailed

    secret = "hf_driverSideSecret42"
    sweep = parse_sweep({"name": "keyed", "models": "tiny-llama", "backends": "server", "precisions": "fp32",
                         "backend_options": {"server": {"launch": "transformers", "args": {"hf-token": secret}}},
                         "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": 4,
                                      "num_prompts": 8}})

    def script(trial: Trial, attempt: int) -> Any:
        # What Ray hands the driver: the remote traceback, which may quote a server's command line.
        quoted = f"RayTaskError: serve --hf-token {secret} exited 1"
        return ActorDied(quoted) if attempt == 0 else CallFailed(quoted)

    run, rows = _run(tmp_path, ScriptedRunner(script), sweep)
    assert [r["status"] for r in rows] == ["failed"]
    assert secret not in rows[0]["error"] and f"--hf-token {REDACTED} exited 1" in rows[0]["error"]
    said = "\n".join(run.observer.said)
    assert "retry 1/2" in said and secret not in said and REDACTED in said
    shards = "".join(p.read_bytes().decode(errors="replace") for p in (tmp_path / "out").rglob("*") if p.is_file())
    assert secret not in shards
