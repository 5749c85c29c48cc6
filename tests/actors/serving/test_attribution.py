"""Per-request energy on the NVML simulator: the real sampler, meter and counter curve
over simulated GPUs, with answers computed by hand."""

from __future__ import annotations

import pytest

from actors.serving.attribution import request_energies, segments
from actors.serving.records import ServedRequest
from actors.telemetry import EnergyMeter, Sampler, SamplingPolicy, resolve_gpus
from tests.actors.telemetry.test_telemetry import install, uuid
from tests.fake_nvml import FakeClock, FakeGpu, PowerTrace

T0 = 1000.0

# A (8 prompt tokens) is scheduled at 0 and has tokens at 0.2, 0.3, 0.5; B (8 prompt
# tokens) is scheduled at 0.3 and has tokens at 0.5, 0.6, 0.7: the timeline of the noop
# backend's simulated engine with prefill_s 0.2 and step_s 0.1, B arriving at 0.25.
A = ServedRequest(0, 8, T0, T0, T0, (T0 + 0.2, T0 + 0.3, T0 + 0.5), T0 + 0.5)
B = ServedRequest(1, 8, T0 + 0.25, T0 + 0.3, T0 + 0.3, (T0 + 0.5, T0 + 0.6, T0 + 0.7), T0 + 0.7)


def meter_over(monkeypatch, trace: PowerTrace, t_end: float, every_s: float = 0.001) -> EnergyMeter:
    """The real meter on a simulated GPU, its timeline sampled every ``every_s`` from before
    T0 to past ``t_end`` (as the actor's sampler thread would, densely)."""
    clock = FakeClock(T0 - 1.0)
    install(monkeypatch, [FakeGpu(uuid(0), power=trace, update_period_s=0.1, update_phase_s=0.0)], clock)
    gpus = resolve_gpus("0")
    sampler = Sampler(gpus, interval_s=every_s, clock=clock)
    meter = EnergyMeter(gpus, sampler, clock=clock, sleep=clock.sleep, policy=SamplingPolicy(quiet_boundaries=False))
    while clock() < t_end + 1.0:
        sampler.sample_once()
        clock.sleep(every_s)
    return meter


def test_segments_spread_the_prompt_over_prefill_and_one_token_per_gap():
    bounds, weights = segments(A)
    assert bounds.tolist() == pytest.approx([T0, T0 + 0.2, T0 + 0.3, T0 + 0.5])
    assert weights.tolist() == [8.0, 1.0, 1.0]
    together = ServedRequest(2, 4, T0, T0, T0, (T0 + 0.1, T0 + 0.2, T0 + 0.2, T0 + 0.3), T0 + 0.3)
    bounds, weights = segments(together)
    assert weights.tolist() == [4.0, 2.0, 1.0]  # the token delivered with another joins its segment


def test_a_prefill_weighs_only_the_prompt_tokens_the_engine_computed(monkeypatch):
    # B's prompt held 6 of its 8 tokens in the prefix cache: its prefill processes 2.
    cached = ServedRequest(1, 8, T0 + 0.25, T0 + 0.3, T0 + 0.3, B.token_times_s, B.finish_s, cached_tokens=6)
    assert segments(cached)[1].tolist() == [2.0, 1.0, 1.0]
    meter = meter_over(monkeypatch, PowerTrace(100.0), T0 + 0.7)
    a, b = request_energies([A, cached], T0, T0 + 0.7, meter.energies_between)
    # [0.3, 0.5]: A 1 token, B 2 -> 20 J as 1:2 (uncached: 1:8, B's share 17.8 J).
    assert a == pytest.approx(30 + 20 / 3, abs=1e-3)
    assert b == pytest.approx(20 * 2 / 3 + 20, abs=1e-3)
    assert a + b == pytest.approx(meter.energy_between(T0, T0 + 0.7), rel=1e-9)


def test_each_request_s_prefill_part_is_its_share_of_its_prefill_slices(monkeypatch):
    from actors.serving.attribution import request_energy_split

    meter = meter_over(monkeypatch, PowerTrace(100.0), T0 + 0.7)
    a, b = request_energy_split([A, B], T0, T0 + 0.7, meter.energies_between)
    # A's prefill [0, 0.2] runs alone: 20 J. B's [0.3, 0.5] is shared 8:1 with A's decode.
    assert a.prefill_energy_j == pytest.approx(20.0, abs=1e-3)
    assert b.prefill_energy_j == pytest.approx(20 * 8 / 9, abs=1e-3)
    assert a.energy_j == pytest.approx(30 + 20 / 9, abs=1e-3)  # the whole, as request_energies gives it


def test_constant_power_splits_by_tokens_in_flight(monkeypatch):
    meter = meter_over(monkeypatch, PowerTrace(100.0), T0 + 0.7)
    a, b = request_energies([A, B], T0, T0 + 0.7, meter.energies_between)
    # [0, 0.3]: A alone, 30 J; [0.3, 0.5]: A 1 token, B 8 -> 20 J as 1:8; [0.5, 0.7]: B alone, 20 J.
    assert a == pytest.approx(30 + 20 / 9, abs=1e-3)
    assert b == pytest.approx(20 * 8 / 9 + 20, abs=1e-3)
    assert a + b == pytest.approx(meter.energy_between(T0, T0 + 0.7), rel=1e-9)


def test_power_steps_weigh_the_slices(monkeypatch):
    # 100 W until 0.3 s, then 400 W: the shared slice and B's decode cost four times as much.
    meter = meter_over(monkeypatch, PowerTrace(100.0, [(T0 + 0.3, 400.0)]), T0 + 0.7)
    a, b = request_energies([A, B], T0, T0 + 0.7, meter.energies_between)
    # Update instants are placed from reads 1 ms apart: each boundary within ~0.4 J.
    assert a == pytest.approx(30 + 80 / 9, abs=1.0)
    assert b == pytest.approx(80 * 8 / 9 + 80, abs=1.0)
    assert a + b == pytest.approx(meter.energy_between(T0, T0 + 0.7), rel=1e-9)


def test_idle_stretches_are_shared_by_tokens(monkeypatch):
    # C runs alone from 1.0 to 1.2 s after both: the idle 0.7-1.0 s (30 J at 100 W) is shared
    # by all three in proportion to their tokens (11 each: 8 prompt + 3 output).
    c = ServedRequest(2, 8, T0 + 1.0, T0 + 1.0, T0 + 1.0, (T0 + 1.1, T0 + 1.15, T0 + 1.2), T0 + 1.2)
    meter = meter_over(monkeypatch, PowerTrace(100.0), T0 + 1.2)
    a, b, c_j = request_energies([A, B, c], T0, T0 + 1.2, meter.energies_between)
    assert a == pytest.approx(30 + 20 / 9 + 10, abs=1e-3)
    assert c_j == pytest.approx(20 + 10, abs=1e-3)
    assert a + b + c_j == pytest.approx(120.0, abs=1e-3)


def test_a_request_that_never_ran_gets_nothing(monkeypatch):
    never = ServedRequest(3, 8, T0, None, None, (), None, error="not sent")
    meter = meter_over(monkeypatch, PowerTrace(100.0), T0 + 0.7)
    energies = request_energies([A, never, B], T0, T0 + 0.7, meter.energies_between)
    assert energies[1] == 0.0 and sum(energies) == pytest.approx(70.0, abs=1e-3)


def test_a_server_that_does_not_say_when_it_scheduled_splits_as_the_engine_that_does(monkeypatch):
    """The same engine timing seen in-process (the engine's scheduling stamp) and through an
    HTTP server (no stamp: the request's prefill begins when it was sent). Without queueing the
    two are the same request, and so are their energies and their prefill parts; with the
    server's first token taken for the prefill's start instead, the prompt was charged to the
    first decode interval."""
    from dataclasses import replace

    from actors.serving.attribution import request_energy_split

    meter = meter_over(monkeypatch, PowerTrace(100.0), T0 + 0.7)
    in_process = request_energy_split([A, B], T0, T0 + 0.7, meter.energies_between)
    # Sent as the engine took them (B: arrived at 0.25, sent and scheduled at 0.3).
    served = [replace(A, scheduled_s=None), replace(B, scheduled_s=None)]
    through_server = request_energy_split(served, T0, T0 + 0.7, meter.energies_between)
    for here, there in zip(in_process, through_server, strict=True):
        assert there.energy_j == pytest.approx(here.energy_j, abs=1e-6)
        assert there.prefill_energy_j == pytest.approx(here.prefill_energy_j, abs=1e-6)
    assert through_server[0].prefill_energy_j == pytest.approx(20.0, abs=1e-3)  # A's [0, 0.2] alone
    # Where the server queued B (sent at 0.25, scheduled unseen at 0.3), its prefill segment holds
    # the wait: its prefill part is the larger, and the two requests still sum to the run's energy.
    queued_b = replace(B, submit_s=B.arrival_s, scheduled_s=None)
    queued = request_energy_split([served[0], queued_b], T0, T0 + 0.7, meter.energies_between)
    assert queued[1].prefill_energy_j > in_process[1].prefill_energy_j
    assert sum(e.energy_j for e in queued) == pytest.approx(meter.energy_between(T0, T0 + 0.7), rel=1e-9)
    # The trial says which it was: where the share is exact, and where it is an upper bound.
    from actors.serving.attribution import prefill_from

    assert (prefill_from([A, B]), prefill_from(served), prefill_from([A, served[1]]), prefill_from([])) == (
        "scheduled", "sent", "mixed", None)
