"""``python -m bench energy`` end to end on this CPU, so that a GPU lease never finds it broken.

The bench runs on H100/H200 leases only (its numbers are in docs/BENCHMARKS.md §2). Here
the real bench, the real actor code and a real tiny transformers model run on the CPU;
NVML is the one test double (tests/fake_nvml.py), on the real clock, with the GPU drawing
a constant 250 W. What must hold whatever the device: every window's counter energy
matches the power integral, the phase energies sum to the window, both counter-read
spacings are reported, and every sampler variant yields a paired ratio.
"""

from __future__ import annotations

import json
import sys
import time

import pytest

from bench.__main__ import main as bench_main
from tests.fake_nvml import FakeClock, FakeGpu, FakeNvml, PowerTrace

POWER_W = 250.0


class RealClock(FakeClock):
    """The double's counter and power follow the real monotonic clock the actor uses."""

    def __call__(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture
def gpu_on_cpu(monkeypatch):
    """One simulated GPU that the actor meters while the model runs on the CPU."""
    import torch

    import actors.actor as actor
    from actors.telemetry import Telemetry

    fake = FakeNvml([FakeGpu("GPU-00000000-1111-2222-3333-000000000000", power=PowerTrace.constant(POWER_W))],
                    RealClock())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "simulated GPU")

    def open_telemetry(self, trial):  # the real Telemetry, though the model runs on the CPU
        tel = Telemetry.open(interval_s=trial.measure.sample_interval_s, sync=self.backend.sync)
        tel.start()
        return tel

    monkeypatch.setattr(actor.TrialRunner, "_open_telemetry", open_telemetry)
    return fake


@pytest.mark.slow
def test_energy_bench_runs_and_its_checks_hold(gpu_on_cpu, tmp_path):
    out = tmp_path / "energy.json"
    assert bench_main([
        "energy", "--model", "tiny-llama", "--batches", "1", "--repeats", "2", "--energy-every", "1,10",
        "--window-s", "1.0", "--warmup-s", "0.2", "--idle-s", "0.5", "--input-len", "16", "--output-len", "8",
        "--overhead-pairs", "2", "--overhead-block-s", "0.3", "--overhead-modes", "off,full,sparse,field",
        "--out", str(out)]) == 0

    report = json.loads(out.read_text())["results"]
    batch = report["batches"]["1"]
    assert [(r["repeat"], r["energy_every"]) for r in batch["trials"]] == [(0, 1), (0, 10), (1, 1), (1, 10)]
    for row in batch["trials"]:
        assert row["energy_method"] == "nvml_counter_interpolated"
        assert row["avg_power_w"] == pytest.approx(POWER_W, rel=0.02)
        assert row["counter_vs_integral"] == pytest.approx(1.0, abs=0.02)
        assert abs(row["phase_sum_minus_total_j"]) <= row["uncertainty_j"]
    assert set(batch["checks"]) == {"energy_every_1", "energy_every_10"}
    for name in ("on", "sparse", "field"):
        rounds = batch[f"sampler_{name}_over_off_rounds"]
        assert len(rounds) == 2 and all(r > 0 for r in rounds)
    costs = batch["nvml_call_cost_s"]
    # Through either API, read between two plain reads, the double's counter is the same counter.
    assert all(a <= fv <= b for a, fv, b in costs["field_value_vs_counter_mj"])
    assert costs["energy_mj"] > 0 and costs["energy_field_value"] > 0
