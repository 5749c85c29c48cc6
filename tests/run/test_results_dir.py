"""The results directory's promises, tried as a demanding user would: faults injected on purpose.

Real CLI runs (noop backend: fast and deterministic), real Parquet files truncated
or emptied by hand, a real second process holding the lock, a real tmpfs that fills.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sweeper.run.lock import LOCK_FILE, RunLock
from sweeper.run.storage import ResultStore
from tests.conftest import ROOT, run_cli

SWEEP = """
name: results
models: [tiny-llama]
backends: noop
precisions: fp32
batch_sizes: {batches}
workload: {{input_len: 8, output_len: 4}}
measure: {{warmup_iters: 0, min_iters: {min_iters}, min_duration_s: 0, idle_s: 0{extra}}}
backend_options: {{noop: {{step_s: 0.001}}}}
"""

pytestmark = pytest.mark.slow


def _sweep(write_sweep, batches=(1, 2, 4), min_iters=1, extra=""):
    return write_sweep(SWEEP.format(batches=list(batches), min_iters=min_iters, extra=extra))


def _rows(out: Path, name: str = "trials.parquet") -> list[dict]:
    return pq.read_table(out / name).to_pylist()


def _config(row: dict) -> tuple:
    return tuple(v for k, v in sorted(row.items()) if k in {
        "model", "backend", "backend_options", "precision", "tensor_parallel", "batch_size", "input_len",
        "output_len", "repeat", "dataset", "seed", "warmup_iters", "warmup_s", "min_iters", "min_duration_s",
        "idle_s", "sample_interval_s", "min_window_s", "max_iteration_cv", "layer_profile", "fidelity"})


def test_editing_the_sweep_leaves_one_row_per_configuration_and_deletes_nothing(write_sweep, tmp_path):
    out = tmp_path / "out"
    assert run_cli("run", str(_sweep(write_sweep)), "-o", str(out), "-q").returncode == 0
    # a measurement setting changes: every trial re-runs; the old rows are superseded, not mixed in
    r = run_cli("run", str(_sweep(write_sweep, min_iters=2)), "-o", str(out), "-q")
    assert r.returncode == 0, r.stderr
    rows = _rows(out)
    assert len(rows) == 3 and {row["min_iters"] for row in rows} == {2}
    assert len({_config(row) for row in rows}) == len(rows)  # no two rows alike
    assert len(_rows(out, "superseded/trials.parquet")) == 3  # nothing measured is deleted
    assert "3 stored result(s) of trials this sweep no longer has are kept" in r.stderr
    # a batch size removed: its row leaves trials.parquet too
    assert run_cli("run", str(_sweep(write_sweep, batches=(1, 2), min_iters=2)), "-o", str(out),
                   "-q").returncode == 0
    assert sorted(row["batch_size"] for row in _rows(out)) == [1, 2]
    # only the driver's patience changes: nothing re-runs
    again = run_cli("run", str(_sweep(write_sweep, batches=(1, 2), min_iters=2, extra=", timeout_s: 99")),
                    "-o", str(out), "-q")
    assert again.returncode == 0 and "2 trial(s) already ok; 0 to run" in again.stderr


def test_a_corrupt_shard_is_moved_aside_and_its_trial_runs_again(write_sweep, tmp_path):
    out = tmp_path / "out"
    sweep = _sweep(write_sweep)
    assert run_cli("run", str(sweep), "-o", str(out), "-q").returncode == 0
    shards = sorted((out / "shards" / "trials").glob("*.parquet"))
    victim = shards[0]
    victim.write_bytes(victim.read_bytes()[:100])  # truncated, as a power loss could leave it
    (out / "shards" / "requests" / f"{shards[1].stem}.parquet").write_bytes(b"")  # zero bytes
    orphan = out / "shards" / "requests" / "0000000000000000.parquet"  # no trials shard: an orphan
    shutil.copy(out / "shards" / "requests" / f"{shards[2].stem}.parquet", orphan)

    agg = run_cli("aggregate", str(out))
    assert agg.returncode == 0, agg.stderr
    assert f"moved aside unreadable trials shard {victim.name}" in agg.stderr + agg.stdout
    # an unreadable requests shard takes its trial's trials shard (the commit marker) aside too
    assert f"moved aside unreadable requests shard {shards[1].name}" in agg.stderr + agg.stdout
    assert (out / "quarantine" / "trials").exists() and not victim.exists() and not shards[1].exists()
    assert len(_rows(out)) == 1
    assert "0000000000000000" not in {r["trial_id"] for r in _rows(out, "requests.parquet")}

    rerun = run_cli("run", str(sweep), "-o", str(out), "-q")
    assert rerun.returncode == 0, rerun.stderr
    assert "2 to run" in rerun.stderr
    assert sorted(r["status"] for r in _rows(out)) == ["ok"] * 3
    assert len(list((out / "quarantine" / "trials").iterdir())) == 2  # kept, never deleted
    assert len(list((out / "quarantine" / "requests").iterdir())) == 1


@pytest.mark.parametrize("kind, new_trials", [
    ("trials", False),    # the only damage, every other trial done: the no-Ray shortcut's case
    ("trials", True),     # beside new trials to run
    ("requests", False),  # a trial's other shard damaged: the trial is incomplete, so it runs again
], ids=["trials-shard-nothing-else-to-run", "trials-shard-with-new-trials", "requests-shard"])
def test_the_first_resume_after_a_truncated_shard_measures_its_trial_again(write_sweep, tmp_path, kind,
                                                                           new_trials):
    out = tmp_path / "out"
    assert run_cli("run", str(_sweep(write_sweep)), "-o", str(out), "-q").returncode == 0
    before = {row["trial_id"]: row for row in _rows(out)}
    tid = sorted(before)[1]
    victim = out / "shards" / kind / f"{tid}.parquet"
    whole = victim.read_bytes()
    victim.write_bytes(whole[:len(whole) // 2])  # cut to half its bytes, as a power loss could leave it

    r = run_cli("run", str(_sweep(write_sweep, batches=(1, 2, 4, 8) if new_trials else (1, 2, 4))),
                "-o", str(out), "-q")
    assert r.returncode == 0, r.stderr
    assert f"moved aside unreadable {kind} shard {victim.name}" in r.stderr
    assert f"2 trial(s) already ok; {2 if new_trials else 1} to run" in r.stderr
    rows = {row["trial_id"]: row for row in _rows(out)}
    assert len(rows) == (4 if new_trials else 3) and {row["status"] for row in rows.values()} == {"ok"}
    assert rows[tid]["started_at"] > before[tid]["started_at"]  # measured again, in this one run
    assert tid in {row["trial_id"] for row in _rows(out, "requests.parquet")}
    kept = list((out / "quarantine" / kind).iterdir())  # the damaged file is kept aside, never deleted
    assert len(kept) == 1 and kept[0].name.startswith(victim.name) and kept[0].read_bytes() == whole[:len(whole) // 2]
    if kind != "trials":  # its readable trials row is kept aside beside it
        assert [f.name.split(".parquet")[0] for f in (out / "quarantine" / "trials").iterdir()] == [tid]

    again = run_cli("run", str(_sweep(write_sweep, batches=(1, 2, 4, 8) if new_trials else (1, 2, 4))),
                    "-o", str(out), "-q", own_ray=True)
    assert again.returncode == 0 and "0 to run (Ray not started)" in again.stderr, again.stderr
    assert "moved aside" not in again.stderr


def test_a_resume_with_nothing_to_run_repairs_a_damaged_trials_table_and_index(write_sweep, tmp_path):
    out = tmp_path / "out"
    sweep = _sweep(write_sweep)
    assert run_cli("run", str(sweep), "-o", str(out), "-q").returncode == 0
    before = _rows(out)
    trials = out / "trials.parquet"
    whole = trials.read_bytes()
    trials.write_bytes(whole[:len(whole) // 2])  # cut short, as an interrupted copy leaves it

    # own_ray: without --address, as a user runs it, so the no-Ray shortcut is what is tried
    r = run_cli("run", str(sweep), "-o", str(out), "-q", own_ray=True)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "3 trial(s) already ok; 0 to run (Ray not started)" in r.stderr
    assert f"warning: {trials}: not a readable Parquet table" in r.stderr and "rebuilding it" in r.stderr
    assert "sweeper aggregate" not in r.stderr and "Best configuration per model" in r.stderr
    assert _rows(out) == before  # the same results, from the shards: nothing measured again

    # Bytes that are not UTF-8 in the index: rebuilt from the shards, the resume goes on.
    index = out / "shards" / "trials.index"
    index.write_bytes(index.read_bytes() + b"\xff\xfe\n" + bytes(8))
    r = run_cli("run", str(sweep), "-o", str(out), "-q", own_ray=True)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "3 trial(s) already ok; 0 to run (Ray not started)" in r.stderr
    assert f"warning: {index}: undecodable bytes" in r.stderr
    assert len(index.read_text(encoding="utf-8").splitlines()) == 3 and _rows(out) == before
    again = run_cli("run", str(sweep), "-o", str(out), "-q", own_ray=True)
    assert again.returncode == 0 and "warning" not in again.stderr, again.stderr


def test_a_second_run_into_the_same_directory_is_refused_and_a_stale_lock_taken_over(write_sweep, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from sweeper.run.storage import ResultStore; from sweeper.run.lock import RunLock;"
        f"lock = RunLock(ResultStore({str(out)!r})); lock.acquire(); print('held', flush=True); time.sleep(60)")],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = run_cli("run", str(_sweep(write_sweep)), "-o", str(out), "-q")
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert r.stderr.strip().splitlines() == [
            line for line in r.stderr.strip().splitlines() if "in use by another sweeper run" in line]
        assert f"pid {holder.pid} on" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    # the holder was killed: its lock is stale (its pid is gone) and the next run takes it over
    assert (out / LOCK_FILE).exists()
    r = run_cli("run", str(_sweep(write_sweep)), "-o", str(out), "-q")
    assert r.returncode == 0, r.stderr
    assert "took over a stale lock" in r.stderr and not (out / LOCK_FILE).exists()


def test_a_lock_not_refreshed_for_long_is_stale_on_any_host(tmp_path):
    store = ResultStore(str(tmp_path))
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "started_at": "then"}))
    old = time.time() - 3600
    os.utime(tmp_path / LOCK_FILE, (old, old))
    lock = RunLock(store)
    lock.acquire()
    assert lock.took_over is not None and lock.took_over["host"] == "elsewhere"
    lock.release()
    (tmp_path / LOCK_FILE).write_text(json.dumps({"host": "elsewhere", "pid": 1, "started_at": "now"}))
    with pytest.raises(Exception, match="in use by another sweeper run .pid 1 on elsewhere"):
        RunLock(store).acquire()


@pytest.mark.parametrize("content", [b"", b"\x00\x00", b'{"pid": 7', b"[1, 2]"])
def test_a_lock_that_does_not_say_whose_it_is_is_judged_by_its_age(tmp_path, content):
    """Caught between its creation and its first write (empty), or damaged: a run may be starting
    this instant, so a fresh one is refused, never taken over; an old one is stale."""
    store = ResultStore(str(tmp_path))
    (tmp_path / LOCK_FILE).write_bytes(content)
    with pytest.raises(Exception, match=r"may be in use by another sweeper run: its lock .* does not say whose"):
        RunLock(store).acquire()
    old = time.time() - 3600
    os.utime(tmp_path / LOCK_FILE, (old, old))
    lock = RunLock(store)
    lock.acquire()
    assert re.fullmatch(rf"took over a stale lock of {re.escape(store.uri)} \(unreadable, untouched for 36\d\d s\)",
                        lock.took_over_text() or "")
    lock.release()


@pytest.mark.parametrize("make_output", [
    lambda tmp: (tmp / "a-file").write_text("x") and str(tmp / "a-file"),
    lambda tmp: "foo://bar",
])
def test_a_bad_destination_is_one_line_before_ray_starts(write_sweep, tmp_path, make_output):
    t0 = time.monotonic()
    r = run_cli("run", str(_sweep(write_sweep)), "-o", make_output(tmp_path), "-q")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "starting Ray" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("error: --output ")
    assert time.monotonic() - t0 < 60


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_read_only_destination_is_refused_before_ray(write_sweep, small_tmpfs):
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True)
    r = run_cli("run", str(_sweep(write_sweep)), "-o", str(small_tmpfs / "out"), "-q")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "not writable: Read-only file system" in r.stderr


def test_a_disk_that_fills_stops_the_sweep_in_one_line_and_a_resume_completes_it(write_sweep, small_tmpfs,
                                                                                   tmp_path):
    out = small_tmpfs / "out"
    sweep = _sweep(write_sweep, batches=list(range(1, 41)))
    r = run_cli("run", str(sweep), "-o", str(out), "-q")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "failed (No space left on device); the sweep stopped" in r.stderr
    assert "warning: only 0 MiB free under" in r.stderr  # said before the sweep started
    kept = len(list((out / "shards" / "trials").glob("*.parquet")))
    assert 0 < kept < 40
    # more room (the same results moved to a bigger disk): the resume runs only the rest
    bigger = tmp_path / "bigger"
    shutil.copytree(out, bigger, ignore=shutil.ignore_patterns(".sweeper.lock"))
    again = run_cli("run", str(sweep), "-o", str(bigger), "-q")
    assert again.returncode == 0, again.stderr
    assert f"{kept} trial(s) already ok; {40 - kept} to run" in again.stderr
    assert len(_rows(bigger)) == 40


def test_an_unreachable_object_store_is_one_line_before_ray(write_sweep):
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_ACCESS_KEY_ID": "x",
           "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1", "COLUMNS": "200"}
    r = subprocess.run([sys.executable, "-m", "sweeper", "run", str(_sweep(write_sweep)), "-o", "s3://bucket/results",
                        "-q"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "starting Ray" not in r.stderr
    assert r.stderr.startswith("error: --output s3://bucket/results: cannot reach it: ")
    assert len(r.stderr.strip().splitlines()) == 1
