"""A tensor-parallel trial is metered on exactly the GPUs it holds, each on its own.

NVML is the test double (a CPU machine has no GPU): four GPUs, of which the trial's
actor holds two (CUDA_VISIBLE_DEVICES, as Ray sets it). The trial itself is real: the
noop backend's simulated engine through the actor's full measurement path, offline and
serving, with the telemetry's sampler thread on the real clock.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.bench.test_bench_energy import RealClock
from tests.fake_nvml import FakeGpu, FakeNvml, PowerTrace


def uuid(i: int) -> str:
    return f"GPU-7e57{i:04d}-0000-0000-0000-000000000000"


HELD = (1, 3)  # the trial's GPUs: node-local indices, as Ray hands them out
POWER_W = {0: 1000.0, 1: 200.0, 2: 1000.0, 3: 400.0}


def _fake(monkeypatch, pids: dict[int, tuple[int, ...]]) -> FakeNvml:
    gpus = [FakeGpu(uuid(i), power=PowerTrace.constant(POWER_W[i]), process_pids=pids.get(i, ()),
                    memory_used_bytes=(10 + i) * 2**30) for i in range(4)]
    fake = FakeNvml(gpus, RealClock())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, HELD)))
    return fake


def _run(workload: dict) -> dict:
    from actors.actor import TrialRunner
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep

    trial = make_plan(parse_sweep({
        "name": "tp", "models": ["tiny-llama"], "backends": "noop", "precisions": "bf16",
        "tensor_parallel": 2, **({} if workload.get("mode") == "serving" else {"batch_sizes": 2}), "backend_options": {"noop": {"step_s": 0.01}},
        "workload": {"input_len": 8, "output_len": 8, **workload},
        "measure": {"warmup_iters": 1, "idle_s": 0.3, "min_duration_s": 0.5, "min_window_s": 0.2},
    }), "cuda").runnable[0]
    assert trial.num_gpus == 2
    runner = TrialRunner()
    try:
        assert runner.load(trial).ok
        outcome = runner.run(trial)
    finally:
        runner.close()
    assert outcome.row["status"] == "ok", outcome.row.get("error")
    timeline = outcome.tables["timeline"].to_pylist()
    return {**outcome.row, "_requests": outcome.tables["requests"].to_pylist(), "_timeline": timeline}


def _per_gpu_figures_hold(row: dict, fake: FakeNvml) -> None:
    # The others (at 1000 W, which would dominate any sum) were only named, to map the
    # visible indices onto NVML's devices: never read.
    identity = {"nvmlDeviceGetUUID", "nvmlDeviceGetName"}
    for i in range(4):
        called = fake.reads_by_uuid.get(uuid(i), set())
        assert (called <= identity) is (i not in HELD), (i, called)
    assert row["gpu_uuids"] == ",".join(uuid(i) for i in HELD)
    # Each GPU's own energy, in the order of gpu_uuids, and their sum is the row's.
    energies = row["gpu_energy_j"]
    assert len(energies) == 2 and sum(energies) == pytest.approx(row["energy_j"], rel=1e-12)
    for e, i in zip(energies, HELD, strict=True):
        assert e == pytest.approx(POWER_W[i] * row["duration_s"], rel=0.05)
    assert row["gpu_avg_power_w"] == pytest.approx([POWER_W[i] for i in HELD], rel=0.05)
    assert row["gpu_peak_power_w"] == pytest.approx([POWER_W[i] for i in HELD], rel=0.05)
    assert row["gpu_idle_power_w"] == pytest.approx([POWER_W[i] for i in HELD], rel=0.05)
    assert sum(row["gpu_idle_power_w"]) == pytest.approx(row["idle_power_w"], rel=1e-9)
    assert row["gpu_peak_memory_bytes"] == [(10 + i) * 2**30 for i in HELD]


def test_an_offline_tp2_trial_meters_its_two_gpus_and_nothing_else(monkeypatch):
    fake = _fake(monkeypatch, {1: (os.getpid(),), 3: (os.getpid(),)})
    row = _run({})
    _per_gpu_figures_hold(row, fake)
    assert row["energy_exclusive"] is True  # the actor's own process on both
    # bench tp-energy's independent check: each GPU's raw counter off the timeline alone.
    from bench.tp_energy import check_trial

    check = check_trial(row, row["_timeline"], row["_requests"])
    assert abs(check["gpu_sum_rel_diff"]) < 1e-12
    assert check["independent_gpu_energy_j"] == pytest.approx(row["gpu_energy_j"], rel=0.05)


def test_a_serving_tp2_trial_sums_per_gpu_and_per_request(monkeypatch):
    fake = _fake(monkeypatch, {1: (os.getpid(),)})
    row = _run({"mode": "serving", "request_rate": 40, "num_prompts": 60, "seed": 0})
    _per_gpu_figures_hold(row, fake)  # the steady window's, as energy_j
    requests = row["_requests"]
    assert sum(r["energy_j"] for r in requests) == pytest.approx(row["run_energy_j"], rel=1e-9)


def test_energy_is_exclusive_only_when_every_process_on_the_gpus_is_the_trials(monkeypatch):
    # A worker the actor started (as vLLM starts its tensor-parallel workers) is the trial's own...
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _fake(monkeypatch, {1: (os.getpid(),), 3: (worker.pid,)})
        row = _run({})
        assert row["energy_exclusive"] is True
        assert str(worker.pid) in row["gpu_processes"] and str(os.getpid()) in row["gpu_processes"]
    finally:
        worker.kill()
        worker.wait()
    # ...a process that is not (pid 1: init, nobody's child) makes the energy shared.
    _fake(monkeypatch, {1: (os.getpid(),), 3: (1,)})
    assert _run({})["energy_exclusive"] is False
