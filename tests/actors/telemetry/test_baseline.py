"""One idle baseline per loaded model: kept while a short re-check of the settled power
agrees with it, taken afresh when the power has moved or the baseline has aged (NVML
simulated; the telemetry is real)."""

from __future__ import annotations

import pytest

from actors.telemetry import BaselineReuse, NullTelemetry, Telemetry, trial_baseline
from sweeper.core.results import Baseline
from sweeper.core.settings import MeasureSettings
from tests.actors.telemetry.test_telemetry import START_S, install, uuid
from tests.fake_nvml import FakeClock, FakeGpu, PowerTrace

REUSE = BaselineReuse(tolerance_w=1.0, max_age_s=300.0)


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


def busy(tel: Telemetry, clock: FakeClock, seconds: float, gpus: list[FakeGpu], power_w: float,
         idle_w: float) -> None:
    """A trial's work on the fake clock at ``power_w``, then idle at ``idle_w`` (the timeline
    keeps being sampled)."""
    for gpu in gpus:
        gpu.power.then(clock(), power_w)
    tel.sampler.run_inline(clock() + seconds, clock.sleep)
    for gpu in gpus:
        gpu.power.then(clock(), idle_w)


def test_a_later_trial_whose_recheck_agrees_keeps_the_baseline_and_skips_the_window(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace(120.0))
    tel = telemetry(monkeypatch, clock, [gpu])
    first = tel.idle_baseline(2.0, REUSE)
    assert first is not None and not first.reused and first.age_s == 0.0 and first.recheck_power_w is None
    assert first.power_w == pytest.approx(120.0, rel=1e-3)
    fresh_s = clock() - START_S
    assert fresh_s >= 2.6  # settling (two 0.3 s spans at least), then the 2 s window

    busy(tel, clock, 15.0, [gpu], 400.0, 120.6)  # settles 0.6 W higher: within 1 W
    before = clock()
    second = tel.idle_baseline(2.0, REUSE)
    assert second is not None and second.reused
    assert second.power_w == first.power_w and second.window is first.window
    assert second.recheck_power_w == pytest.approx(120.6, abs=0.05)
    assert second.age_s == pytest.approx(before - first.taken_at_s)
    assert clock() - before < fresh_s - 1.0  # settling and the 0.5 s re-check, no 2 s window


def test_a_moved_idle_power_takes_a_fresh_baseline_that_later_trials_are_checked_against(monkeypatch, clock):
    # The H100 case: a group's settled idle rose 2.5 W between two trials at one temperature.
    gpu = FakeGpu(uuid(0), power=PowerTrace(124.0))
    tel = telemetry(monkeypatch, clock, [gpu])
    first = tel.idle_baseline(2.0, REUSE)
    busy(tel, clock, 10.0, [gpu], 300.0, 126.5)
    second = tel.idle_baseline(2.0, REUSE)
    assert second is not None and not second.reused and second.age_s == 0.0
    assert first is not None and first.power_w == pytest.approx(124.0, rel=1e-3)
    assert second.power_w == pytest.approx(126.5, rel=1e-3)
    assert second.recheck_power_w == pytest.approx(126.5, abs=0.05)  # what the re-check saw
    busy(tel, clock, 10.0, [gpu], 300.0, 126.2)
    third = tel.idle_baseline(2.0, REUSE)  # checked against the new one: it stands
    assert third is not None and third.reused and third.power_w == second.power_w


def test_an_old_baseline_is_taken_afresh_without_a_recheck(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace(100.0))
    tel = telemetry(monkeypatch, clock, [gpu])
    short = BaselineReuse(tolerance_w=1.0, max_age_s=30.0)
    tel.idle_baseline(1.0, short)
    busy(tel, clock, 31.0, [gpu], 300.0, 100.0)
    aged = tel.idle_baseline(1.0, short)
    assert aged is not None and not aged.reused and aged.recheck_power_w is None


def test_the_tolerance_is_per_gpu_and_covers_their_sum(monkeypatch, clock):
    gpus = [FakeGpu(uuid(0), power=PowerTrace(100.0)), FakeGpu(uuid(1), power=PowerTrace(100.0))]
    tel = telemetry(monkeypatch, clock, gpus, visible="0,1")
    first = tel.idle_baseline(1.0, REUSE)
    assert first is not None and first.power_w == pytest.approx(200.0, rel=1e-3)
    busy(tel, clock, 5.0, gpus, 300.0, 100.8)  # +1.6 W in all: within 2 x 1 W
    assert tel.idle_baseline(1.0, REUSE).reused  # type: ignore[union-attr]
    busy(tel, clock, 5.0, gpus, 300.0, 101.5)  # +3 W: beyond
    assert not tel.idle_baseline(1.0, REUSE).reused  # type: ignore[union-attr]


def test_without_a_rule_every_trial_takes_its_own(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace(90.0))
    tel = telemetry(monkeypatch, clock, [gpu])
    tel.idle_baseline(1.0)
    busy(tel, clock, 1.0, [gpu], 200.0, 90.0)
    again = tel.idle_baseline(1.0)
    assert again is not None and not again.reused and again.recheck_power_w is None


def test_the_rule_comes_from_the_measure_block_and_stays_out_of_trial_ids():
    assert BaselineReuse.from_settings(MeasureSettings()) == BaselineReuse(tolerance_w=1.0, max_age_s=300.0)
    assert BaselineReuse.from_settings(MeasureSettings(idle_reuse_tolerance_w=None)) is None
    default, fresh = MeasureSettings(), MeasureSettings(idle_reuse_tolerance_w=None, idle_reuse_max_age_s=10)
    assert default.identity() == fresh.identity()
    assert "idle_reuse_tolerance_w" not in default.identity()


def test_trial_columns_say_whether_the_baseline_was_reused(monkeypatch, clock):
    gpu = FakeGpu(uuid(0), power=PowerTrace(90.0))
    tel = telemetry(monkeypatch, clock, [gpu])
    m = MeasureSettings(idle_s=1.0)
    baseline, part = trial_baseline(tel, m)
    assert baseline is not None
    assert part == Baseline(idle_power_w=baseline.power_w, idle_settle_s=baseline.settle_s,
                            idle_baseline_reused=False, idle_baseline_age_s=0.0, idle_recheck_power_w=None,
                            gpu_idle_power_w=[baseline.power_w])
    busy(tel, clock, 3.0, [gpu], 250.0, 90.0)
    _, part = trial_baseline(tel, m)
    assert part.idle_baseline_reused is True and part.idle_baseline_age_s > 3.0
    assert part.idle_recheck_power_w == pytest.approx(90.0, abs=0.05)
    assert part.idle_power_w == pytest.approx(90.0, abs=0.05)  # the group's, as re-checked
    # Without GPUs nothing is measured and nothing is claimed.
    assert trial_baseline(NullTelemetry(reason="no GPU"), m) == (None, Baseline())
