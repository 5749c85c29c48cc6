"""The client's own send lateness: the bound, the stretches it was behind, the steady window
cut clear of them, the trial's verdict (on the noop engine in virtual time, where a slow
send path is made on purpose), and the dispatcher and slots that keep a client on time."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from actors.backends.noop import NoopBackend, SimulatedEngine
from actors.serving.client import run_requests
from actors.serving.lateness import (
    LATENESS_FLOOR_S,
    behind_spans,
    clear_of,
    lateness_bound_s,
    send_lateness,
)
from actors.serving.records import InFlight, ServedRequest, ServingRequest
from actors.serving.schedule import play
from actors.serving.slots import SlotTimes
from actors.serving.stats import SteadyWindow
from tests.actors.serving.test_serving_trial import measure


def served(index: int, arrival_s: float, submit_s: float | None, due_s: float | None = None) -> ServedRequest:
    times = () if submit_s is None else (submit_s + 0.01, submit_s + 0.02)
    return ServedRequest(index, 8, arrival_s, submit_s, None, times, times[-1] if times else None,
                         None if times else "not sent: the run's time limit passed", due_s)


def test_the_bound_is_5_ms_or_a_tenth_of_ttft_p50_whichever_is_larger():
    assert lateness_bound_s(None) == LATENESS_FLOOR_S == 0.005
    assert lateness_bound_s(0.011) == 0.005
    assert lateness_bound_s(0.2) == pytest.approx(0.02)


def test_lateness_is_measured_from_when_a_request_was_due():
    assert served(0, 1.0, 1.003).send_lateness_s == pytest.approx(0.003)
    # Held back by max_concurrency until 1.5: due then, and sent on time.
    assert served(1, 1.0, 1.5005, due_s=1.5).send_lateness_s == pytest.approx(0.0005)
    assert served(2, 1.0, None).send_lateness_s is None


def test_the_steady_window_is_cut_to_its_longest_stretch_clear_of_the_client_being_behind():
    window = SteadyWindow(10.0, 20.0, level=4.0)
    assert clear_of(window, []) == window
    assert clear_of(window, [(13.0, 14.0)]) == SteadyWindow(14.0, 20.0, 4.0)
    assert clear_of(window, [(9.0, 11.0), (17.0, 25.0)]) == SteadyWindow(11.0, 17.0, 4.0)
    assert clear_of(window, [(9.0, 21.0)]) is None
    assert clear_of(None, [(1.0, 2.0)]) is None


def test_only_requests_later_than_the_bound_mark_the_client_behind():
    requests = [served(0, 1.0, 1.001), served(1, 2.0, 2.2), served(2, 3.0, None), served(3, 4.0, 4.5, due_s=4.499)]
    assert behind_spans(requests, 0.005) == [(2.0, 2.2)]


def test_a_late_run_is_flagged_with_its_figures_and_an_early_one_is_not():
    on_time = [served(i, float(i), i + 0.001) for i in range(100)]
    ok = send_lateness(on_time, SteadyWindow(10.0, 90.0, 1.0), 0.005, 0.02, 0.0)
    assert not ok.behind and ok.reason is None
    assert ok.run.count == 100 and ok.steady.count == 80
    assert ok.part().send_lateness_p99_s == pytest.approx(0.001)
    assert ok.part().client_behind is False
    late = on_time[:90] + [served(i, float(i), i + 0.3) for i in range(90, 100)]
    verdict = send_lateness(late, SteadyWindow(10.0, 85.0, 1.0), 0.005, 0.02, 5.0)
    assert verdict.behind and verdict.late == 10
    assert verdict.part(client_processes=2).send_lateness_max_s == pytest.approx(0.3)
    assert verdict.part(client_processes=2).client_processes == 2
    assert "send lateness p99 300 ms" in verdict.reason and "> 5 ms" in verdict.reason
    assert "TTFT p50 (20 ms)" in verdict.reason and "leaves out 5 s" in verdict.reason


class _SlowSubmit(SimulatedEngine):
    """A client whose every send costs ``submit_cost_s`` of its loop's time (virtual time)."""

    submit_cost_s = 0.01

    def submit(self, request, arrival_s, submit_s, due_s):
        super().submit(request, arrival_s, submit_s, due_s)
        self.sleep(self.submit_cost_s)


class _SlowClientNoop(NoopBackend):
    def serve(self, requests, *, max_concurrency, deadline_s, follow=None):
        engine = _SlowSubmit(self.options, self.clock, self.sleep)
        return run_requests(engine, requests, max_concurrency=max_concurrency, deadline_s=deadline_s,
                            clock=self.clock, follow=follow)


def test_a_client_that_keeps_its_schedule_is_not_flagged():
    row, requests = measure(20.0)
    assert row["send_lateness_max_s"] == 0.0 and row["steady_send_lateness_p99_s"] == 0.0
    assert row["client_behind"] is False and row["unstable"] is False
    assert row["send_lateness_bound_s"] == pytest.approx(max(0.005, 0.1 * row["ttft_p50_s"]))
    assert all(r.send_lateness_s == 0.0 for r in requests)


def test_a_client_too_slow_for_the_rate_is_flagged_and_the_window_leaves_it_out():
    # 150 requests/s asked of a client whose every send costs 10 ms (virtual time): it can send
    # 100 a second at most, and falls further behind with every request.
    row, requests = measure(150.0, {"max_batch": 64}, backend_class=_SlowClientNoop)
    assert row["client_behind"] is True and row["unstable"] is True
    assert "client behind: send lateness p99" in row["unstable_reason"]
    assert row["send_lateness_p99_s"] > row["send_lateness_bound_s"]
    # Nothing of the steady window is a stretch where the client was behind.
    late = [r for r in requests if r.send_lateness_s > row["send_lateness_bound_s"]]
    assert late
    if row["window_start_s"] is not None:
        for r in late:
            due = r.t_start_s - r.send_lateness_s
            assert r.t_start_s <= row["window_start_s"] or due >= row["window_end_s"]


def test_slots_are_due_when_the_slot_they_take_came_free():
    slots = SlotTimes(2)
    assert slots.due_s(1.0) is None and slots.due_s(1.0) is None  # free from the start
    slots.give_back(3.0)
    assert slots.due_s(1.0) == 3.0  # waited for the first release
    slots.give_back(4.0)
    assert slots.due_s(5.0) is None  # the slot was free before it arrived
    uncapped = SlotTimes(None)
    uncapped.give_back(9.0)
    assert uncapped.due_s(1.0) is None


def test_the_dispatcher_starts_each_request_only_when_it_is_due():
    """A run of 1,000 requests a second apart holds one task, not 1,000 created up front
    (which is what made the start-up burst), and the deadline cancels what is left."""
    started = []

    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        flights = [InFlight(ServingRequest(i, np.arange(4), 4, float(i)), t0 + i * 1.0) for i in range(1000)]

        async def send(flight):
            started.append(flight.request.index)
            flight.submit_s = loop.time()
            await asyncio.sleep(3600)

        await play(flights, send, max_concurrency=None, deadline_s=t0 + 0.2, clock=loop.time)
        return flights, len(asyncio.all_tasks())

    flights, left = asyncio.run(go())
    assert started == [0] and left == 1  # only the run's own task is left
    assert flights[0].submit_s is not None and all(f.submit_s is None for f in flights[1:])


def test_a_capped_run_records_when_each_request_became_due():
    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        flights = [InFlight(ServingRequest(i, np.arange(4), 4, 0.0), t0) for i in range(4)]

        async def send(flight):
            flight.submit_s = loop.time()
            await asyncio.sleep(0.05)

        await play(flights, send, max_concurrency=2, deadline_s=t0 + 5.0, clock=loop.time)
        return t0, flights

    t0, flights = asyncio.run(go())
    assert [f.due_s for f in flights[:2]] == [None, None]
    for f in flights[2:]:
        assert f.due_s is not None and f.due_s >= t0 + 0.05  # when one of the first two ended
        assert f.submit_s >= f.due_s


def test_a_send_that_raises_ends_the_run_with_its_exception():
    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        flights = [InFlight(ServingRequest(i, np.arange(4), 4, 0.0), t0 + 0.01 * i) for i in range(3)]

        async def send(flight):
            if flight.request.index == 1:
                raise ValueError("a bug in the send path")
            await asyncio.sleep(3600)

        await play(flights, send, max_concurrency=None, deadline_s=t0 + 60.0, clock=loop.time)

    with pytest.raises(ValueError, match="a bug in the send path"):
        asyncio.run(go())


def test_a_light_load_run_waits_for_its_last_request():
    """Each request done before the next is due (no request in flight between them): the run
    still ends only once the last one has."""
    async def go():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        flights = [InFlight(ServingRequest(i, np.arange(4), 4, 0.0), t0 + 0.03 * i) for i in range(4)]

        async def send(flight):
            flight.submit_s = loop.time()
            await asyncio.sleep(0.01)
            flight.finish_s = loop.time()

        await play(flights, send, max_concurrency=None, deadline_s=t0 + 60.0, clock=loop.time)
        return flights

    assert all(f.finish_s is not None for f in asyncio.run(go()))
