"""Telemetry: device mapping, sampler, energy meter, RAPL and the actor-facing facade.

NVML is replaced by ``tests/fake_nvml.py`` (the only double); everything else
is the real code, driven on a fake clock so results are exact and repeatable.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import sys
import time

import pyarrow as pa
import pynvml
import pytest

from actors.measure import window_energy_parts
from actors.method import ratio, window_memory
from actors.telemetry import (
    DEFAULT_POLICY,
    GPU_COLUMNS,
    METHOD_COUNTER,
    METHOD_INTERPOLATED,
    METHOD_POWER,
    TIMELINE_SCHEMA,
    CounterCurve,
    DeviceMappingError,
    EnergyMeter,
    MeteredGpus,
    MeterReading,
    NullTelemetry,
    RaplReader,
    RaplSnapshot,
    Sampler,
    SamplingPolicy,
    Telemetry,
    TelemetryBase,
    TelemetryError,
    resolve_gpus,
)
from sweeper.core.results import Energy, HostEnergy, PhaseEnergy
from tests.fake_nvml import FakeClock, FakeGpu, FakeNvml, PowerTrace

START_S = 1000.0
# Boundaries interpolated across the step in power, as for a GPU that may be busy on
# either side of a window; the actor's windows (the default policy) have quiet sides.
INTERPOLATED = SamplingPolicy(quiet_boundaries=False)


def uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-{i:012x}"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START_S)


def install(monkeypatch: pytest.MonkeyPatch, gpus: list[FakeGpu], clock=None, **kwargs) -> FakeNvml:
    fake = FakeNvml(gpus, clock, **kwargs)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def rig(monkeypatch, clock, gpus: list[FakeGpu], *, interval_s=0.1, sample_phase_s=0.03, visible="0",
        **policy):
    """Fake NVML, the real sampler and meter on the fake clock, with a first sample taken.
    The meter interpolates its boundaries unless ``policy`` says otherwise."""
    install(monkeypatch, gpus, clock)
    infos = resolve_gpus(visible)
    sampler = Sampler(infos, interval_s=interval_s, clock=clock)
    meter = EnergyMeter(infos, sampler, clock=clock, sleep=clock.sleep,
                        policy=SamplingPolicy(**{"quiet_boundaries": False, **policy}))
    clock.t_s = START_S + sample_phase_s
    sampler.sample_once()
    return infos, sampler, meter


# -- device mapping ------------------------------------------------------------------------


@pytest.fixture
def four_gpus(monkeypatch, clock) -> FakeNvml:
    gpus = [FakeGpu(uuid(i), power_limit_mw=700_000 - i * 1000) for i in range(4)]
    gpus[3].mig_uuids = ("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",)
    return install(monkeypatch, gpus, clock)


def test_visible_indices_map_to_physical_gpus_by_uuid(four_gpus):
    gpus = resolve_gpus("2,0")
    assert [(g.index, g.uuid) for g in gpus] == [(2, uuid(2)), (0, uuid(0))]
    assert gpus[0].power_limit_w == 698.0
    assert gpus[0].driver_version == "580.95.05"
    assert gpus[0].energy_counter_supported


def test_visible_uuids_reordered_keep_physical_indices(four_gpus):
    gpus = resolve_gpus(f"{uuid(3)}, {uuid(1)}")
    assert [(g.index, g.uuid) for g in gpus] == [(3, uuid(3)), (1, uuid(1))]


def test_uuid_prefix_and_mig_map_to_their_gpu(four_gpus):
    assert [g.index for g in resolve_gpus(uuid(2)[:14])] == [2]
    assert [g.uuid for g in resolve_gpus("MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee")] == [uuid(3)]
    assert [g.uuid for g in resolve_gpus(f"MIG-{uuid(1)}/1/0")] == [uuid(1)]


def test_unset_means_all_empty_means_none_negative_ends_the_list(four_gpus, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [g.index for g in resolve_gpus()] == [0, 1, 2, 3]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert [g.index for g in resolve_gpus()] == [3, 1]
    assert resolve_gpus("") == []
    assert [g.index for g in resolve_gpus("1,-1,2")] == [1]


def test_one_gpu_named_twice_is_held_once(four_gpus):
    assert [g.index for g in resolve_gpus(f"1,{uuid(1)},1")] == [1]


@pytest.mark.parametrize("entry", ["4", "GPU-ffffffff-0000-0000-0000-000000000000", "GPU-0000",
                                   "MIG-ffffffff-0000-0000-0000-000000000000", "gpu0"])
def test_unknown_visible_entry_raises(four_gpus, entry):
    with pytest.raises(DeviceMappingError):
        resolve_gpus(entry)
    assert issubclass(DeviceMappingError, TelemetryError)


def test_pre_volta_gpu_reports_no_counter(monkeypatch, clock):
    install(monkeypatch, [FakeGpu(uuid(0), energy_supported=False, power_limit_mw=None)], clock)
    (gpu,) = resolve_gpus("0")
    assert not gpu.energy_counter_supported
    assert gpu.power_limit_w is None


# -- sampler ---------------------------------------------------------------------------------


def test_sampler_rows_table_and_clear(monkeypatch, clock):
    gpus, sampler, _ = rig(monkeypatch, clock, [FakeGpu(uuid(0)), FakeGpu(uuid(1))], visible="1,0")
    sampler.run_inline(START_S + 1.0, clock.sleep)
    rows = sampler.rows_between(START_S + 0.2, START_S + 0.5)
    assert [r["gpu_index"] for r in rows] == [1, 0] * 3
    assert rows[0]["power_w"] == pytest.approx(300.0)
    assert rows[0]["energy_mj"] == FakeGpu(uuid(1)).counter_mj(rows[0]["t_s"])
    table = sampler.table()
    assert table.schema == TIMELINE_SCHEMA
    assert table.num_rows == 2 * 10
    assert table.column("memory_used_bytes")[0].as_py() == 40 * 2**30
    sampler.clear_before(START_S + 0.5)
    assert min(sampler.table().column("t_s").to_pylist()) >= START_S + 0.5


def test_sampler_survives_failing_reads(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), fail_every={"nvmlDeviceGetFieldValues": 2, "nvmlDeviceGetTemperatureV": 1,
                                       "nvmlDeviceGetTotalEnergyConsumption": 3})
    _, sampler, _ = rig(monkeypatch, clock, [gpu])
    sampler.run_inline(START_S + 1.2, clock.sleep)
    rows = sampler.rows_between(0, 1e9)
    assert len(rows) == 12
    powers = [r["power_w"] for r in rows]
    assert None in powers and any(p is not None for p in powers)
    assert any(r["energy_mj"] is None for r in rows)
    assert all(r["util_gpu_pct"] == 97 for r in rows)
    # resolve_gpus probed the temperature call once already: the fake fails it every time.
    assert all(r["temperature_c"] is None for r in rows)


def test_sampler_retention_bounds_memory(monkeypatch, clock):
    install(monkeypatch, [FakeGpu(uuid(0))], clock)
    sampler = Sampler(resolve_gpus("0"), interval_s=0.1, clock=clock, retention_s=10.0)
    sampler.run_inline(START_S + 60.0, clock.sleep)
    times = sampler.table().column("t_s").to_pylist()
    assert START_S + 60.0 - 11.0 - 0.2 <= times[0] <= START_S + 50.0
    assert len(times) <= 112


def test_sampler_reads_instantaneous_power_not_the_one_second_average(monkeypatch, clock):
    step_s = START_S + 3.0
    gpus = [FakeGpu(uuid(0), power=PowerTrace(100.0, [(step_s, 700.0)])),
            FakeGpu.pre_volta(uuid(1), power=PowerTrace(100.0, [(step_s, 700.0)]))]
    _, sampler, _ = rig(monkeypatch, clock, gpus, visible="0,1")
    sampler.run_inline(START_S + 6.0, clock.sleep)
    after = [r for r in sampler.rows_between(step_s + 0.15, step_s + 0.25)]
    assert {r["gpu_uuid"]: r["power_w"] for r in after} == {uuid(0): 700.0, uuid(1): 700.0}
    # The plain reading of a Hopper-like board would still show a blend here.
    assert FakeGpu(uuid(0), power=gpus[0].power).mean_power_mw(step_s + 0.2, 1.0) < 300_000


def test_sampler_stops_asking_for_unsupported_fields(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), energy_supported=False)
    fake = install(monkeypatch, [gpu], clock)
    sampler = Sampler(resolve_gpus("0"), clock=clock)
    calls = fake.calls.get("nvmlDeviceGetTotalEnergyConsumption", 0)
    for _ in range(5):
        sampler.sample_once()
    assert fake.calls.get("nvmlDeviceGetTotalEnergyConsumption", 0) == calls
    assert sampler.rows_between(0, 1e9)[0]["energy_mj"] is None


def test_slow_fields_every_nth_sample_keep_energy_and_power_at_full_rate(monkeypatch, clock):
    fake = install(monkeypatch, [FakeGpu(uuid(0))], clock)
    sampler = Sampler(resolve_gpus("0"), interval_s=0.1, clock=clock, policy=SamplingPolicy(slow_every=5))
    before = {k: fake.calls.get(k, 0) for k in ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTotalEnergyConsumption")}
    for _ in range(10):
        clock.sleep(0.1)
        sampler.sample_once()
    rows = sampler.rows_between(0, 1e9)
    assert all(r["energy_mj"] is not None and r["power_w"] is not None for r in rows)
    assert [r["memory_used_bytes"] is not None for r in rows] == [True, False, False, False, False] * 2
    assert fake.calls["nvmlDeviceGetMemoryInfo"] - before["nvmlDeviceGetMemoryInfo"] == 2
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] - before["nvmlDeviceGetTotalEnergyConsumption"] == 10
    with pytest.raises(ValueError, match="slow_every"):
        Sampler(resolve_gpus("0"), policy=SamplingPolicy(slow_every=0))


def test_energy_every_nth_sample_and_the_meter_still_measures_a_window(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace(100.0, [(START_S + 3.0, 400.0)]), update_phase_s=0.037)
    fake = install(monkeypatch, [gpu], clock)
    sampler = Sampler(resolve_gpus("0"), interval_s=0.1, clock=clock, policy=SamplingPolicy(energy_every=10))
    before = fake.calls.get("nvmlDeviceGetTotalEnergyConsumption", 0)
    for _ in range(20):
        clock.sleep(0.1)
        sampler.sample_once()
    rows = sampler.rows_between(0, 1e9)
    assert [r["energy_mj"] is not None for r in rows] == [True] + [False] * 9 + [True] + [False] * 9
    assert all(r["power_w"] is not None for r in rows)
    assert fake.calls["nvmlDeviceGetTotalEnergyConsumption"] - before == 2
    # The window's boundaries come from the meter's own reads: its energy stays right.
    meter = EnergyMeter(resolve_gpus("0"), sampler, clock=clock, sleep=clock.sleep, policy=INTERPOLATED)
    sampler.run_inline(START_S + 3.0, clock.sleep)
    meter.begin("w")
    sampler.run_inline(START_S + 15.0, clock.sleep)
    window = meter.end("w")
    assert window.energy_j == pytest.approx(400.0 * window.duration_s, rel=0.01)
    with pytest.raises(ValueError, match="energy_every"):
        Sampler(resolve_gpus("0"), policy=SamplingPolicy(energy_every=0))


def test_policy_picks_the_counters_driver_path_and_may_change_between_samples(monkeypatch, clock):
    fake = install(monkeypatch, [FakeGpu(uuid(0))], clock)

    def counter_calls() -> int:
        return fake.calls.get("nvmlDeviceGetTotalEnergyConsumption", 0)

    sampler = Sampler(resolve_gpus("0"), interval_s=0.1, clock=clock, policy=SamplingPolicy(energy_read="field"))
    before = counter_calls()
    clock.sleep(0.1)
    sampler.sample_once()
    row = sampler.rows_between(0, 1e9)[-1]
    assert counter_calls() == before  # read through the field-values API instead
    assert row["energy_mj"] == FakeGpu(uuid(0)).counter_mj(row["t_s"])  # the same counter
    sampler.policy = SamplingPolicy(energy_every=2)
    for _ in range(2):
        clock.sleep(0.1)
        sampler.sample_once()
    assert counter_calls() == before + 1
    assert [r["energy_mj"] is not None for r in sampler.rows_between(0, 1e9)] == [True, False, True]
    with pytest.raises(ValueError, match="energy_read"):
        SamplingPolicy(energy_read="ioctl")  # type: ignore[arg-type]


def test_sampler_thread_real_time(monkeypatch, caplog):
    crashing = FakeGpu(uuid(1), crash={"nvmlDeviceGetMemoryInfo": RuntimeError("bug in a reader")})
    install(monkeypatch, [FakeGpu(uuid(0), update_period_s=0.02), crashing], time.monotonic)
    sampler = Sampler(resolve_gpus("0"), interval_s=0.01)
    sampler.start()
    sampler.start()  # idempotent
    time.sleep(0.25)
    sampler.stop()
    sampler.stop()
    rows = sampler.rows_between(0, 1e12)
    assert 8 <= len(rows) <= 30
    times = [r["t_s"] for r in rows]
    assert times == sorted(times)

    # A bug (not an NVML error) in one sample is logged; the thread carries on.
    broken = Sampler(resolve_gpus("1"), interval_s=0.01)
    with caplog.at_level(logging.ERROR):
        broken.start()
        time.sleep(0.1)
        assert broken.running
        broken.stop()
    assert "telemetry sample failed" in caplog.text
    assert not broken.running


def test_meter_with_real_thread_and_clock(monkeypatch):
    install(monkeypatch, [FakeGpu(uuid(0), update_period_s=0.02)], time.monotonic)
    gpus = resolve_gpus("0")
    sampler = Sampler(gpus, interval_s=0.005)
    meter = EnergyMeter(gpus, sampler, policy=INTERPOLATED)
    sampler.start()
    try:
        meter.begin("w")
        time.sleep(0.3)
        w = meter.end("w")
    finally:
        sampler.stop()
    assert w.method == METHOD_INTERPOLATED
    assert w.energy_j == pytest.approx(300.0 * w.duration_s, abs=w.uncertainty_j)
    assert w.avg_power_w == pytest.approx(300.0, rel=0.05)


@pytest.mark.parametrize("n_gpus", [1, 8])
def test_sampler_per_sample_cost(monkeypatch, clock, n_gpus, capsys):
    """Measures the cost of one sample on the fake (no timing assertion)."""
    gpus = [FakeGpu(uuid(i)) for i in range(n_gpus)]
    fake = install(monkeypatch, gpus, clock)
    sampler = Sampler(resolve_gpus(), interval_s=0.1, clock=clock)
    n = 3000
    for _ in range(n):
        clock.sleep(0.001)
        sampler.sample_once()
    stats = sampler.stats()
    # The fake's own share: the same NVML calls made directly.
    handles = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(n_gpus)]
    t0 = time.perf_counter()
    for _ in range(n):
        for h in handles:
            fake.nvmlDeviceGetTotalEnergyConsumption(h)
            fake.nvmlDeviceGetFieldValues(h, [fake.NVML_FI_DEV_POWER_INSTANT])
            fake.nvmlDeviceGetUtilizationRates(h)
            fake.nvmlDeviceGetMemoryInfo(h)
            fake.nvmlDeviceGetClockInfo(h, fake.NVML_CLOCK_SM)
            fake.nvmlDeviceGetTemperatureV(h, fake.NVML_TEMPERATURE_GPU)
    fake_s = (time.perf_counter() - t0) / n
    with capsys.disabled():
        print(f"\n[sampler cost] {n_gpus} GPU(s): {stats.mean_sample_cost_s * 1e6:.1f} us/sample "
              f"(fake NVML's own calls {fake_s * 1e6:.1f} us, sampler overhead "
              f"{(stats.mean_sample_cost_s - fake_s) * 1e6:.1f} us); duty at 100 ms = "
              f"{stats.duty_fraction * 100:.4f}% of a core")
    assert stats.samples == n


# -- energy meter ------------------------------------------------------------------------------


def test_constant_power_interpolation_beats_raw_counter(monkeypatch, clock):
    """The interpolation alone, from the sampler's timeline (no reads of the meter's own)."""
    gpu = FakeGpu(uuid(0), power=PowerTrace.constant(300.0))
    _, sampler, meter = rig(monkeypatch, clock, [gpu], catch_updates=False)
    t0, t1 = START_S + 5.02, START_S + 15.08  # 20 ms and 80 ms after counter updates
    sampler.run_inline(t0, clock.sleep)
    meter.begin("w")
    sampler.run_inline(t1, clock.sleep)
    w = meter.end("w")

    true_j = 300.0 * (t1 - t0)
    raw_j = (gpu.counter_mj(t1) - gpu.counter_mj(t0)) / 1000
    assert (w.t_start_s, w.t_end_s) == (t0, t1)
    assert w.method == METHOD_INTERPOLATED
    assert w.energy_j == pytest.approx(true_j, abs=0.01)  # mJ rounding of the counter
    assert abs(raw_j - true_j) == pytest.approx(300.0 * 0.06, abs=0.01)
    assert abs(w.energy_j - true_j) < abs(raw_j - true_j) / 100
    assert abs(w.energy_j - true_j) <= w.uncertainty_j
    assert w.avg_power_w == pytest.approx(300.0, rel=1e-5)
    assert w.peak_power_w == pytest.approx(300.0)
    assert w.energy_j_per_gpu == {uuid(0): w.energy_j}
    # Worst case per boundary: P x (distance to the nearer update instant + half its
    # detection gap); instants sit 20 ms before the updates, 100 ms samples apart.
    assert w.uncertainty_j == pytest.approx(300.0 * math.hypot(0.04 + 0.05, 0.0 + 0.05), rel=1e-6)


def test_interpolation_beats_raw_counter_at_random_boundaries(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace.constant(450.0), update_phase_s=0.037)
    _, sampler, meter = rig(monkeypatch, clock, [gpu], interval_s=0.1, sample_phase_s=0.011,
                            catch_updates=False)
    rng = random.Random(7)
    t = START_S + 2.0
    for i in range(40):
        t0 = t + rng.uniform(0.0, 0.3)
        t1 = t0 + rng.uniform(1.0, 3.0)
        sampler.run_inline(t0, clock.sleep)
        meter.begin(f"w{i}")
        sampler.run_inline(t1, clock.sleep)
        w = meter.end(f"w{i}")
        true_j = 450.0 * (w.t_end_s - w.t_start_s)
        raw_err = abs((gpu.counter_mj(w.t_end_s) - gpu.counter_mj(w.t_start_s)) / 1000 - true_j)
        err = abs(w.energy_j - true_j)
        assert err <= max(raw_err, 0.002)
        assert err < 0.01
        t = clock() + 0.5


@pytest.mark.parametrize("catch_updates", [False, True])
@pytest.mark.parametrize("interval_s", [0.1, 0.05, 0.07, 0.13])
def test_uncertainty_covers_true_error_on_random_step_traces(monkeypatch, clock, interval_s, catch_updates):
    rng = random.Random(int(interval_s * 1000))
    steps = []
    t = START_S
    while t < START_S + 120:
        t += rng.uniform(0.02, 2.0)
        steps.append((t, rng.choice([70.0, 150.0, 400.0, 700.0])))
    gpu = FakeGpu(uuid(0), power=PowerTrace(100.0, steps), update_phase_s=rng.uniform(0, 0.1))
    _, sampler, meter = rig(monkeypatch, clock, [gpu], interval_s=interval_s,
                            sample_phase_s=rng.uniform(0, interval_s), catch_updates=catch_updates)
    worst = 0.0
    for i in range(60):
        t0 = clock() + rng.uniform(0.3, 1.0)
        t1 = t0 + rng.uniform(0.5, 4.0)
        sampler.run_inline(t0, clock.sleep)
        meter.begin(f"w{i}")
        sampler.run_inline(t1, clock.sleep)
        w = meter.end(f"w{i}")
        err = abs(w.energy_j - gpu.power.energy_between_j(w.t_start_s, w.t_end_s))
        assert w.method == METHOD_INTERPOLATED
        assert err <= w.uncertainty_j
        worst = max(worst, err / w.uncertainty_j)
    assert worst > 0.01  # the traces do exercise the boundaries


def test_intermittent_counter_failures_keep_interpolation(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace(250.0, [(START_S + 6.0, 650.0)]),
                  fail_every={"nvmlDeviceGetTotalEnergyConsumption": 3})
    _, sampler, meter = rig(monkeypatch, clock, [gpu], catch_updates=False)
    t0, t1 = START_S + 2.01, START_S + 9.09
    sampler.run_inline(t0, clock.sleep)
    meter.begin("w")
    sampler.run_inline(t1, clock.sleep)
    w = meter.end("w")
    assert w.method == METHOD_INTERPOLATED
    assert abs(w.energy_j - gpu.power.energy_between_j(t0, t1)) <= w.uncertainty_j


@pytest.mark.parametrize("jitter_s", [0.0, 0.004])
def test_actor_like_windows_quiet_boundaries(monkeypatch, clock, jitter_s):
    """Windows as the actor makes them: idle GPU, synchronize, work, synchronize, idle.

    Interpolating across a boundary smears the step in power that the boundary
    is; catching the nearest update and extrapolating on the quiet side does not.
    """
    rng = random.Random(11)
    trace = PowerTrace(120.0)
    gpu = FakeGpu(uuid(0), power=trace, update_phase_s=0.037, update_jitter_s=jitter_s)
    gpus, sampler, meter = rig(monkeypatch, clock, [gpu], quiet_boundaries=True)
    timeline_only = EnergyMeter(gpus, sampler, clock=clock, sleep=clock.sleep,
                                policy=SamplingPolicy(catch_updates=False, quiet_boundaries=False))
    sampler.run_inline(START_S + 2.0, clock.sleep)
    errors, interpolated, raw = [], [], []
    for i in range(40):
        sampler.run_inline(clock() + rng.uniform(0.3, 1.5), clock.sleep)  # idle between trials
        meter.begin(f"w{i}")
        end = clock() + rng.uniform(1.0, 6.0)
        while clock() < end:  # the work: power moves while it runs
            trace.then(clock(), rng.uniform(350.0, 700.0))
            sampler.run_inline(min(end, clock() + rng.uniform(0.01, 0.8)), clock.sleep)
        trace.then(clock(), 120.0)
        w = meter.end(f"w{i}")
        true_j = trace.energy_between_j(w.t_start_s, w.t_end_s)
        assert w.method == METHOD_INTERPOLATED
        assert 0 <= w.t_start_s - gpu.last_update_s(w.t_start_s) < 0.005  # begin waited for an update
        assert abs(w.energy_j - true_j) <= w.uncertainty_j
        errors.append(abs(w.energy_j - true_j))
        interpolated.append(abs(timeline_only.energy_between(w.t_start_s, w.t_end_s) - true_j))
        raw.append(abs((gpu.counter_mj(w.t_end_s) - gpu.counter_mj(w.t_start_s)) / 1000 - true_j))
    mean = statistics.fmean
    print(f"\n[actor-like windows, jitter {jitter_s * 1e3:.0f} ms] mean |error| J: quiet boundaries "
          f"{mean(errors):.2f}, timeline interpolation {mean(interpolated):.2f}, raw counter {mean(raw):.2f}")
    assert mean(errors) < mean(interpolated) / 3
    assert mean(errors) < mean(raw) / 3
    assert max(errors) < 0.5 + 700.0 * 2 * jitter_s


def test_step_power_trace(monkeypatch, clock):
    step_s = START_S + 8.0
    gpu = FakeGpu(uuid(0), power=PowerTrace(100.0, [(step_s, 400.0)]))
    _, sampler, meter = rig(monkeypatch, clock, [gpu], catch_updates=False)
    t0, t1 = START_S + 3.06, START_S + 14.04
    sampler.run_inline(t0, clock.sleep)
    meter.begin("w")
    sampler.run_inline(t1, clock.sleep)
    w = meter.end("w")
    true_j = 100.0 * (step_s - t0) + 400.0 * (t1 - step_s)
    # Update instants are placed to within half a sample gap (50 ms): with 100 W
    # at one end and 400 W at the other that leaves at most 300 W x 50 ms.
    assert abs(w.energy_j - true_j) <= 300.0 * 0.05 + 0.01
    assert abs(w.energy_j - true_j) <= w.uncertainty_j
    assert w.peak_power_w == pytest.approx(400.0)
    # The energy of each side of the step is placed where it belongs, to within an update.
    assert meter.energy_between(t0, step_s) == pytest.approx(100.0 * (step_s - t0), abs=400.0 * 0.1)
    assert meter.energy_between(step_s, t1) == pytest.approx(400.0 * (t1 - step_s), abs=400.0 * 0.1)


def test_phase_energies_over_a_partition_sum_to_the_window(monkeypatch, clock):
    rng = random.Random(3)
    steps = [(START_S + 2 + i * 0.37, rng.uniform(80, 700)) for i in range(60)]
    gpus = [FakeGpu(uuid(0), power=PowerTrace(120.0, steps)),
            FakeGpu(uuid(1), power=PowerTrace.constant(250.0), update_phase_s=0.05)]
    _, sampler, meter = rig(monkeypatch, clock, gpus, visible="0,1")
    t0, t1 = START_S + 3.013, START_S + 23.071
    sampler.run_inline(t0, clock.sleep)
    meter.begin("w")
    sampler.run_inline(t1, clock.sleep)
    w = meter.end("w")

    t0, t1 = w.t_start_s, w.t_end_s  # begin() waited for a counter update
    cuts = sorted([t0, t1] + [rng.uniform(t0, t1) for _ in range(120)])
    marks = [("prefill" if i % 2 == 0 else "decode", a, b) for i, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False))]
    phases = meter.phase_energy(marks)
    assert set(phases) == {"prefill", "decode"}
    assert phases["prefill"] + phases["decode"] == pytest.approx(w.energy_j, rel=1e-9)
    assert meter.energy_between(t0, t1) == pytest.approx(w.energy_j, rel=1e-12)
    assert sum(meter.energies_between(list(zip(cuts, cuts[1:], strict=False)))) == pytest.approx(w.energy_j, rel=1e-9)


def test_phase_energy_on_constant_power_is_power_times_time(monkeypatch, clock):
    _, sampler, meter = rig(monkeypatch, clock, [FakeGpu(uuid(0), power=PowerTrace.constant(350.0))])
    sampler.run_inline(START_S + 6.0, clock.sleep)
    # Phases far shorter than the counter's 100 ms update period still get P * t.
    marks = [("prefill", START_S + 3.0, START_S + 3.013), ("decode", START_S + 3.013, START_S + 3.5),
             ("prefill", START_S + 3.5, START_S + 3.52), ("decode", START_S + 3.52, START_S + 4.0)]
    phases = meter.phase_energy(marks)
    assert phases["prefill"] == pytest.approx(350.0 * 0.033, abs=0.01)
    assert phases["decode"] == pytest.approx(350.0 * 0.967, abs=0.01)


def test_idle_baseline(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace(62.0, [(START_S + 30.0, 500.0)]))
    _, sampler, meter = rig(monkeypatch, clock, [gpu], quiet_boundaries=True)
    sampler.run_inline(START_S + 1.0, clock.sleep)
    idle = meter.idle_baseline(2.0)
    assert idle.power_w == pytest.approx(62.0, rel=1e-3)  # update instants caught to about 1 ms
    assert idle.settled and idle.settle_s == pytest.approx(0.6, abs=0.05)  # two spans: nothing falling
    assert meter.last_idle_window.duration_s == pytest.approx(2.0)
    assert meter.last_idle_window.method == METHOD_INTERPOLATED


def _warmup_tail(t_end_s: float, busy_w: float = 530.0, rest_w: float = 72.5, tau_s: float = 0.8) -> list:
    """A warm-up ending at ``t_end_s``, then power decaying to rest (clocks and fans coming down),
    as 50 ms steps: what an H100 showed after a warm-up (first idle sample 530 W, 72.5 W at rest)."""
    import math

    return [(t_end_s + k * 0.05, rest_w + (busy_w - rest_w) * math.exp(-k * 0.05 / tau_s)) for k in range(200)]


def test_the_idle_baseline_waits_out_the_warmups_tail(monkeypatch, clock):
    warm_end = START_S + 2.0
    gpu = FakeGpu(uuid(0), power=PowerTrace(530.0, _warmup_tail(warm_end)))
    _, sampler, meter = rig(monkeypatch, clock, [gpu], quiet_boundaries=True)
    sampler.run_inline(warm_end, clock.sleep)
    # Without settling, the window would open on the tail: its mean is far above rest.
    true_rest_w = 72.5
    idle = meter.idle_baseline(2.0)
    assert idle.settled and 1.5 < idle.settle_s < 6.0, idle.settle_s
    # Settled to within the rule's 2 % per 0.3 s span: the residual tail is a few W, not 60+.
    assert idle.power_w == pytest.approx(true_rest_w, abs=4.0)
    window = meter.last_idle_window
    assert window.t_start_s >= warm_end + idle.settle_s - 1e-9
    # What the old rule (a window straight after the warm-up) read on the same trace:
    assert meter.energy_between(warm_end, warm_end + 2.0) / 2.0 > true_rest_w + 100.0


def test_a_gpu_still_cooling_at_the_cap_says_so(monkeypatch, clock):
    slow = _warmup_tail(START_S + 2.0, tau_s=3.0)  # still falling > 2 % per span at the 3 s cap
    gpu = FakeGpu(uuid(0), power=PowerTrace(530.0, slow))
    _, sampler, meter = rig(monkeypatch, clock, [gpu], quiet_boundaries=True)
    sampler.run_inline(START_S + 2.0, clock.sleep)
    idle = meter.idle_baseline(1.0, settle_max_s=3.0)
    assert not idle.settled and idle.settle_s == 3.0


def test_peak_is_one_reading_and_p99_is_not_dominated_by_it(monkeypatch, clock):
    # 400 W steady with one 100 ms spike to 900 W (a real transient or a bad read: one sample).
    gpu = FakeGpu(uuid(0), power=PowerTrace(400.0, [(START_S + 5.0, 900.0), (START_S + 5.1, 400.0)]))
    _, sampler, meter = rig(monkeypatch, clock, [gpu], catch_updates=False)
    sampler.run_inline(START_S + 2.0, clock.sleep)
    meter.begin("w")
    sampler.run_inline(START_S + 22.0, clock.sleep)  # 200 samples: one of them in the spike
    w = meter.end("w")
    assert w.peak_power_w == pytest.approx(900.0)
    assert w.p99_power_w == pytest.approx(400.0, abs=1.0)


def test_power_integral_fallback_without_counter(monkeypatch, clock):
    gpu = FakeGpu.pre_volta(uuid(0), power=PowerTrace(200.0, [(START_S + 5.0, 300.0)]))
    _, sampler, meter = rig(monkeypatch, clock, [gpu])
    t0, t1 = START_S + 2.05, START_S + 9.05
    sampler.run_inline(t0, clock.sleep)
    meter.begin("w")
    sampler.run_inline(t1, clock.sleep)
    w = meter.end("w")
    assert w.method == METHOD_POWER
    true_j = gpu.power.energy_between_j(t0, t1)
    # Power reads lag the trace by up to one update; the integral still lands within a few per cent.
    assert w.energy_j == pytest.approx(true_j, rel=0.02)
    assert meter.energy_between(t0, t1) == pytest.approx(w.energy_j)


def test_raw_counter_fallback_when_the_timeline_does_not_bracket(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace.constant(300.0))
    install(monkeypatch, [gpu], clock)
    gpus = resolve_gpus("0")
    sampler = Sampler(gpus, clock=clock)  # never samples
    meter = EnergyMeter(gpus, sampler, clock=clock, sleep=clock.sleep, settle_timeout_s=0.0,
                        policy=SamplingPolicy(catch_updates=False, quiet_boundaries=False))
    clock.t_s = START_S + 1.02
    meter.begin("w")
    clock.t_s = START_S + 1.48
    w = meter.end("w")
    assert w.method == METHOD_COUNTER
    assert w.energy_j == pytest.approx(300.0 * 0.4)  # from 1.0 to 1.4: the last updates seen
    assert abs(w.energy_j - 300.0 * 0.46) <= w.uncertainty_j


def test_multi_gpu_sum_counts_a_duplicated_uuid_once(monkeypatch, clock):
    gpus = [FakeGpu(uuid(0), power=PowerTrace.constant(300.0)),
            FakeGpu(uuid(1), power=PowerTrace.constant(500.0), update_phase_s=0.04)]
    install(monkeypatch, gpus, clock)
    infos = resolve_gpus(f"0,1,{uuid(0)}")
    assert len(infos) == 2
    twice = infos + [infos[0]]
    sampler = Sampler(twice, clock=clock)
    meter = EnergyMeter(twice, sampler, clock=clock, sleep=clock.sleep, policy=INTERPOLATED)
    clock.t_s = START_S + 0.03
    sampler.sample_once()
    sampler.run_inline(START_S + 2.01, clock.sleep)
    meter.begin("w")
    sampler.run_inline(START_S + 7.09, clock.sleep)
    w = meter.end("w")
    rows = sampler.rows_between(START_S + 3.0, START_S + 4.0)
    assert [r["gpu_uuid"] for r in rows] == [uuid(0), uuid(1)] * (len(rows) // 2)
    assert set(w.energy_j_per_gpu) == {uuid(0), uuid(1)}
    assert w.energy_j_per_gpu[uuid(0)] == pytest.approx(300.0 * w.duration_s, abs=w.uncertainty_j)
    assert w.energy_j_per_gpu[uuid(1)] == pytest.approx(500.0 * w.duration_s, abs=w.uncertainty_j)
    assert w.energy_j == pytest.approx(800.0 * w.duration_s, rel=0.002)
    assert w.peak_power_w == pytest.approx(800.0)


def test_window_misuse_raises(monkeypatch, clock):
    _, _, meter = rig(monkeypatch, clock, [FakeGpu(uuid(0))])
    with pytest.raises(TelemetryError):
        meter.end("never")
    meter.begin("w")
    with pytest.raises(TelemetryError):
        meter.begin("w")


# -- RAPL ----------------------------------------------------------------------------------------


def make_domain(root, key, name, energy_uj, max_uj=262_143_328_850, nested_in=None):
    path = (root / nested_in / key) if nested_in else (root / key)
    path.mkdir(parents=True)
    (path / "name").write_text(name + "\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


def set_energy(path, energy_uj):
    (path / "energy_uj").write_text(f"{energy_uj}\n")


def test_rapl_sums_sockets_dram_and_wraps(tmp_path):
    max_uj = 1_000_000_000
    p0 = make_domain(tmp_path, "intel-rapl:0", "package-0", max_uj - 2_000_000, max_uj)
    make_domain(tmp_path, "intel-rapl:0:0", "core", 5, nested_in="intel-rapl:0")
    d0 = make_domain(tmp_path, "intel-rapl:0:1", "dram", 10_000_000, nested_in="intel-rapl:0")
    p1 = make_domain(tmp_path, "intel-rapl:1", "package-1", 50_000_000)
    d1 = make_domain(tmp_path, "intel-rapl:1:0", "dram", 70_000_000)  # listed at top level
    make_domain(tmp_path, "intel-rapl-mmio:0", "package-0", 1)  # the same package again: skipped
    rapl = RaplReader(tmp_path)
    assert rapl.available and rapl.reason is None
    a = rapl.read()
    set_energy(p0, 3_000_000)  # wrapped: 2 J to the top, then 3 J
    set_energy(p1, 60_000_000)
    set_energy(d0, 12_500_000)
    set_energy(d1, 71_000_000)
    cpu_j, dram_j = rapl.delta(a, rapl.read())
    assert cpu_j == pytest.approx(5.0 + 10.0)
    assert dram_j == pytest.approx(2.5 + 1.0)


def test_rapl_without_dram_and_without_domains(tmp_path):
    p0 = make_domain(tmp_path / "one", "intel-rapl:0", "package-0", 100)
    rapl = RaplReader(tmp_path / "one")
    a = rapl.read()
    set_energy(p0, 1_000_100)
    assert rapl.delta(a, rapl.read()) == (pytest.approx(1.0), None)

    (tmp_path / "empty").mkdir()
    none = RaplReader(tmp_path / "empty")
    assert not none.available and none.reason == "no intel-rapl domains"
    assert none.delta(none.read(), none.read()) == (None, None)
    missing = RaplReader(tmp_path / "absent")
    assert not missing.available and "no " in missing.reason


def test_rapl_unreadable_counter_gives_a_reason(tmp_path):
    p0 = make_domain(tmp_path, "intel-rapl:0", "package-0", 100)
    (p0 / "energy_uj").unlink()
    (p0 / "energy_uj").mkdir()  # unreadable as a file, whoever runs the test
    rapl = RaplReader(tmp_path)
    assert not rapl.available
    assert "energy_uj" in rapl.reason or "intel-rapl:0" in rapl.reason
    assert rapl.delta(RaplSnapshot(), RaplSnapshot()) == (None, None)


# -- facade ----------------------------------------------------------------------------------------


def open_telemetry(monkeypatch, clock, gpus, tmp_path, visible="0"):
    install(monkeypatch, gpus, clock)
    p0 = make_domain(tmp_path, "intel-rapl:0", "package-0", 1_000_000)
    tel = Telemetry.open(interval_s=0.1, clock=clock, cuda_visible_devices=visible, sleep=clock.sleep,
                         rapl_root=str(tmp_path))
    assert isinstance(tel, Telemetry) and tel.active
    clock.t_s = START_S + 0.03
    tel.sampler.sample_once()
    return tel, p0


def measured_trial(tel, clock, p0, *, iterations=12, iter_s=1.0, prefill_s=0.04):
    marks, bounds = [], []
    with tel.measure("trial") as handle:
        assert isinstance(handle, MeterReading)
        t = clock()
        for _ in range(iterations):
            start = t
            marks += [("prefill", start, start + prefill_s), ("decode", start + prefill_s, start + iter_s)]
            bounds.append((start, start + iter_s))
            t = start + iter_s
            tel.sampler.run_inline(t, clock.sleep)
        set_energy(p0, 1_000_000 + 42_000_000)
    return handle, marks, bounds


# The offline window's energy parts and the figures it takes from the same report, then the
# GPUs' (``actors.measure``): what a trial row holds of the telemetry.
TRIAL_COLUMNS = (*(spec.name for part in (Energy, PhaseEnergy, HostEnergy) for spec in part.specs()),
                 "energy_per_request_j", "iteration_energy_cv", "gpu_peak_memory_bytes", *GPU_COLUMNS)


def trial_energy_columns(tel, handle, *, idle_power_w, marks, output_tokens, requests, decode_tokens,
                         iteration_bounds):
    """The telemetry's typed report of the window, turned into result parts by the measurement
    method, as columns."""
    report = tel.report(handle, marks=marks, iteration_bounds=iteration_bounds)
    parts = window_energy_parts(report, idle_power_w=idle_power_w, output_tokens=output_tokens,
                                decode_tokens=decode_tokens)
    window = report.window if report is not None else None
    return {**{name: value for part in parts for name, value in part.items()},
            "energy_per_request_j": ratio(parts[0].energy_j, requests),
            "iteration_energy_cv": report.iteration_energy_cv if report is not None else None,
            "gpu_peak_memory_bytes": window_memory(window, None).gpu_peak_memory_bytes,
            **dataclasses.asdict(tel.environment())}


def test_telemetry_trial_columns(monkeypatch, clock, tmp_path):
    gpu = FakeGpu(uuid(0), name="NVIDIA H200", power=PowerTrace(60.0, [(START_S + 4.0, 500.0)]))
    tel, p0 = open_telemetry(monkeypatch, clock, [gpu], tmp_path)
    tel.sampler.run_inline(START_S + 1.0, clock.sleep)
    idle_w = tel.meter.idle_baseline(2.0).power_w
    tel.sampler.run_inline(START_S + 4.0, clock.sleep)
    handle, marks, bounds = measured_trial(tel, clock, p0)
    w = handle.window
    assert handle.cpu_energy_j == pytest.approx(42.0) and handle.dram_energy_j is None

    cols = trial_energy_columns(tel, handle, idle_power_w=idle_w, marks=marks, output_tokens=1200,
                             requests=12, decode_tokens=1188, iteration_bounds=bounds)
    assert tuple(cols) == TRIAL_COLUMNS
    assert cols["energy_j"] == pytest.approx(500.0 * w.duration_s, rel=1e-3)
    assert cols["energy_per_token_j"] == pytest.approx(cols["energy_j"] / 1200)
    assert cols["energy_per_request_j"] == pytest.approx(cols["energy_j"] / 12)
    assert cols["energy_per_token_uncertainty_j"] == pytest.approx(cols["energy_uncertainty_j"] / 1200)
    assert cols["p99_power_w"] == pytest.approx(500.0, rel=1e-3) and cols["peak_power_w"] == pytest.approx(500.0)
    assert 0 <= cols["iteration_energy_cv"] < 0.05  # steady 500 W iterations: under max_iteration_cv
    assert idle_w == pytest.approx(60.0, rel=1e-3)
    assert cols["active_energy_j"] == pytest.approx(cols["energy_j"] - 60.0 * w.duration_s, rel=1e-3)
    assert cols["prefill_energy_j"] + cols["decode_energy_j"] == pytest.approx(cols["energy_j"], abs=cols["energy_uncertainty_j"])
    # The marks tile the window: nothing lies between phases.
    assert cols["between_phases_energy_j"] == pytest.approx(0.0, abs=1e-9)
    # Inside a window, energy can shift between adjacent phases by up to P x half a
    # sample gap where the boundary's precise update meets the sampler's coarser ones.
    assert cols["prefill_energy_j"] == pytest.approx(500.0 * 0.04 * 12, abs=500.0 * 0.05)
    assert cols["decode_energy_per_token_j"] == pytest.approx(cols["decode_energy_j"] / 1188)
    assert cols["energy_method"] == METHOD_INTERPOLATED
    assert cols["cpu_energy_j"] == pytest.approx(42.0)
    assert cols["dram_energy_j"] is None
    assert cols["gpu_uuids"] == uuid(0) and cols["gpu_names"] == "NVIDIA H200"
    assert cols["gpu_power_limit_w"] == 700.0 and cols["driver_version"] == "580.95.05"
    assert "unstable" not in cols  # figures only: actors.stability judges them
    report = tel.report(handle, marks=marks, iteration_bounds=bounds)
    assert report is not None and report.window is handle.window and set(report.phase_energy_j) == {"prefill", "decode"}
    assert report.cpu_energy_j == cols["cpu_energy_j"] and report.iteration_energy_cv == cols["iteration_energy_cv"]
    assert trial_energy_columns(tel, handle, idle_power_w=idle_w, marks=marks, output_tokens=1200, requests=12,
                             decode_tokens=1188, iteration_bounds=bounds) == cols
    assert tel.environment() == MeteredGpus(gpu_uuids=uuid(0), gpu_names="NVIDIA H200", gpu_power_limit_w=700.0,
                                            driver_version="580.95.05")

    table = tel.timeline_table("t-1", w.t_start_s, w.t_end_s, marks=marks)
    assert table.column_names[0] == "trial_id" and table.column_names[-1] == "phase"
    assert set(table.column("trial_id").to_pylist()) == {"t-1"}
    assert set(table.column("phase").to_pylist()) <= {"prefill", "decode"}
    assert tel.timeline_table("t-1", w.t_start_s, w.t_end_s).column_names == ["trial_id", *TIMELINE_SCHEMA.names]
    tel.close()


def test_iteration_energy_spread_is_measured_and_noted_as_host_noise(monkeypatch, clock, tmp_path):
    from actors.stability import Verdict

    steps = [(START_S + 3.0 + i, 200.0 if i % 2 else 600.0) for i in range(20)]
    tel, p0 = open_telemetry(monkeypatch, clock, [FakeGpu(uuid(0), power=PowerTrace(100.0, steps))], tmp_path)
    tel.sampler.run_inline(START_S + 3.0, clock.sleep)
    handle, marks, bounds = measured_trial(tel, clock, p0, iterations=6)
    cols = trial_energy_columns(tel, handle, idle_power_w=None, marks=marks, output_tokens=60, requests=6,
                             decode_tokens=54, iteration_bounds=bounds)
    assert cols["iteration_energy_cv"] > 0.05
    verdict = Verdict()
    verdict.process_noise(0.05, throughput_cv=None, iterations=6, energy_cv=cols["iteration_energy_cv"])
    assert verdict.part().noisy_host is True and "energy CV" in verdict.part().noisy_host_reason
    assert verdict.part().unstable is False  # noise alone does not make the figures imprecise
    assert cols["active_energy_j"] is None


def test_measure_block_that_raises_leaves_no_open_window(monkeypatch, clock, tmp_path):
    tel, _ = open_telemetry(monkeypatch, clock, [FakeGpu(uuid(0))], tmp_path)
    tel.sampler.run_inline(START_S + 1.0, clock.sleep)
    with pytest.raises(ValueError), tel.measure("trial"):
        raise ValueError("generate failed")
    with tel.measure("trial") as handle:
        tel.sampler.run_inline(clock() + 1.0, clock.sleep)
    assert handle.window is not None


@pytest.mark.parametrize("how", ["init_fails", "no_gpus", "no_pynvml"])
def test_null_telemetry_reports_none_for_every_energy_column(monkeypatch, clock, how, caplog):
    if how == "no_pynvml":
        monkeypatch.setitem(sys.modules, "pynvml", None)
    else:
        install(monkeypatch, [FakeGpu(uuid(0))], clock,
                init_error=pynvml.NVMLError_DriverNotLoaded() if how == "init_fails" else None)
    with caplog.at_level(logging.INFO):
        tel = Telemetry.open(clock=clock, cuda_visible_devices="" if how == "no_gpus" else None)
    assert isinstance(tel, NullTelemetry) and not tel.active
    assert tel.reason and tel.reason in caplog.text
    tel.start()
    assert tel.idle_baseline(2.0) is None
    with tel.measure("trial") as handle:
        clock.sleep(12.5)
    assert handle.duration_s == pytest.approx(12.5)
    cols = trial_energy_columns(tel, handle, idle_power_w=None, marks=[("prefill", 0.0, 1.0)],
                             output_tokens=100, requests=1, decode_tokens=99,
                             iteration_bounds=[(0.0, 1.0)])
    assert tuple(cols) == TRIAL_COLUMNS
    assert all(cols[k] is None for k in TRIAL_COLUMNS)
    assert tel.report(handle, marks=[], iteration_bounds=[]) is None
    assert tel.environment() == MeteredGpus()
    table = tel.timeline_table("t", 0.0, 1.0)
    assert table.num_rows == 0 and table.column_names == ["trial_id", *TIMELINE_SCHEMA.names]
    assert isinstance(table, pa.Table)
    tel.close()


def test_both_telemetries_share_one_base_and_the_policy_reaches_sampler_and_meter(monkeypatch, clock, tmp_path):
    null = NullTelemetry(reason="test")
    assert isinstance(null, TelemetryBase)
    with pytest.raises(TelemetryError, match="test"):
        null.phase_energy([("prefill", 0.0, 1.0)])
    tel, _ = open_telemetry(monkeypatch, clock, [FakeGpu(uuid(0))], tmp_path)
    assert isinstance(tel, TelemetryBase)
    assert tel.policy == SamplingPolicy() == DEFAULT_POLICY
    sparse = SamplingPolicy(energy_every=10)
    tel.policy = sparse
    assert tel.sampler.policy is sparse and tel.meter.policy is sparse
    tel.close()


def test_unknown_visible_device_is_loud_not_null(monkeypatch, clock):
    install(monkeypatch, [FakeGpu(uuid(0))], clock)
    with pytest.raises(DeviceMappingError):
        Telemetry.open(clock=clock, cuda_visible_devices="3")


def test_importing_telemetry_loads_neither_torch_nor_pynvml():
    import subprocess

    code = ("import sys, actors.telemetry; "
            "assert 'torch' not in sys.modules and 'pynvml' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_window_starts_after_the_meters_own_reads(monkeypatch, clock):
    """Work begins when ``begin`` returns; the stamp must not precede the meter's slow reads.

    On an H200 a counter read takes ~4 ms: stamped before them, the window opened on
    idle time that the interpolated curve then filled with the work's power, and
    prefill + decode fell ~11 J short of the window (bench/energy.py --dump).
    """
    gpu = FakeGpu(uuid(0), power=PowerTrace.constant(120.0))
    install(monkeypatch, [gpu], clock, energy_read_s=0.004)
    infos = resolve_gpus("0")
    sampler = Sampler(infos, interval_s=0.1, clock=clock)
    meter = EnergyMeter(infos, sampler, clock=clock, sleep=clock.sleep, policy=SamplingPolicy(quiet_boundaries=True))
    clock.t_s = START_S + 0.03
    sampler.sample_once()
    sampler.run_inline(START_S + 3.0, clock.sleep)

    t0 = meter.begin("w")
    assert clock() == t0  # nothing between the stamp and the caller's work
    gpu.power.then(t0, 630.0)  # the work starts now...
    sampler.run_inline(t0 + 12.0, clock.sleep)
    t_work_end = clock()
    gpu.power.then(t_work_end, 120.0)  # ...and ends just before end()
    w = meter.end("w")

    marks, t = [], t0
    while t + 1.5 < t_work_end:
        marks += [("prefill", t, t + 0.1), ("decode", t + 0.1, t + 1.5)]
        t += 1.5
    marks += [("prefill", t, t + 0.1), ("decode", t + 0.1, t_work_end)]
    phases = meter.phase_energy(marks)
    true_j = gpu.power.energy_between_j(w.t_start_s, w.t_end_s)
    assert abs(w.energy_j - true_j) <= w.uncertainty_j
    assert abs(phases["prefill"] + phases["decode"] - w.energy_j) <= w.uncertainty_j


def test_iteration_blocks_merge_short_iterations_into_spans_of_min_s():
    from actors.telemetry.telemetry import iteration_blocks

    short = [(i * 0.2, (i + 1) * 0.2) for i in range(12)]  # 2.4 s of 0.2 s iterations
    blocks = iteration_blocks(short, 1.0)
    assert len(blocks) == 2 and blocks[0] == pytest.approx((0.0, 1.0, 5)) and blocks[1] == pytest.approx((1.0, 2.4, 7))
    long = [(0.0, 1.5), (1.5, 3.0), (3.0, 3.2)]
    assert iteration_blocks(long, 1.0) == [(0.0, 1.5, 1), (1.5, 3.2, 2)]  # the short remainder joins the last
    assert iteration_blocks([(0.0, 0.3)], 1.0) == [(0.0, 0.3, 1)]
    assert iteration_blocks([], 1.0) == []


def test_short_steady_iterations_are_not_flagged_for_the_counters_resolution(monkeypatch, clock, tmp_path):
    """0.2 s iterations (a prefill burst, then decode) repeat exactly, yet each one spans
    two counter updates: their per-iteration energies scatter by the meter's resolution,
    not the workload's. Judged over >= 1 s blocks they are steady; a real drift is still caught."""
    def trace(drift_w: float) -> PowerTrace:
        steps, t = [], START_S + 3.0
        for i in range(60):
            level = 300.0 + drift_w * (i // 10 % 2)  # every 2 s, the decode power moves by drift_w
            steps += [(t, 650.0), (t + 0.03, level)]
            t += 0.2
        return PowerTrace(100.0, steps)

    def energy_cv(drift_w: float) -> float:
        gpu = FakeGpu(uuid(0), power=trace(drift_w), update_phase_s=0.037)
        root = tmp_path / f"drift{drift_w:g}"
        root.mkdir()
        tel, p0 = open_telemetry(monkeypatch, clock, [gpu], root)
        tel.sampler.run_inline(START_S + 3.0, clock.sleep)
        handle, marks, bounds = measured_trial(tel, clock, p0, iterations=60, iter_s=0.2, prefill_s=0.03)
        cols = trial_energy_columns(tel, handle, idle_power_w=None, marks=marks, output_tokens=60, requests=60,
                                 decode_tokens=0, iteration_bounds=bounds)
        tel.close()
        return cols["iteration_energy_cv"]

    assert energy_cv(0.0) < 0.05  # under the default max_iteration_cv
    assert energy_cv(150.0) > 0.05


def test_steady_iterations_in_blocks_of_unequal_size_are_not_flagged(monkeypatch, clock, tmp_path):
    """17 steady 0.74 s iterations (the compiled 8B path at batch 1 on an H200) make blocks
    of 2, 2, ..., 3 iterations: compared whole, the last block's extra iteration alone
    read as CV 0.17. Judged per iteration, a steady trial is steady."""
    from actors.telemetry.telemetry import MIN_STABILITY_BLOCK_S, iteration_blocks

    iterations, iter_s, prefill_s = 17, 0.74, 0.02
    steps, t = [], START_S + 3.0
    for _ in range(iterations):
        steps += [(t, 650.0), (t + prefill_s, 410.0)]
        t += iter_s
    gpu = FakeGpu(uuid(0), power=PowerTrace(100.0, steps), update_phase_s=0.037)
    tel, p0 = open_telemetry(monkeypatch, clock, [gpu], tmp_path)
    tel.sampler.run_inline(START_S + 3.0, clock.sleep)
    handle, marks, bounds = measured_trial(tel, clock, p0, iterations=iterations, iter_s=iter_s, prefill_s=prefill_s)
    assert [n for _, _, n in iteration_blocks(bounds, MIN_STABILITY_BLOCK_S)][-1] == 3
    cols = trial_energy_columns(tel, handle, idle_power_w=None, marks=marks, output_tokens=iterations, requests=iterations,
                             decode_tokens=0, iteration_bounds=bounds)
    tel.close()
    assert cols["iteration_energy_cv"] < 0.05


@pytest.mark.parametrize("energy_every", [1, 10])
def test_phase_energy_with_sparse_counter_reads_follows_the_power_shape(monkeypatch, clock, energy_every):
    """Counter read every tick or every 10th (1 s): the window's total stays exact, and
    prefill/decode energies follow the sampled power between the sparse counter knots
    (a straight line there would give prefill its time share of the mean power)."""
    prefill_s, iter_s, iterations = 0.3, 1.0, 12
    trace = PowerTrace(100.0)
    gpu = FakeGpu(uuid(0), power=trace, update_phase_s=0.037, update_jitter_s=0.004)
    install(monkeypatch, [gpu], clock)
    sampler = Sampler(resolve_gpus("0"), interval_s=0.1, clock=clock, policy=SamplingPolicy(energy_every=energy_every))
    meter = EnergyMeter(resolve_gpus("0"), sampler, clock=clock, sleep=clock.sleep, policy=SamplingPolicy(quiet_boundaries=True))
    sampler.run_inline(START_S + 3.0, clock.sleep)
    t0 = meter.begin("w")
    marks = []
    for i in range(iterations):
        t = t0 + i * iter_s
        trace.then(t, 650.0)
        trace.then(t + prefill_s, 300.0)
        marks += [("prefill", t, t + prefill_s), ("decode", t + prefill_s, t + iter_s)]
    trace.then(t0 + iterations * iter_s, 100.0)
    sampler.run_inline(t0 + iterations * iter_s, clock.sleep)
    window = meter.end("w")
    phases = meter.phase_energy(marks)
    true_prefill, true_decode = iterations * prefill_s * 650.0, iterations * (iter_s - prefill_s) * 300.0
    assert window.energy_j == pytest.approx(true_prefill + true_decode, rel=0.01)
    assert phases["prefill"] + phases["decode"] == pytest.approx(window.energy_j, abs=window.uncertainty_j)
    if energy_every == 1:  # a knot every ~100 ms
        assert phases["prefill"] == pytest.approx(true_prefill, rel=0.08)
        assert phases["decode"] == pytest.approx(true_decode, rel=0.08)
    else:
        # A straight line between 1 s knots gives prefill its time share of the mean
        # power (about 1,460 J of 2,340). The power shape recovers most of the rest;
        # not all, because the instantaneous-power field itself trails the load by
        # about one counter update (the fake models it as the H200 showed).
        straight_j = window.energy_j * prefill_s / iter_s
        assert abs(phases["prefill"] - true_prefill) < 0.5 * abs(straight_j - true_prefill)
        assert phases["prefill"] == pytest.approx(true_prefill, rel=0.2)


def test_sparse_reads_place_an_update_within_one_update_period_of_the_read():
    from actors.telemetry.curves import COUNTER_UPDATE_MAX_S

    # Dense reads: the update sits between the two reads, as before.
    times, _, gaps = CounterCurve.update_instants([(10.00, 1000), (10.05, 1500)])
    assert times == [pytest.approx(10.025)] and gaps == [pytest.approx(0.05)]
    # Reads 1 s apart: the value read at 11.0 is the counter's last update, at most one
    # update period before the read; not somewhere in the middle of the second.
    times, _, gaps = CounterCurve.update_instants([(10.0, 1000), (11.0, 31000)])
    assert times == [pytest.approx(11.0 - COUNTER_UPDATE_MAX_S / 2)]
    assert gaps == [pytest.approx(COUNTER_UPDATE_MAX_S)]


def test_energy_between_generate_calls_is_its_own_column(monkeypatch, clock, tmp_path):
    """Host gaps between calls (vLLM's batch assembly, Python) hold energy no phase has:
    the three parts account for the window, within its uncertainty."""
    gpu = FakeGpu(uuid(0), power=PowerTrace(80.0, [(START_S + 4.0, 450.0)]))
    tel, p0 = open_telemetry(monkeypatch, clock, [gpu], tmp_path)
    tel.sampler.run_inline(START_S + 4.0, clock.sleep)
    marks, bounds = [], []
    with tel.measure("trial") as handle:
        t = clock()
        for _ in range(10):  # 0.9 s of work, then a 0.1 s gap, per call
            marks += [("prefill", t, t + 0.05), ("decode", t + 0.05, t + 0.9)]
            bounds.append((t, t + 0.9))
            t += 1.0
            tel.sampler.run_inline(t, clock.sleep)
    cols = trial_energy_columns(tel, handle, idle_power_w=None, marks=marks, output_tokens=100, requests=10,
                             decode_tokens=90, iteration_bounds=bounds)
    gap_j = cols["between_phases_energy_j"]
    assert gap_j == pytest.approx(450.0 * 0.1 * 10, rel=0.05)  # the trace is 450 W throughout the window
    total = cols["prefill_energy_j"] + cols["decode_energy_j"] + gap_j
    assert total == pytest.approx(cols["energy_j"], abs=cols["energy_uncertainty_j"] + 1e-6)
    assert cols["prefill_energy_j"] + cols["decode_energy_j"] < cols["energy_j"] - cols["energy_uncertainty_j"]
