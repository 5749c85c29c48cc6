"""Serving statistics on recorded timestamps: percentiles, goodput, the steady window,
saturation; and the arrival process."""

from __future__ import annotations

import math

import numpy as np
import pytest

from actors.serving.arrivals import arrival_offsets
from actors.serving.records import ServedRequest, ServedRun
from actors.serving.stats import meets, running, served_latency, steady_window
from actors.serving_measure import serving_requests
from actors.workload import RandomSource
from sweeper.core.settings import ServingSettings


def served(index: int, submit: float, first: float, gap: float, n: int, *, arrival: float | None = None,
           scheduled: float | None = None, prompt: int = 8) -> ServedRequest:
    times = tuple(first + gap * k for k in range(n))
    return ServedRequest(index, prompt, submit if arrival is None else arrival, submit, scheduled, times, times[-1])


# Four requests sent at 0; first tokens at 0.1 .. 0.4 s; then 4 more tokens each,
# 10, 20, 30, 40 ms apart.
RECORDED = [served(i, 0.0, 0.1 * (i + 1), 0.01 * (i + 1), 5) for i in range(4)]


def test_percentiles_and_means_match_a_hand_computation():
    cols = dict(served_latency(RECORDED).items())
    assert cols["ttft_s"] == pytest.approx(0.25)
    # numpy's linear interpolation between order statistics: 0.1 + 0.5 * ... at rank 1.5 -> 0.25
    assert cols["ttft_p50_s"] == pytest.approx(0.25)
    assert cols["ttft_p90_s"] == pytest.approx(0.1 + 0.9 * 0.3)  # rank 2.7 of 3 gaps of 0.1
    assert cols["ttft_p99_s"] == pytest.approx(0.1 + 0.99 * 0.3)
    # TPOT = (e2e - ttft) / (n - 1) = the gap, here; ITL pools 4 gaps per request.
    assert cols["tpot_s"] == pytest.approx(0.025)
    assert cols["itl_s"] == pytest.approx(0.025)
    assert cols["itl_p50_s"] == pytest.approx(0.025)
    assert cols["e2e_s"] == pytest.approx(np.mean([0.1 * (i + 1) + 0.04 * (i + 1) for i in range(4)]))
    assert cols["queue_s"] is None  # the engine did not say when it scheduled them


def test_goodput_counts_requests_meeting_every_bound():
    bounds = {"ttft": 0.25, "tpot": 0.025}
    # request 0: ttft 0.1, tpot 0.01; 1: 0.2, 0.02; 2: 0.3 (too slow); 3: 0.4 (too slow)
    assert [meets(r, bounds) for r in RECORDED] == [True, True, False, False]
    assert [meets(r, {"e2e": 0.5}) for r in RECORDED] == [True, True, True, False]
    failed = ServedRequest(9, 8, 0.0, 0.0, None, (), None, error="boom")
    assert not meets(failed, {"e2e": 100.0})


def test_a_single_token_request_has_no_tpot_and_meets_a_tpot_bound():
    one = served(0, 0.0, 0.05, 0.0, 1)
    assert one.tpot_s is None and meets(one, {"tpot": 0.001})


def steady_run(n: int, every_s: float = 0.1, life_s: float = 1.0) -> ServedRun:
    """Requests scheduled every ``every_s``, each with ten tokens over ``life_s``."""
    step = life_s / 10
    reqs = [ServedRequest(i, 8, every_s * i, every_s * i, every_s * i,
                          tuple(every_s * i + step * (k + 1) for k in range(10)), every_s * i + life_s)
            for i in range(n)]
    return ServedRun(0.0, every_s * (n - 1) + life_s, tuple(reqs))


def test_the_steady_window_holds_admissions_and_completions_at_the_steady_level():
    # 30 requests, one every 0.1 s, each 1 s long: ten run at once from 0.9 s (the level)
    # to 3.0 s; the first completes at 1.0 s and the last first token comes at 3.0 s.
    run = steady_run(30)
    window = steady_window(run)
    assert window is not None
    assert window.level == 10
    assert window.t_start_s == pytest.approx(1.0)  # the first completion, after the level at 0.9
    assert window.t_end_s == pytest.approx(3.0)
    assert running(run.requests).mean(window.t_start_s, window.t_end_s) == pytest.approx(10, abs=0.5)


def test_a_run_shorter_than_a_request_life_at_the_level_has_no_steady_window():
    # Every request at once, all ten in one batch: none finishes while another is admitted.
    batch = ServedRun(0.0, 1.1, tuple(ServedRequest(i, 8, 0.0, 0.0, 0.0, tuple(0.1 * (k + 1) for k in range(10)), 1.0)
                                      for i in range(10)))
    assert steady_window(batch) is None
    assert steady_window(steady_run(30)) is not None


def test_arrivals_are_seeded_and_follow_their_process():
    a = arrival_offsets(2000, 10.0, "poisson", 1.0, seed=3)
    assert np.array_equal(a, arrival_offsets(2000, 10.0, "poisson", 1.0, seed=3))
    assert not np.array_equal(a, arrival_offsets(2000, 10.0, "poisson", 1.0, seed=4))
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(0.1, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.15)  # exponential: CV 1
    bursty = np.diff(arrival_offsets(2000, 10.0, "gamma", 0.25, seed=3))
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.2)  # gamma shape k: CV 1/sqrt(k)
    assert np.allclose(np.diff(arrival_offsets(5, 4.0, "constant", 1.0, seed=0)), 0.25)
    assert not arrival_offsets(7, math.inf, "poisson", 1.0, seed=0).any()


def test_duration_s_ends_the_arrivals():
    settings = ServingSettings(duration_s=2.0)
    source = RandomSource(vocab_size=100, input_len=4, output_len=2, seed=0)
    requests = serving_requests(settings, request_rate=50.0, source=source, seed=0)
    assert 60 < len(requests) < 140 and max(r.arrival_offset_s for r in requests) <= 2.0
    capped = serving_requests(ServingSettings(duration_s=2.0, num_prompts=10), request_rate=50.0,
                              source=source, seed=0)
    assert len(capped) == 10
