"""One idle baseline per loaded model: reused while the GPUs' temperature holds, taken
afresh when it moves or the baseline ages (NVML simulated; the telemetry is real)."""

from __future__ import annotations

import pytest

from actors.telemetry import BaselineReuse, NullTelemetry, Telemetry, trial_baseline
from sweeper.core.schema import trials_columns
from sweeper.core.settings import MeasureSettings
from tests.actors.telemetry.test_telemetry import START_S, install, uuid
from tests.fake_nvml import FakeClock, FakeGpu, PowerTrace

REUSE = BaselineReuse(max_delta_c=1.0, max_age_s=300.0)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START_S)


def telemetry(monkeypatch, clock, gpus: list[FakeGpu], visible: str = "0") -> Telemetry:
    install(monkeypatch, gpus, clock)
    tel = Telemetry.open(interval_s=0.1, clock=clock, cuda_visible_devices=visible, sleep=clock.sleep)
    assert isinstance(tel, Telemetry)
    clock.t_s = START_S + 0.03
    tel.sampler.sample_once()
    return tel


def busy(tel: Telemetry, clock: FakeClock, seconds: float) -> None:
    """A trial's work on the fake clock: the timeline keeps being sampled."""
    tel.sampler.run_inline(clock() + seconds, clock.sleep)


def test_a_later_trial_at_the_same_temperature_reuses_the_baseline_and_waits_for_nothing(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace.constant(120.0), temperature_c=34)
    tel = telemetry(monkeypatch, clock, [gpu])
    first = tel.idle_baseline(2.0, REUSE)
    assert first is not None and not first.reused and first.age_s == 0.0
    assert first.power_w == pytest.approx(120.0, rel=1e-3) and first.temperatures_c == (34,)
    taken_s = clock() - START_S
    assert taken_s >= 2.0  # settling, then the 2 s window

    gpu.temperature_c = 35  # within 1 degree
    busy(tel, clock, 15.0)
    before = clock()
    second = tel.idle_baseline(2.0, REUSE)
    assert second is not None and second.reused
    assert clock() == before  # no settling, no window: the point of reusing
    assert second.power_w == first.power_w and second.window is first.window
    assert second.age_s == pytest.approx(before - first.taken_at_s)


def test_a_warmer_gpu_takes_a_fresh_baseline_that_later_trials_compare_with(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace(122.0), temperature_c=35)
    tel = telemetry(monkeypatch, clock, [gpu])
    first = tel.idle_baseline(2.0, REUSE)
    # The GPU warmed by 3 degrees and its loaded idle draws 2 W more (an H100 group's drift).
    gpu.temperature_c = 38
    busy(tel, clock, 10.0)
    gpu.power.then(clock(), 124.0)
    second = tel.idle_baseline(2.0, REUSE)
    assert second is not None and not second.reused and second.age_s == 0.0
    assert second.power_w == pytest.approx(124.0, rel=1e-3) and first is not None and first.power_w == pytest.approx(122.0, rel=1e-3)
    busy(tel, clock, 10.0)
    third = tel.idle_baseline(2.0, REUSE)  # still at 38: the fresh one stands
    assert third is not None and third.reused and third.power_w == second.power_w


def test_an_old_baseline_or_a_gpu_without_a_temperature_is_taken_afresh(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace.constant(100.0), temperature_c=40)
    tel = telemetry(monkeypatch, clock, [gpu])
    short = BaselineReuse(max_delta_c=1.0, max_age_s=30.0)
    tel.idle_baseline(1.0, short)
    busy(tel, clock, 31.0)
    aged = tel.idle_baseline(1.0, short)
    assert aged is not None and not aged.reused

    gpu.fail_every["nvmlDeviceGetTemperatureV"] = 1  # the driver stops answering
    busy(tel, clock, 200.0)  # no temperature left among the rows read back
    assert tel.temperatures_c() == (None,)
    unknown = tel.idle_baseline(1.0, REUSE)
    assert unknown is not None and not unknown.reused


def test_every_held_gpu_must_hold_its_temperature(monkeypatch, clock):
    gpus = [FakeGpu(uuid(0), temperature_c=50), FakeGpu(uuid(1), temperature_c=60)]
    tel = telemetry(monkeypatch, clock, gpus, visible="0,1")
    first = tel.idle_baseline(1.0, REUSE)
    assert first is not None and first.temperatures_c == (50, 60)
    gpus[1].temperature_c = 62  # one GPU of a tensor-parallel pair warmed
    busy(tel, clock, 5.0)
    assert not tel.idle_baseline(1.0, REUSE).reused  # type: ignore[union-attr]


def test_without_a_rule_every_trial_takes_its_own(monkeypatch, clock):
    tel = telemetry(monkeypatch, clock, [FakeGpu(uuid(0), temperature_c=40)])
    tel.idle_baseline(1.0)
    busy(tel, clock, 1.0)
    again = tel.idle_baseline(1.0)
    assert again is not None and not again.reused


def test_the_rule_comes_from_the_measure_block_and_stays_out_of_trial_ids():
    assert BaselineReuse.from_settings(MeasureSettings()) == BaselineReuse(max_delta_c=1.0, max_age_s=300.0)
    assert BaselineReuse.from_settings(MeasureSettings(idle_reuse_delta_c=None)) is None
    default, fresh = MeasureSettings(), MeasureSettings(idle_reuse_delta_c=None, idle_reuse_max_age_s=10)
    assert default.identity() == fresh.identity()
    assert "idle_reuse_delta_c" not in default.identity()


def test_trial_columns_say_whether_the_baseline_was_reused(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace.constant(90.0), temperature_c=45)
    tel = telemetry(monkeypatch, clock, [gpu])
    m = MeasureSettings(idle_s=1.0)
    baseline, cols = trial_baseline(tel, m)
    assert baseline is not None
    assert cols["idle_baseline_reused"] is False and cols["idle_baseline_age_s"] == 0.0
    assert cols["warm_temperature_c"] == 45.0 and cols["idle_settle_s"] == baseline.settle_s
    busy(tel, clock, 3.0)
    _, cols = trial_baseline(tel, m)
    assert cols["idle_baseline_reused"] is True and cols["idle_baseline_age_s"] > 3.0
    # Without GPUs nothing is measured and nothing is claimed.
    assert trial_baseline(NullTelemetry(reason="no GPU"), m) == (None, {
        "idle_settle_s": None, "idle_baseline_reused": None, "idle_baseline_age_s": None,
        "warm_temperature_c": None})
    assert set(cols) <= {c.name for c in trials_columns()}
