"""A long group gives its last trials to an idle slot when that ends it sooner by more than
a model load costs: the rule (sweeper.run.splitting), then the scheduler on a scripted
cluster whose trials and loads take known times on a fake clock. The same over real Ray
actors: test_scheduling.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq
import pytest

from sweeper.core.trial import Trial
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import parse_sweep
from sweeper.run.assembly import build_sweep_run
from sweeper.run.cluster import ClusterInfo
from sweeper.run.observer import Quiet
from sweeper.run.splitting import (
    MIN_SAVING_S,
    RunningGroup,
    Split,
    SplitDecision,
    Splitting,
    best_split,
)
from sweeper.run.storage import ResultStore
from sweeper.run.sweep_run import CallKind, GroupState, RunOptions, SweepRun
from tests.fake_nvml import FakeClock
from tests.run.test_sweep_run import HANG, ScriptedRunner, _Future

FOUR_GPUS = ClusterInfo(gpus=4, cpus=16, nodes=1, min_node_cpus=16)


def test_the_split_balances_both_copies_and_pays_for_the_load():
    # 100 trials of 10 s; a load of 50 s: move k with 10 (100 - k) = 50 + 10 k -> k = 47.5.
    split = best_split(100, 10.0, 50.0)
    assert split is not None and split.moved in (47, 48)
    assert split.saving_s == pytest.approx(1000.0 - max(10.0 * (100 - split.moved), 50.0 + 10.0 * split.moved))
    assert split.saving_s > 400.0
    # A load as long as what is left: no copy can help.
    assert best_split(10, 10.0, 100.0) is None
    # A saving below the floor is not worth a load's energy and memory.
    assert best_split(2, 0.9 * MIN_SAVING_S, 0.0) is None
    assert best_split(2, 2 * MIN_SAVING_S, 0.0) == Split(moved=1, saving_s=2 * MIN_SAVING_S)
    assert best_split(1, 100.0, 0.0) is None and best_split(5, 0.0, 0.0) is None


def _group(key: int, *, pending: int = 100, mean_trial_s: float | None = 10.0, running: bool = True, gpus: int = 1,
           withdrawn: bool = False, load_s: float = 50.0) -> RunningGroup:
    return RunningGroup(key=key, running=running, pending=pending, mean_trial_s=mean_trial_s, gpus=gpus,
                        withdrawn=withdrawn, load_s=load_s)


def test_the_policy_splits_the_group_that_gains_most_and_never_one_it_must_not():
    policy = Splitting()
    decision = policy.decide([_group(0, pending=10), _group(1, pending=100), _group(2, pending=40)])
    assert decision == SplitDecision(key=1, moved=best_split(100, 10.0, 50.0).moved,
                                     saving_s=best_split(100, 10.0, 50.0).saving_s)
    # The one that gains most, but each in turn cannot be split: waiting or loading, no trial
    # timed yet, tensor parallel (its free GPUs may sit on different nodes), or a copy of it
    # was withdrawn before (the cluster is busier than its free slots say).
    for barred in ({"running": False}, {"mean_trial_s": None}, {"gpus": 2}, {"withdrawn": True}):
        decision = policy.decide([_group(0, pending=10), _group(1, pending=100, **barred)])
        assert decision is not None and decision.key == 0, barred
    assert policy.decide([_group(0, pending=1), _group(1, load_s=10_000.0)]) is None  # nothing worth a load
    assert Splitting(enabled=False).decide([_group(0)]) is None  # --no-split


@dataclass
class TimedRunner(ScriptedRunner):
    """Every trial takes ``run_s`` and every load ``load_s`` of the fake clock, passing when the
    driver is handed the answer; each actor's trials are recorded with it."""

    clock: FakeClock = field(default_factory=FakeClock)
    run_s: float = 10.0
    load_s: float = 2.0
    by_actor: dict[int, list[str]] = field(default_factory=dict)
    loads: list[int] = field(default_factory=list)

    def call(self, actor: Any, kind: CallKind, trial: Trial | None = None, group: Any = None) -> _Future:
        future = super().call(actor, kind, trial)
        future.kind, future.actor = kind, actor  # type: ignore[attr-defined]
        if kind is CallKind.RUN and trial is not None:
            self.by_actor.setdefault(actor, []).append(trial.trial_id)
        elif kind is CallKind.LOAD:
            self.loads.append(actor)
        return future

    def wait(self, futures: Any, timeout_s: float) -> list[_Future]:
        ready = super().wait(futures, timeout_s)
        for future in ready:
            kind = getattr(future, "kind", None)
            self.clock.advance(self.run_s if kind is CallKind.RUN else self.load_s if kind is CallKind.LOAD else 0.0)
        return ready


def sweep_of(batch_sizes: list[int], precisions: list[str] | None = None):
    return parse_sweep({"name": "long", "models": "tiny-llama", "backends": "noop",
                        "precisions": precisions or ["fp32"], "batch_sizes": batch_sizes,
                        "workload": {"input_len": 8, "output_len": 4},
                        "measure": {"min_iters": 1, "min_duration_s": 0, "idle_s": 0}})


def run(tmp_path, runner: TimedRunner, sweep, cluster=FOUR_GPUS, **options) -> tuple[SweepRun, list[dict]]:
    plan = make_plan(sweep, "cuda")
    store = ResultStore(str(tmp_path / "out"))
    sweep_run = build_sweep_run(plan, store, cluster, runner, options=RunOptions(poll_s=0.01, **options),
                         observer=Quiet(), clock=runner.clock)
    sweep_run.run()
    store.aggregate()
    return sweep_run, pq.read_table(tmp_path / "out" / "trials.parquet").to_pylist()


def test_one_long_group_spreads_over_the_idle_gpus_and_runs_every_trial_once(tmp_path):
    runner = TimedRunner()
    sweep_run, rows = run(tmp_path, runner, sweep_of(list(range(1, 41))))
    assert len(rows) == 40 and {r["status"] for r in rows} == {"ok"}
    assert len(runner.runs) == len(set(runner.runs)) == 40  # no trial twice, none lost
    # The one group became four copies, one per GPU, each with a share of its trials.
    assert sweep_run.summary.group_splits == 3 and len(runner.started) == 4
    assert sorted(len(v) for v in runner.by_actor.values())[0] >= 5
    assert all(g.state is GroupState.DONE for g in sweep_run.groups)
    # Each copy runs its trials in the group's order (small batches first, for OOM pruning).
    for ids in runner.by_actor.values():
        batches = [next(r["batch_size"] for r in rows if r["trial_id"] == i) for i in ids]
        assert batches == sorted(batches)


def test_no_split_when_the_load_costs_more_than_it_saves_or_when_switched_off(tmp_path):
    slow_load = TimedRunner(load_s=400.0)
    sweep_run, rows = run(tmp_path / "a", slow_load, sweep_of(list(range(1, 21))))
    assert len(rows) == 20 and sweep_run.summary.group_splits == 0 and len(slow_load.started) == 1

    off = TimedRunner()
    sweep_run, rows = run(tmp_path / "b", off, sweep_of(list(range(1, 21))), split_groups=False)
    assert len(rows) == 20 and sweep_run.summary.group_splits == 0 and len(off.started) == 1


def test_no_split_while_every_slot_is_busy(tmp_path):
    # Three groups on three GPUs: no slot is idle until one ends, and by then the rest are short.
    runner = TimedRunner()
    three = ClusterInfo(gpus=3, cpus=12, nodes=1, min_node_cpus=12)
    sweep_run, rows = run(tmp_path, runner, sweep_of([1, 2], ["fp32", "bf16", "fp16"]), cluster=three)
    assert len(rows) == 6 and sweep_run.summary.group_splits == 0 and len(runner.started) == 3


def test_a_finished_groups_actor_takes_the_split_off_copy(tmp_path):
    # Two GPUs: a short group and a long one. When the short one ends, its actor (already
    # holding a GPU) loads the long group's model and takes the last of its trials.
    runner = TimedRunner()
    two = ClusterInfo(gpus=2, cpus=8, nodes=1, min_node_cpus=8)
    sweep = parse_sweep({"name": "two", "models": "tiny-llama", "backends": "noop", "precisions": ["fp32", "bf16"],
                         "batch_sizes": list(range(1, 21)),
                         "exclude": [{"precision": "bf16", "batch_size": list(range(3, 21))}],
                         "workload": {"input_len": 8, "output_len": 4},
                         "measure": {"min_iters": 1, "min_duration_s": 0, "idle_s": 0}})
    sweep_run, rows = run(tmp_path, runner, sweep, cluster=two)
    assert len(rows) == 22 and len(set(runner.runs)) == 22
    assert sweep_run.summary.group_splits == 1 and sweep_run.summary.actor_handovers == 1
    # The copy's own actor, requested and still queued, was cancelled: only two processes ran trials.
    assert len(runner.by_actor) == 2 and len(runner.killed) == 1


def test_an_out_of_memory_trial_prunes_the_larger_batches_held_by_every_copy(tmp_path):
    def script(trial: Trial, attempt: int) -> dict[str, Any]:
        if trial.batch_size == 2:
            return {"status": "failed", "reason": "oom", "error": "CUDA out of memory"}
        return {"status": "ok", "throughput_tok_s": 1.0}

    runner = TimedRunner(script=script)
    sweep_run, rows = run(tmp_path, runner, sweep_of(list(range(1, 41))))
    assert len(rows) == 40
    skipped = sorted(r["batch_size"] for r in rows if r["status"] == "skipped")
    ran = {next(r["batch_size"] for r in rows if r["trial_id"] == i) for i in runner.runs}
    # The group split after its first trial; its second ran out of memory, and the copy's
    # queue of larger batches was pruned too, all but the one trial it had already begun.
    assert sweep_run.summary.group_splits == 1
    assert min(skipped) > 2 and len(skipped) >= 37 and set(skipped) | ran == set(range(1, 41))


@dataclass
class PlacesOneActor(TimedRunner):
    """A busy cluster: the first actor is placed, every later one stays queued for its resources
    (its ping and load never answer)."""

    def call(self, actor: Any, kind: CallKind, trial: Trial | None = None, group: Any = None) -> _Future:
        future = super().call(actor, kind, trial)
        if actor > 1 and kind in (CallKind.PING, CallKind.LOAD):
            future.value = HANG
        return future


def test_a_copy_still_queued_when_its_group_runs_out_gives_its_trials_back(tmp_path):
    # The group splits after its first trial (a GPU is free), but the copy's actor is never
    # placed: once the group has run its own share it runs the copy's too, on the model it has
    # loaded, and the copy's request is withdrawn. Handing the group's actor to its own copy
    # would load the same model on it again. The group is not split again: the cluster is
    # busier than its free slots say.
    runner = PlacesOneActor()
    sweep_run, rows = run(tmp_path, runner, sweep_of(list(range(1, 21))))
    assert len(rows) == 20 and {r["status"] for r in rows} == {"ok"}
    assert len(runner.runs) == len(set(runner.runs)) == 20
    assert list(runner.by_actor) == [1] and runner.loads.count(1) == 1  # one actor, one load
    assert runner.killed == [2] and len(runner.started) == 2
    # Neither the split nor the copy's load happened, as the summary counts them.
    assert (sweep_run.summary.group_splits, sweep_run.summary.model_loads, sweep_run.summary.actor_handovers) == (0, 1, 0)
    assert all(g.state is GroupState.DONE for g in sweep_run.groups)
    batches = [next(r["batch_size"] for r in rows if r["trial_id"] == i) for i in runner.by_actor[1]]
    assert batches == sorted(batches)  # the group's order kept: small batches first
