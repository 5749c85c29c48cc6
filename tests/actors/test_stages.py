"""Stage timing inside the actor: exclusive spans, short stages folded, and the process's memory peak."""

from __future__ import annotations

import mmap

import pytest

from actors.host_memory import host_peak_bytes, reset_host_peak
from actors.stages import MIN_SPAN_S, StageClock, carve, stage
from sweeper.core.stages import STAGES, StageSpan, stage_seconds


class Clock:
    def __init__(self) -> None:
        self.now_s = 10.0

    def __call__(self) -> float:
        return self.now_s


def offsets(clock: StageClock, spans: list[StageSpan]) -> list[tuple[str, float, float]]:
    zero = clock._wall_at_zero
    return [(s.stage, round((s.started_at - zero).total_seconds(), 6), round(s.duration_s, 6)) for s in spans]


def test_a_nested_stage_pauses_the_one_around_it():
    t = Clock()
    clock = StageClock(clock=t)
    with clock.current(), stage("load"):
        t.now_s += 1
        with stage("materialize"):
            t.now_s += 2
        t.now_s += 0.5
    spans = clock.take()
    assert sorted(offsets(clock, spans)) == [("load", 10.0, 1.0), ("load", 13.0, 0.5), ("materialize", 11.0, 2.0)]
    assert stage_seconds(spans) == {"materialize": 2.0, "load": 1.5}  # registry order, exclusive
    assert clock.take() == []  # handed over once


def test_phases_timed_after_the_fact_are_carved_out_of_the_open_stage():
    t = Clock()
    clock = StageClock(clock=t)
    with clock.current(), stage("load"):
        t.now_s += 1
        with stage("materialize"):
            t.now_s += 2
        t.now_s += 10  # the engine starts: 13 .. 23; its log says where the time went
        carve("engine_start", 12.0, 15.0)  # clipped to the load's current piece (from 13)
        carve("weights", 15.0, 17.0)
        carve("cuda_graphs", 20.0, 30.0)  # clipped to now
        t.now_s += 1
    spans = clock.take()
    assert sorted(offsets(clock, spans)) == [
        ("cuda_graphs", 20.0, 3.0), ("engine_start", 13.0, 2.0), ("load", 10.0, 1.0), ("load", 17.0, 3.0),
        ("load", 23.0, 1.0), ("materialize", 11.0, 2.0), ("weights", 15.0, 2.0)]
    assert sum(s.duration_s for s in spans) == pytest.approx(14.0)  # exclusive: the whole load, once
    with pytest.raises(KeyError):
        carve("no-such-stage", 0.0, 1.0)


def test_a_stage_too_short_to_matter_counts_in_the_stage_around_it():
    t = Clock()
    clock = StageClock(clock=t)
    with clock.current(), stage("harness"):
        t.now_s += 1
        with stage("compile"):  # nothing to compile: microseconds
            t.now_s += MIN_SPAN_S / 10
        t.now_s += 1
    assert offsets(clock, clock.take()) == [("harness", 10.0, round(2 + MIN_SPAN_S / 10, 6))]


def test_marking_outside_a_clock_records_nothing_and_names_are_checked():
    with stage("load"):  # a backend used directly (benchmarks, tests): free
        pass
    with pytest.raises(KeyError, match="unknown stage 'lunch'"), stage("lunch"):
        pass
    with pytest.raises(KeyError):
        StageSpan("lunch", None, 1.0)  # type: ignore[arg-type]


def test_every_stage_has_a_scope_and_a_description():
    for s in STAGES.values():
        assert s.scope in ("group", "trial") and s.doc


def test_the_host_peak_resets_to_what_the_process_holds_now():
    if not reset_host_peak():
        pytest.skip("this kernel cannot reset the resident peak")
    before = host_peak_bytes()
    # 64 MiB of anonymous memory the test maps and unmaps itself: whether a freed bytearray
    # goes back to the kernel is the allocator's business (it did not, once, in a full run).
    block = mmap.mmap(-1, 64 << 20)
    for i in range(0, len(block), 4096):
        block[i] = 1  # touched: resident
    grown = host_peak_bytes()
    block.close()  # unmapped: no longer resident
    assert before is not None and grown is not None
    assert grown >= before + (60 << 20)
    assert reset_host_peak()
    after = host_peak_bytes()
    assert after is not None and after < grown - (32 << 20)  # the 64 MiB are gone from the new peak
