"""Capacity searches and configuration searches driven by the sweep run, without a cluster.

The scripted runner of test_sweep_run.py answers each trial from a known truth (a knee per
configuration, an objective with a known best), so what the searches find can be held to it
exactly, and a run interrupted at any trial is resumed and compared with one that was not.
The same searches over real Ray actors and the noop engine: test_search_e2e.py."""

from __future__ import annotations

import math
from typing import Any

import pyarrow.parquet as pq
import pytest

from sweeper.core.trial import Trial
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import parse_sweep
from sweeper.run.assembly import build_sweep_run
from sweeper.run.cluster import ClusterInfo
from sweeper.run.events import RunEvent, TrialAdded
from sweeper.run.observer import Quiet
from sweeper.run.search import SearchRun
from sweeper.run.storage import ResultStore
from sweeper.run.sweep_run import RunOptions, SweepRun
from tests.run.test_sweep_run import CPU, ScriptedRunner

GPUS4 = ClusterInfo(gpus=4, cpus=16, nodes=1, min_node_cpus=16)


def serving_sweep(*, request_rate: Any, search: dict | None = None, precisions=("fp32", "bf16"),
                  noop: Any = None) -> Any:
    return parse_sweep({
        "name": "searched", "models": "tiny-llama", "backends": "noop", "precisions": list(precisions),
        **({"backend_options": {"noop": noop}} if noop is not None else {}),
        "workload": {"mode": "serving", "input_len": 8, "output_len": 8, "num_prompts": 400,
                     "request_rate": request_rate, "slo": {"ttft_ms": 100}},
        "measure": {"idle_s": 0}, **({"search": search} if search is not None else {})})


def knee(trial: Trial) -> float:
    """The truth: the load each configuration holds (bf16 a fifth more than fp32)."""
    max_batch = trial.backend_options.max_batch
    return 10.0 * max_batch * (1.2 if trial.precision == "bf16" else 1.0)


def served(trial: Trial) -> dict[str, Any]:
    load = trial.request_rate if trial.request_rate is not None else float(trial.max_concurrency or 0)
    holds = load <= knee(trial)
    return {"status": "ok", "slo_attainment": 1.0 if holds else 0.4, "saturated": not holds, "n_requests": 400,
            "energy_per_request_j": energy(trial), "ttft_p99_s": 0.05 if holds else 2.0}


def energy(trial: Trial) -> float:
    """A known best: bf16 at max_batch 16 (the objective a point is scored by)."""
    b = trial.backend_options.max_batch
    return 1.0 + 0.1 * (math.log2(b) - 4) ** 2 + (0.0 if trial.precision == "bf16" else 0.5)


def run(tmp_path, sweep, runner: ScriptedRunner, *, cluster=CPU, out: str = "out", parallel: int = 1,
        events: list | None = None) -> tuple[SweepRun, list[dict]]:
    plan = make_plan(sweep, cluster.device)
    store = ResultStore(str(tmp_path / out))
    search = SearchRun(plan, sweep.search, cluster.device, parallel=parallel) if sweep.search else None
    observer = Quiet()
    if events is not None:
        observer.on_event = events.append  # type: ignore[method-assign]
    sweep_run = build_sweep_run(plan, store, cluster, runner, options=RunOptions(poll_s=0.01), observer=observer,
                         search=search)
    sweep_run.run()
    ids, derived = sweep_run.searched_plan() or ([p.trial.trial_id for p in plan.trials], {})
    store.write_plan(sweep.name, ids, derived=derived)
    store.aggregate()
    return sweep_run, pq.read_table(tmp_path / out / "trials.parquet").to_pylist()


def interrupt_after(count: int, answer=None):
    """A script that answers from the truth (or ``answer``), then stops the run (Ctrl-C) at
    trial ``count + 1``."""
    ran: list[str] = []

    def script(trial: Trial, attempt: int) -> Any:
        if len(ran) >= count:
            raise KeyboardInterrupt
        ran.append(trial.trial_id)
        return answer(trial, attempt) if answer is not None else served(trial)

    return script


# -- capacity ------------------------------------------------------------------------------

def test_each_configuration_probes_on_one_engine_until_its_knee_is_bracketed(tmp_path):
    sweep = serving_sweep(request_rate={"capacity": {"low": 10, "high": 1000, "resolution": 0.05}},
                          noop=[{"max_batch": 4}, {"max_batch": 16}])
    runner, events = ScriptedRunner(lambda trial, attempt: served(trial)), []
    sweep_run, rows = run(tmp_path, sweep, runner, events=events)
    assert len(runner.started) == 4  # one actor (one engine) per configuration, never a reload
    capacity = pq.read_table(tmp_path / "out" / "capacity.parquet").to_pylist()
    assert len(capacity) == 4
    by_id = {r["trial_id"]: r for r in rows}
    for c in capacity:
        probes = [r for r in rows if r["capacity_id"] == c["capacity_id"]]
        truth = knee(Trial.at(sweep="x", model=probes[0]["model"], **{}) if False else _trial_of(sweep, probes[0]))
        assert c["capacity_load"] <= truth < c["fail_load"] <= c["capacity_load"] * 1.05
        assert c["bounded_by"] == "slo" and c["precise"] and c["n_probes"] == len(probes)
        assert sorted(r["probe_step"] for r in probes) == list(range(len(probes)))
        assert by_id[c["pass_trial_id"]]["request_rate"] == c["capacity_load"]
        assert c["energy_per_request_j"] == by_id[c["pass_trial_id"]]["energy_per_request_j"]
    assert len(rows) == sum(c["n_probes"] for c in capacity)
    assert sum(isinstance(e, TrialAdded) for e in events) == len(rows) - 4  # beyond each search's first
    assert len(sweep_run.summary.capacities) == 4


def _trial_of(sweep, row: dict) -> Trial:
    plan = make_plan(sweep, "cpu")
    return next(t for t in plan.runnable if t.capacity_id == row["capacity_id"])


@pytest.mark.parametrize("stop_after", [1, 4, 7])
def test_a_capacity_search_stopped_anywhere_resumes_to_the_same_answer_without_measuring_twice(tmp_path, stop_after):
    sweep = serving_sweep(request_rate={"capacity": {"low": 10, "high": 1000, "resolution": 0.05}},
                          precisions=("bf16",), noop={"max_batch": 8})
    whole, whole_rows = run(tmp_path, sweep, ScriptedRunner(lambda trial, attempt: served(trial)), out="whole")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, sweep, ScriptedRunner(interrupt_after(stop_after)), out="cut")
    again = ScriptedRunner(lambda trial, attempt: served(trial))
    resumed, rows = run(tmp_path, sweep, again, out="cut")
    assert len(again.runs) == len(whole_rows) - stop_after  # the stored probes are told, not run
    assert {r["trial_id"] for r in rows} == {r["trial_id"] for r in whole_rows}
    a = pq.read_table(tmp_path / "whole" / "capacity.parquet").to_pylist()
    b = pq.read_table(tmp_path / "cut" / "capacity.parquet").to_pylist()
    assert [(r["capacity_load"], r["fail_load"], r["n_probes"]) for r in a] == \
        [(r["capacity_load"], r["fail_load"], r["n_probes"]) for r in b]


def settling(trial: Trial, attempt: int) -> dict[str, Any]:
    """The engine still settles during the first, short probe: unstable, and it misses the SLO."""
    if trial.request_rate == 10 and trial.probe_stretch == 1:
        return {**served(trial), "slo_attainment": 0.5, "unstable": True, "unstable_reason": "window too short"}
    return served(trial)


@pytest.mark.parametrize("stop_after", [None, 1, 2])
def test_an_unsteady_probe_is_measured_again_for_longer_on_the_same_engine_and_resumes(tmp_path, stop_after):
    sweep = serving_sweep(request_rate={"capacity": {"low": 10, "high": 1000, "resolution": 0.05}},
                          precisions=("bf16",), noop={"max_batch": 8})
    if stop_after is not None:
        with pytest.raises(KeyboardInterrupt):
            run(tmp_path, sweep, ScriptedRunner(interrupt_after(stop_after, settling)))
    runner = ScriptedRunner(settling)
    _, rows = run(tmp_path, sweep, runner)
    assert len(runner.started) == 1  # the re-measure runs on the engine the search holds
    at_low = sorted((r for r in rows if r["request_rate"] == 10), key=lambda r: r["probe_step"])
    assert [(r["num_prompts"], r["probe_step"]) for r in at_low] == [(400, 0), (800, 1)]
    assert len({r["capacity_id"] for r in rows}) == 1 and len({r["trial_id"] for r in rows}) == len(rows)
    (c,) = pq.read_table(tmp_path / "out" / "capacity.parquet").to_pylist()
    assert c["bounded_by"] == "slo" and c["precise"] and c["n_probes"] == len(rows)
    assert c["capacity_load"] <= knee(_trial_of(sweep, rows[0])) < c["fail_load"]


def test_a_failed_probe_ends_its_search_and_says_so(tmp_path):
    sweep = serving_sweep(request_rate={"capacity": {"low": 10, "high": 1000}}, precisions=("bf16",),
                          noop={"max_batch": 8})

    def script(trial: Trial, attempt: int) -> Any:
        return {"status": "failed", "reason": "exception", "error": "boom"} if trial.request_rate > 30 else served(trial)

    _, rows = run(tmp_path, sweep, ScriptedRunner(script))
    (c,) = pq.read_table(tmp_path / "out" / "capacity.parquet").to_pylist()
    assert c["bounded_by"] == "failed" and not c["precise"] and c["capacity_load"] == 20
    assert sorted(r["request_rate"] for r in rows) == [10, 20, 40]


# -- configuration search -----------------------------------------------------------------------

SPACE = {"backend_options.noop.max_batch": {"low": 1, "high": 256, "log": True, "int": True}}


def fixed_rate_search(seed: int, trials: int = 20, **over: Any) -> Any:
    return serving_sweep(request_rate=5, search={"objective": {"minimize": "energy_per_request_j"},
                                                 "constraints": {"slo": True}, "space": SPACE,
                                                 "budget": {"trials": trials}, "seed": seed, **over})


def best_of(sweep_run: SweepRun) -> tuple[str, int, float]:
    outcome = sweep_run.summary.search
    assert outcome is not None and outcome.best
    p = outcome.best[0]
    return p.trial.precision, p.trial.backend_options.max_batch, p.values[0]


def test_the_search_finds_the_known_best_in_most_seeds_within_its_budget(tmp_path):
    found = []
    for seed in range(10):
        sweep_run, rows = run(tmp_path, fixed_rate_search(seed), ScriptedRunner(lambda t, a: served(t)),
                              out=f"s{seed}")
        assert len(rows) == 20 == len({r["search_step"] for r in rows})
        assert {r["search_id"] for r in rows} == {sweep_run.searches.search.id}
        found.append(best_of(sweep_run)[2] <= 1.0 * 1.05)  # within 5 % of the best objective (bf16, 16)
    # 20 points of a 2 x 256 space: TPE lands within 5 % of the optimum in 9 or 10 of 10 seeds.
    assert sum(found) >= 8, found


def test_a_search_stopped_mid_way_resumes_to_the_same_points_and_answer(tmp_path):
    sweep = fixed_rate_search(3, trials=10)
    whole, whole_rows = run(tmp_path, sweep, ScriptedRunner(lambda t, a: served(t)), out="whole")
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, sweep, ScriptedRunner(interrupt_after(4)), out="cut")
    again = ScriptedRunner(lambda t, a: served(t))
    resumed, rows = run(tmp_path, sweep, again, out="cut")
    assert len(again.runs) == 6  # the budget counts the 4 stored points: none is measured twice
    assert len(rows) == 10 and len(resumed.searches.search.points) == 10
    # One point at a time, the sampler seeded per step: the same points, so the same answer.
    assert sorted(r["search_params"] for r in rows) == sorted(r["search_params"] for r in whole_rows)
    assert best_of(resumed) == best_of(whole)


def test_a_larger_budget_goes_on_from_the_stored_points(tmp_path):
    run(tmp_path, fixed_rate_search(1, trials=5), ScriptedRunner(lambda t, a: served(t)))
    more = ScriptedRunner(lambda t, a: served(t))
    sweep_run, rows = run(tmp_path, fixed_rate_search(1, trials=8), more)
    assert len(more.runs) == 3 and len(rows) == 8 and len(sweep_run.searches.search.points) == 8


def test_points_that_break_a_constraint_are_named_and_none_is_best(tmp_path):
    sweep = fixed_rate_search(0, trials=6, constraints={"slo": True, "ttft_p99_s": {"max": 0.01}})
    sweep_run, _ = run(tmp_path, sweep, ScriptedRunner(lambda t, a: served(t)))
    outcome = sweep_run.summary.search
    assert outcome.best == [] and outcome.closest is not None
    assert all(any("ttft_p99_s" in v for v in p.violations) for p in outcome.points)


def test_a_search_keeps_every_gpu_busy_with_a_point(tmp_path):
    sweep = fixed_rate_search(0, trials=12)
    events: list[RunEvent] = []
    sweep_run, rows = run(tmp_path, sweep, ScriptedRunner(lambda t, a: served(t)), cluster=GPUS4, parallel=4,
                          events=events)
    assert len(rows) == 12
    # Four points out at once from the start, and a new one as each ends, until the budget is spent.
    open_groups, most = 0, 0
    from sweeper.run.events import ActorRequested, GroupEnded

    for e in events:
        open_groups += isinstance(e, ActorRequested) - isinstance(e, GroupEnded)
        most = max(most, open_groups)
    assert most >= 4
    assert len(sweep_run.searches.search.points) == 12


def test_a_capacity_objective_searches_configurations_by_their_capacity(tmp_path):
    sweep = serving_sweep(request_rate={"capacity": {"low": 10, "high": 4000, "resolution": 0.05}}, search={
        "objective": {"minimize": "energy_per_request_j"}, "constraints": {"min_capacity_req_s": 150},
        "space": {"backend_options.noop.max_batch": [4, 8, 16, 32]}, "budget": {"trials": 8}, "seed": 0})
    sweep_run, rows = run(tmp_path, sweep, ScriptedRunner(lambda t, a: served(t)))
    outcome = sweep_run.summary.search
    # Capacity >= 150 needs max_batch >= 16 (bf16: 192 at 16); the cheapest of those is bf16 at 16.
    assert (outcome.best[0].trial.precision, outcome.best[0].trial.backend_options.max_batch) == ("bf16", 16)
    capacity = pq.read_table(tmp_path / "out" / "capacity.parquet").to_pylist()
    assert len(capacity) == len(outcome.points) == 8  # the whole space: 2 precisions x 4 values
    assert {r["search_step"] for r in rows} == set(range(8))


def test_a_search_with_no_runnable_point_records_why_and_says_so(tmp_path):
    # fp16 on a CPU is skipped at plan time (emulated half precision): the space holds nothing runnable.
    sweep = serving_sweep(request_rate=5, precisions=("fp16",), search={
        "objective": {"minimize": "energy_per_request_j"}, "space": SPACE, "budget": {"trials": 3}})
    runner = ScriptedRunner(lambda t, a: served(t))
    sweep_run, rows = run(tmp_path, sweep, runner)
    assert runner.runs == [] and [r["status"] for r in rows] == ["skipped"]
    assert "fp16 on cpu" in rows[0]["error"]
    outcome = sweep_run.summary.search
    assert outcome.points == [] and outcome.stopped_by == "no grid point is runnable here (the skipped rows say why)"
