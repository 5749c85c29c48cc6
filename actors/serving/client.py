"""The client side of a serving run: send each request at its arrival time, collect what
the engine returns, give up at a deadline.

Engines that batch on their own thread (transformers' continuous-batching manager)
or step inside ``wait`` (the noop backend's simulated engine) implement
``SteppedEngine``; the loop here is then the same for both, single-threaded, with
an injectable clock so the simulated engine runs in virtual time in tests.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from typing import Protocol

from actors.serving.records import NOT_SENT, ServedRequest, ServedRun, ServingRequest, sort_by_index
from actors.serving.slots import SlotTimes

# What a client loop asks as a request finishes: the request that follows it (a conversation's
# next turn, ``actors.serving.conversations``; its arrival offset from the run's start, the
# second argument), or None.
Follow = Callable[[ServedRequest, float], "ServingRequest | None"]


class SteppedEngine(Protocol):
    def submit(self, request: ServingRequest, arrival_s: float, submit_s: float, due_s: float | None) -> None:
        """Hand a request to the engine (never blocks for long); ``due_s``: when it became due,
        where a concurrency slot came free after its arrival (``ServedRequest.due_s``)."""

    def wait(self, until_s: float) -> list[ServedRequest]:
        """Run or wait until ``until_s`` or until some requests finish, whichever is first;
        return the requests that finished (possibly none). It must not run past ``until_s``
        by more than its own clock's granularity: the next arrival is sent then, and a
        request sent late is the client's lateness (``ServedRequest.send_lateness_s``)."""

    def abandon(self, now_s: float) -> list[ServedRequest]:
        """Give up every request still in the engine (the run's deadline passed): each as
        it stands, with an error."""


def run_requests(engine: SteppedEngine, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
                 deadline_s: float, clock: Callable[[], float], follow: Follow | None = None) -> ServedRun:
    """Send ``requests`` at their arrival offsets from now, at most ``max_concurrency`` in
    flight (later arrivals wait, in order), until each has finished or ``deadline_s``
    (absolute) has passed; requests never sent by then are recorded with an error.
    ``follow``: asked as each request finishes, the request that follows it (a
    conversation's next turn, its offset from this run's start), or None."""
    # Pending requests by arrival: a heap, since a follow-up can arrive before requests queued earlier.
    pending = [(r.arrival_offset_s, r.index, r) for r in requests]
    heapq.heapify(pending)
    cap = max_concurrency if max_concurrency is not None else math.inf
    slots = SlotTimes(max_concurrency)
    done: list[ServedRequest] = []
    in_flight = 0
    t0 = clock()
    while pending or in_flight:
        now = clock()
        if now >= deadline_s:
            done += engine.abandon(now)
            done += [ServedRequest(r.index, r.prompt_tokens, t0 + r.arrival_offset_s, None, None, (), None,
                                   error=NOT_SENT) for _, _, r in pending]
            break
        while pending and in_flight < cap and t0 + pending[0][0] <= now:
            request = heapq.heappop(pending)[2]
            arrival_s = t0 + request.arrival_offset_s
            engine.submit(request, arrival_s, clock(), slots.due_s(arrival_s))
            in_flight += 1
        next_arrival = t0 + pending[0][0] if pending and in_flight < cap else math.inf
        finished = engine.wait(min(next_arrival, deadline_s))
        if finished:
            freed_s = clock()  # when this loop saw them end: their slots' release
            for served in finished:
                slots.give_back(freed_s)
                following = follow(served, t0) if follow is not None else None
                if following is not None:
                    heapq.heappush(pending, (following.arrival_offset_s, following.index, following))
        done += finished
        in_flight -= len(finished)
    ends = [r.finish_s for r in done if r.finish_s is not None]
    return ServedRun(t_start_s=t0, t_end_s=max(ends, default=clock()), requests=sort_by_index(done))
