"""Faults in the driver loop, with a real local Ray: dead actors, timeouts, OOM pruning, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from sweeper.core.outcome import TrialOutcome
from sweeper.core.results import TrialResult
from sweeper.core.trial import MeasureSettings
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import load_sweep
from sweeper.run.assembly import run_plan
from sweeper.run.resume import predicted_oom
from sweeper.run.storage import ResultStore
from sweeper.run.sweep_run import RunOptions
from tests.conftest import ROOT, interruptible, on_the_shared_head


def _plan(write_sweep, text: str, device: str = "cpu"):
    path = write_sweep(text)
    return make_plan(load_sweep(path), device, sweep_path=str(path))


def _rows(store: ResultStore) -> dict[tuple, dict]:
    table = store.read_shards("trials").to_pylist()
    return {(r["batch_size"], r["input_len"], r["output_len"]): r for r in table}


# -- OOM pruning ---------------------------------------------------------------------------

OOM_SWEEP = """
name: oom
models: [tiny-llama, tiny-qwen2]
precisions: fp32
batch_sizes: [1, 2, 4, 8]
workload: {input_len: [8, 16], output_len: 4}
repeats: 2
"""


def test_an_oom_predicts_only_larger_batches_of_the_same_group_and_shape(write_sweep):
    plan = _plan(write_sweep, OOM_SWEEP)
    pending = list(plan.runnable)
    oom = next(t for t in pending if (t.model, t.batch_size, t.input_len, t.repeat) == ("tiny-llama", 2, 8, 0))
    # the row an actor sends back when torch raises OutOfMemoryError
    outcome = TrialOutcome(oom.trial_id, TrialResult.from_row(
        {"status": "failed", "reason": "oom", "error": "OutOfMemoryError: CUDA"}))
    assert outcome.status == "failed" and outcome.row["reason"] == "oom"

    pruned = predicted_oom(oom, pending)
    assert {(t.model, t.batch_size, t.input_len, t.repeat) for t in pruned} == {
        ("tiny-llama", b, 8, r) for b in (4, 8) for r in (0, 1)}
    # smaller or equal batches, other shapes and other groups are not predicted
    assert predicted_oom(oom.with_axes(batch_size=8), pending) == []


# -- timeout -------------------------------------------------------------------------------

def test_timeout_is_no_part_of_a_trial_id(write_sweep):
    base = _plan(write_sweep, OOM_SWEEP).runnable[0]
    assert "timeout_s" not in base.identity()["measure"]
    assert "timeout_s" not in base.columns()  # no schema column: it shapes no ok row
    # A limit on the driver's patience: changing it alone re-runs nothing.
    limited = replace(base, measure=base.measure.model_copy(update={"timeout_s": 30.0}))
    assert limited.trial_id == base.trial_id
    assert replace(base, measure=MeasureSettings(**{**base.measure.__dict__})).trial_id == base.trial_id


@pytest.mark.slow
def test_a_hung_load_fails_its_group_as_load_timeout_through_ray(ray_local, write_sweep, tmp_path):
    # The noop backend's load sleeps 600 s; the limit is 2 s: the load is abandoned (its actor
    # killed, a fresh one tried once), then both trials of the group are failed rows.
    plan = _plan(write_sweep, """
name: load-timeouts
models: [tiny-llama]
backends: noop
precisions: fp32
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0, idle_s: 0, load_timeout_s: 2.0}
backend_options: {noop: {load_s: 600}}
""")
    store = ResultStore(str(tmp_path / "out"))
    t0 = time.monotonic()
    summary = run_plan(plan, store, ray_local, RunOptions(max_retries=1))
    assert time.monotonic() - t0 < 120
    rows = _rows(store)
    assert [(r["status"], r["reason"]) for r in rows.values()] == [("failed", "load_timeout")] * 2
    assert all("load ran past measure.load_timeout_s = 2 s, 2 time(s)" in r["error"] for r in rows.values())
    assert summary.retries == 1 and summary.model_loads == 2


@pytest.mark.slow
def test_a_trial_past_its_timeout_fails_and_its_actor_is_replaced(ray_local, write_sweep, tmp_path):
    # The step time is the test's, not the machine's: out=2000 sleeps 20 s of 10 ms steps (its
    # warm-up call alone is past the limit), out=4 40 ms; the limit leaves a loaded 2-core
    # machine room for the short trials and their actor's start.
    plan = _plan(write_sweep, """
name: timeouts
models: [tiny-llama]
backends: noop
precisions: fp32
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: [4, 2000]}
backend_options: {noop: {step_s: 0.01}}
measure: {warmup_iters: 1, min_iters: 1, min_duration_s: 0, idle_s: 0, timeout_s: 3.0}
""")
    store = ResultStore(str(tmp_path / "out"))
    t0 = time.monotonic()
    summary = run_plan(plan, store, ray_local)
    rows = _rows(store)
    assert {k: (r["status"], r["reason"]) for k, r in rows.items()} == {
        (1, 8, 4): ("ok", None), (1, 8, 2000): ("failed", "timeout"),
        (2, 8, 4): ("ok", None), (2, 8, 2000): ("failed", "timeout")}
    assert "timeout_s = 3 s" in rows[(1, 8, 2000)]["error"]
    # one load, then a fresh actor (and load) after the first timeout only: the last
    # one left nothing to run
    assert summary.model_loads == 1 + 1
    assert (summary.ok, summary.failed) == (2, 2)
    assert time.monotonic() - t0 < 60
    assert 0 < summary.busy_fraction <= 1


# -- actor death ---------------------------------------------------------------------------

def _kill_running_actors(times: int, stop: threading.Event, killed: list[int], method: str = "run") -> None:
    """SIGKILL the process of a TrialRunner while it runs a trial (or loads), ``times`` times.

    Ray titles an actor's worker process ``ray::TrialRunner.run`` while that
    method executes, so this hits a trial mid-measurement, from outside, as a
    segfault or the kernel's OOM killer would. Only this process's descendants
    (the local Ray it started) are candidates: other Rays on the machine are not ours.
    """
    me = psutil.Process()
    while len(killed) < times and not stop.is_set():
        for proc in me.children(recursive=True):
            try:
                cmd = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if f"TrialRunner.{method}" in cmd and proc.pid not in killed:
                time.sleep(0.3)  # inside the measured window, not at its first instruction
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                    killed.append(proc.pid)
                except ProcessLookupError:
                    pass
                break
        time.sleep(0.05)


# Two-second windows of 10 ms steps: the killer finds each trial mid-measurement.
DEATH_SWEEP = """
name: deaths
models: [tiny-llama]
backends: noop
precisions: fp32
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
backend_options: {noop: {step_s: 0.01}}
measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 2.0, idle_s: 0}
"""


def _run_killing(plan, store, ray_local, kills: int, max_retries: int, phase: str):
    """run_plan while a thread SIGKILLs the actor ``kills`` times during ``phase`` (run | load)."""
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_running_actors, args=(kills, stop, killed, phase), daemon=True)
    killer.start()
    try:
        summary = run_plan(plan, store, ray_local, RunOptions(max_retries=max_retries))
    finally:
        stop.set()
        killer.join()
    assert len(killed) == kills
    return summary


@pytest.mark.parametrize(("kills", "max_retries", "first_status"), [(1, 1, "ok"), (2, 1, "failed")])
@pytest.mark.slow
def test_a_killed_actor_is_replaced_and_its_trial_retried(ray_local, write_sweep, tmp_path,
                                                          kills, max_retries, first_status):
    store = ResultStore(str(tmp_path / "out"))
    summary = _run_killing(_plan(write_sweep, DEATH_SWEEP), store, ray_local, kills, max_retries, "run")
    rows = _rows(store)
    first, second = rows[(1, 8, 4)], rows[(2, 8, 4)]
    assert first["status"] == first_status
    if first_status == "failed":
        assert first["reason"] == "actor_died" and "died 2 time(s)" in first["error"]
    assert second["status"] == "ok"  # the group goes on with its next trial
    assert summary.retries == min(kills, max_retries)
    assert summary.model_loads == 1 + kills  # a fresh actor loads the model after each death
    assert summary.ran == 2 and len(store.shard_paths("trials")) == 2  # every trial exactly once


LOAD_DEATH_SWEEP = """
name: load-deaths
models: [tiny-llama]
backends: noop
precisions: fp32
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
backend_options: {noop: {load_s: 1.0, step_s: 0.001}}
measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0, idle_s: 0}
"""


@pytest.mark.parametrize(("kills", "max_retries", "status"), [(1, 1, "ok"), (2, 1, "failed")])
@pytest.mark.slow
def test_an_actor_killed_while_loading_is_retried_like_one_killed_mid_trial(ray_local, write_sweep, tmp_path,
                                                                            kills, max_retries, status):
    store = ResultStore(str(tmp_path / "out"))
    summary = _run_killing(_plan(write_sweep, LOAD_DEATH_SWEEP), store, ray_local, kills, max_retries, "load")
    rows = list(_rows(store).values())
    assert len(rows) == 2 and {r["status"] for r in rows} == {status}  # each trial exactly once
    if status == "failed":
        assert {r["reason"] for r in rows} == {"actor_died"}
        assert all("died 2 time(s) loading" in r["error"] for r in rows)
    assert summary.retries == min(kills, max_retries)
    assert summary.model_loads == 1 + min(kills, max_retries)


# -- Ctrl-C and resume ---------------------------------------------------------------------

# Every generate call waits while GATE is absent: the test lets the first trial
# finish, then closes the gate, so the interrupt lands mid-sweep whatever the
# machine's speed (only the trial already past its last call can still finish).
SIGINT_SWEEP = """
name: interrupted
models: [tiny-llama]
backends: noop
precisions: fp32
batch_sizes: [1, 2, 3, 4]
workload: {{input_len: 8, output_len: 4}}
measure: {{warmup_iters: 0, min_iters: 1, min_duration_s: 1.0, idle_s: 0}}
backend_options: {{noop: {{gate_file: "{gate}"}}}}
"""


def _shards(out: Path) -> dict[str, int]:
    d = out / "shards" / "trials"
    return {p.stem: p.stat().st_mtime_ns for p in d.glob("*.parquet")} if d.exists() else {}


@pytest.mark.slow
def test_ctrl_c_keeps_finished_shards_and_a_second_run_completes_exactly_the_rest(write_sweep, tmp_path):
    gate = tmp_path / "gate"
    sweep_path, out = write_sweep(SIGINT_SWEEP.format(gate=gate)), tmp_path / "out"
    gate.touch()  # the first trial runs ...
    all_ids = {t.trial_id for t in make_plan(load_sweep(sweep_path), "cpu").runnable}
    cmd = [sys.executable, "-m", "sweeper", "run", str(sweep_path), "-o", str(out), "-q"]
    with interruptible(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        deadline = time.monotonic() + 120
        while not _shards(out) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        gate.unlink()  # ... and every later generate call waits
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted" in stderr
    first = _shards(out)
    assert 1 <= len(first) < len(all_ids)
    assert set(first) <= all_ids
    assert all(r["status"] == "ok" for r in ResultStore(str(out)).read_shards("trials").to_pylist())

    gate.touch()
    # The resume need not start a Ray of its own: it joins the tests' shared head.
    joined, env = on_the_shared_head(cmd)
    again = subprocess.run(joined, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{len(first)} trial(s) already ok; {len(all_ids) - len(first)} to run" in again.stderr
    assert "busy fraction" in again.stderr and "1 model load(s)" in again.stderr
    second = _shards(out)
    assert set(second) == all_ids
    assert {k: second[k] for k in first} == first  # finished shards untouched
    rows = ResultStore(str(out)).read_shards("trials").to_pylist()
    assert sorted(r["trial_id"] for r in rows) == sorted(all_ids)  # each trial exactly once


def test_run_takes_the_fault_flags():
    from typer.testing import CliRunner

    from sweeper.cli import app

    result = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for flag in ("--max-retries", "--no-oom-pruning", "--no-split", "--quiet"):
        assert flag in result.output


@pytest.mark.slow
def test_sigterm_is_handled_like_ctrl_c(write_sweep, tmp_path):
    gate = tmp_path / "gate"
    sweep_path, out = write_sweep(SIGINT_SWEEP.format(gate=gate)), tmp_path / "out"
    gate.touch()
    # A driver joined to a cluster (Ctrl-C above has the embedded local Ray): SIGTERM there.
    cmd, env = on_the_shared_head([sys.executable, "-m", "sweeper", "run", str(sweep_path), "-o", str(out), "-q"])
    with interruptible(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as proc:
        deadline = time.monotonic() + 120
        while not _shards(out) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        gate.unlink()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143, stderr[-3000:]
    assert "terminated: every finished trial is saved" in stderr and "Traceback" not in stderr
    assert "Fatal Python error" not in stderr  # no C stack dump
    assert len(_shards(out)) >= 1
    assert not (out / ".sweeper.lock").exists()  # the lock is given back


@pytest.mark.slow
@pytest.mark.parametrize(("address", "expected"), [
    ("garbage", "expected auto, HOST:PORT"),
    ("127.0.0.1:1", "no Ray head answers there"),
])
@pytest.mark.slow
def test_a_bad_address_is_one_line_in_seconds(write_sweep, tmp_path, address, expected):
    sweep_path = write_sweep(SIGINT_SWEEP.format(gate=tmp_path / "gate"))
    for command in ("run", "plan"):
        t0 = time.monotonic()
        extra = ["-o", str(tmp_path / "out")] if command == "run" else []
        r = subprocess.run([sys.executable, "-m", "sweeper", command, str(sweep_path), "--address", address, *extra],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert [line for line in r.stderr.splitlines() if line.startswith("error:")] == [
            line for line in r.stderr.splitlines() if expected in line], r.stderr
        assert time.monotonic() - t0 < 30
