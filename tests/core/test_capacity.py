"""The capacity search's policy (sweeper.core.capacity): what it probes next, what it reports,
when it says its answer is approximate. Pure functions of the probes, checked against known
knees; the simulated engine's knee is found in tests/actors/serving/test_capacity_knee.py."""

from __future__ import annotations

import math
import random

import pytest

from sweeper.core.capacity import (
    STRETCH,
    BoundedBy,
    LoadSearch,
    NextProbe,
    Probe,
    ProbeVerdict,
    capacity,
    next_probe,
)


def row(load: float, *, passes: bool, status: str = "ok", saturated: bool = False, n: int = 400,
        unstable: bool = False) -> dict:
    return {"trial_id": f"t{load:g}", "status": status, "slo_attainment": 1.0 if passes else 0.5,
            "saturated": saturated, "unstable": unstable, "unstable_reason": "window too short" if unstable else None,
            "n_requests": n, "energy_per_request_j": 2.0, "ttft_p99_s": 0.05}


def search_to_end(search: LoadSearch, holds, **row_options) -> list[Probe]:
    """Run the policy against a truth (``holds(load)``) until it has its answer."""
    probes: list[Probe] = []
    while (ask := next_probe(search, probes)) is not None:
        assert len(probes) < 100, "the search did not end"
        probes.append(Probe.from_row(search, ask.load, row(ask.load, passes=holds(ask.load), **row_options),
                                     ask.stretch))
    return probes


def test_it_starts_at_low_brackets_by_doubling_then_bisects_geometrically():
    search = LoadSearch(axis="request_rate", low=1, high=1000, resolution=0.05, attainment=0.99)
    probes = search_to_end(search, lambda load: load <= 50)
    loads = [p.load for p in probes]
    assert loads[:7] == [1, 2, 4, 8, 16, 32, 64]  # bracketing: each pass doubled
    assert loads[7] == pytest.approx(math.sqrt(32 * 64), rel=1e-5)  # bisection, in the middle of the bracket's log
    found = capacity(search, probes, {"capacity_id": "c"})
    assert found.bounded_by == BoundedBy.SLO and found.precise
    assert found.capacity_load <= 50 < found.fail_load
    assert found.fail_load / found.capacity_load <= 1.05
    assert found.capacity_req_s == found.capacity_load and found.n_probes == len(probes) <= search.max_probes()


def test_every_knee_in_the_range_is_bracketed_within_the_resolution_in_at_most_max_probes():
    rng = random.Random(0)
    for _ in range(200):
        low, high = rng.uniform(0.1, 10), rng.uniform(20, 5000)
        resolution = rng.choice([0.01, 0.05, 0.2])
        knee = math.exp(rng.uniform(math.log(low), math.log(high)))
        search = LoadSearch(axis="request_rate", low=low, high=high, resolution=resolution, attainment=0.99)
        probes = search_to_end(search, lambda load, knee=knee: load <= knee)
        found = capacity(search, probes, {})
        assert len(probes) <= search.max_probes()
        assert found.capacity_load <= knee < found.fail_load
        assert found.fail_load / found.capacity_load <= 1 + resolution


def test_a_concurrency_search_ends_on_adjacent_whole_numbers():
    search = LoadSearch(axis="max_concurrency", low=1, high=512, resolution=0.01, attainment=0.99)
    probes = search_to_end(search, lambda load: load <= 37)
    assert all(float(p.load).is_integer() for p in probes)
    found = capacity(search, probes, {})
    assert (found.capacity_load, found.fail_load) == (37, 38)
    assert found.capacity_concurrency == 37 and found.bounded_by == BoundedBy.SLO


def test_what_bounded_it_the_range_a_failure_or_the_engine():
    search = LoadSearch(axis="request_rate", low=2, high=100, attainment=0.99)
    top = capacity(search, search_to_end(search, lambda load: True), {})
    assert top.bounded_by == BoundedBy.HIGH and top.capacity_load == 100 and not top.precise
    bottom = capacity(search, search_to_end(search, lambda load: False), {})
    assert bottom.bounded_by == BoundedBy.LOW and bottom.capacity_load is None and bottom.capacity_req_s is None
    assert len(search_to_end(search, lambda load: False)) == 1  # nothing above a failing low is probed
    broken = search_to_end(search, lambda load: True, status="failed")
    assert len(broken) == 1 and broken[0].verdict is ProbeVerdict.FAILED
    assert capacity(search, broken, {}).bounded_by == BoundedBy.FAILED
    # The SLO held everywhere but the engine fell behind past 30: saturation bounded it.
    no_slo = LoadSearch(axis="request_rate", low=2, high=100)
    probes = []
    while (ask := next_probe(no_slo, probes)) is not None:
        probes.append(Probe.from_row(no_slo, ask.load, row(ask.load, passes=False, saturated=ask.load > 30)))
    assert capacity(no_slo, probes, {}).bounded_by == BoundedBy.SATURATION


def test_an_untrustworthy_knee_is_reported_approximate_not_precise():
    search = LoadSearch(axis="request_rate", low=1, high=64, attainment=0.99)
    # 50 requests cannot tell 99 % from 98 %: one late request is 2 %.
    short = capacity(search, search_to_end(search, lambda load: load <= 20, n=50), {})
    assert not short.precise and "raise workload.num_prompts to at least 100" in short.imprecise_reason
    shaky = capacity(search, search_to_end(search, lambda load: load <= 20, unstable=True), {})
    assert not shaky.precise and "unstable: window too short" in shaky.imprecise_reason
    # Past the knee, a probe flagged unstable because the engine fell behind is its verdict, not a doubt.
    probes: list[Probe] = []
    while (ask := next_probe(search, probes)) is not None:
        over = ask.load > 20
        probes.append(Probe.from_row(search, ask.load, row(ask.load, passes=not over, saturated=over, unstable=over)))
    assert capacity(search, probes, {}).precise and all(p.stretch == 1 for p in probes)


def test_a_few_requests_settle_a_verdict_no_one_request_could_turn():
    """The GPU case (2026-12-07, an eager server whose TPOT at any load exceeded the SLO's): 56
    requests at the range's low, none on time. One request more or less cannot make that a
    pass, so it is not measured again; one late request of 56 can, so that fail is."""
    search = LoadSearch(axis="request_rate", low=5, high=320, resolution=0.1, attainment=0.99)
    none_on_time = Probe.from_row(search, 5, {**row(5, passes=False, n=56), "slo_attainment": 0.0})
    assert none_on_time.trustworthy and next_probe(search, [none_on_time]) is None
    found = capacity(search, [none_on_time], {})
    assert found.bounded_by == BoundedBy.LOW and found.capacity_load is None
    one_late = Probe.from_row(search, 5, {**row(5, passes=False, n=56), "slo_attainment": 55 / 56})
    assert not one_late.trustworthy and next_probe(search, [one_late]) == NextProbe(5, STRETCH)
    all_on_time = Probe.from_row(search, 5, row(5, passes=True, n=56))
    assert not all_on_time.trustworthy  # a pass of 56 hangs on each of them
    assert Probe.from_row(search, 5, {**row(5, passes=False, n=100), "slo_attainment": 0.98}).trustworthy


def test_an_untrusted_probe_is_measured_again_for_longer_and_its_second_verdict_counts():
    """The GPU case: the first probe on a freshly started server is short and still settling
    (unstable) and misses the SLO; measured again for twice as long it holds, and the search goes
    on to the knee instead of reporting that nothing in the range held."""
    search = LoadSearch(axis="request_rate", low=10, high=320, resolution=0.1, attainment=0.99)
    probes: list[Probe] = []
    while (ask := next_probe(search, probes)) is not None:
        settling = not probes
        holds = ask.load <= 100 and not settling
        probes.append(Probe.from_row(search, ask.load, row(ask.load, passes=holds, unstable=settling), ask.stretch))
    assert [(p.load, p.stretch) for p in probes[:3]] == [(10, 1), (10, 2), (20, 1)]
    assert sum(p.stretch == 2 for p in probes) == 1  # a trusted probe is not measured again
    found = capacity(search, probes, {})
    assert found.bounded_by == BoundedBy.SLO and found.precise and found.capacity_load <= 100 < found.fail_load
    assert found.n_probes == len(probes) <= search.max_probes()
    # Still untrusted after its second, longer run: the answer says which probe and why.
    doubted = search_to_end(search, lambda load: False, unstable=True)
    assert [(p.load, p.stretch) for p in doubted] == [(10, 1), (10, 2)]
    low = capacity(search, doubted, {})
    assert low.bounded_by == BoundedBy.LOW and not low.precise
    assert low.imprecise_reason == "no load in the range held (the probe there, 10, is unstable: window too short)"


def test_the_policy_depends_only_on_the_probes_so_a_replay_asks_the_same_loads():
    search = LoadSearch(axis="request_rate", low=3, high=300, resolution=0.03, attainment=0.9)
    first = search_to_end(search, lambda load: load <= 77)
    replayed: list[Probe] = []
    for p in first:
        assert next_probe(search, replayed).load == p.load
        replayed.append(p)
    assert next_probe(search, replayed) is None


def test_a_configurations_gpu_seconds_hold_its_probes_and_the_one_load_they_ran_on():
    from datetime import datetime, timedelta, timezone

    search = LoadSearch(axis="request_rate", low=1, high=4, attainment=0.99)
    t0 = datetime(2026, 12, 7, tzinfo=timezone.utc)
    probes = [Probe.from_row(search, load, {**row(load, passes=True), "started_at": t0,
                                            "finished_at": t0 + timedelta(seconds=10), "load_s": 30.0,
                                            "tensor_parallel": 2})
              for load in (1, 2, 4)]
    # Three 10 s probes on two GPUs, and the one 30 s engine start they shared, on two GPUs.
    assert capacity(search, probes, {}).gpu_s == pytest.approx(3 * 10 * 2 + 30 * 2)
