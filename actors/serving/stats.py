"""Serving statistics from request timestamps alone: the steady-state window,
saturation, latency percentiles, goodput.

The steady-state window
-----------------------
A serving run ramps up (the engine's batch fills as requests arrive) and drains
(the last requests finish with fewer and fewer beside them); neither is what the
engine costs at the offered load. ``running(t)`` is the number of requests the
engine holds at t (scheduled, not finished). Its steady level L is its
time-weighted median over the run (at least 1). The window is where the engine
holds at least L *and* requests both enter and leave it:

- it opens at the later of the first moment ``running`` reaches L and the first
  request's completion;
- it closes at the earlier of the last moment ``running`` is still at L or above
  and the last request's first token.

At saturation the first bound of each pair is ML.ENERGY's rule (from the moment
the engine first holds its steady batch until the last full batch starts
finishing). The second keeps the window's mix of prefill and decode that of the
steady state: before the first completion the engine decodes only requests it
admitted (and prefilled) before the window, after the last first token it only
finishes requests, and a window cut there under-counts (or over-counts) prefill.
On an H100 serving 300 requests at once with a batch cap of 128 (2.3 batches),
the first pair alone read 12 % below the offline J/token at batch 128 by keeping
the first batch's decode without its prefill. A run shorter than one request's
life at the steady level has no such window: it is flagged.

Saturation
----------
``outstanding(t)`` counts requests that have arrived and not yet finished;
``waiting(t)`` those of them not yet started (queued in the engine, or held by
the client's concurrency cap). While requests arrive, an outstanding count that
grows by more than ``max(2, 5 %)`` of the requests means the engine could not
sustain the offered rate, and latency grows with the run's length. Outstanding,
not waiting: an engine with room in its batch admits the excess and slows every
step instead of queueing it (vLLM at max_num_seqs 256 on an H100 did: at 94
requests/s offered it completed 74, with next to nothing waiting). With every
request sent at once, requests waiting behind a full engine as the window opens
mean it ran at capacity. A run whose steady window completes at least 50
requests at a rate more than 15 % below the offered one is saturated too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from actors.measure import percentiles
from actors.serving.records import ServedRequest, ServedRun

# A queue that grows by more than this share of the run's requests (and by more than
# MIN_QUEUE_GROWTH requests) across the window means the offered rate was not sustained.
QUEUE_GROWTH_SHARE = 0.05
MIN_QUEUE_GROWTH = 2
# Or when the achieved rate falls this far short of the offered one, judged only over a
# window holding enough completions for the shortfall to be more than Poisson noise.
RATE_SHORTFALL = 0.15
MIN_RATE_COMPLETIONS = 50


@dataclass(frozen=True)
class Step:
    """A step function of time: ``values[i]`` holds over ``[times[i], times[i + 1])``."""

    times: np.ndarray
    values: np.ndarray

    @classmethod
    def count(cls, spans: Sequence[tuple[float, float]]) -> Step:
        """How many of the half-open spans [a, b) hold at each time."""
        events = sorted([(a, 1) for a, b in spans if b > a] + [(b, -1) for a, b in spans if b > a])
        times: list[float] = []
        values: list[int] = []
        level = 0
        for t, delta in events:
            level += delta
            if times and times[-1] == t:
                values[-1] = level
            else:
                times.append(t)
                values.append(level)
        return cls(np.array(times, dtype=float), np.array(values, dtype=float))

    def at(self, t: float) -> float:
        k = int(np.searchsorted(self.times, t, side="right")) - 1
        return float(self.values[k]) if k >= 0 else 0.0

    def durations(self, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
        """The value of each piece within [t0, t1] and how long it holds there."""
        if self.times.size == 0 or t1 <= t0:
            return np.zeros(0), np.zeros(0)
        edges = np.clip(np.append(self.times, math.inf), t0, t1)
        lengths = np.diff(edges)
        first = np.array([self.at(t0)]), np.array([max(min(self.times[0], t1) - t0, 0.0)])
        return np.concatenate([first[0], self.values]), np.concatenate([first[1], lengths])

    def mean(self, t0: float, t1: float) -> float | None:
        values, lengths = self.durations(t0, t1)
        total = lengths.sum()
        return float((values * lengths).sum() / total) if total > 0 else None

    def minimum(self, t0: float, t1: float) -> float | None:
        values, lengths = self.durations(t0, t1)
        held = values[lengths > 0]
        return float(held.min()) if held.size else None

    def weighted_median(self, t0: float, t1: float) -> float:
        values, lengths = self.durations(t0, t1)
        if lengths.sum() <= 0:
            return 0.0
        order = np.argsort(values, kind="stable")
        cumulative = np.cumsum(lengths[order])
        k = int(np.searchsorted(cumulative, cumulative[-1] / 2.0))
        return float(values[order][min(k, len(order) - 1)])


def running(requests: Sequence[ServedRequest]) -> Step:
    return Step.count([(r.start_s, r.finish_s) for r in requests
                       if r.start_s is not None and r.finish_s is not None])


def waiting(requests: Sequence[ServedRequest], t_end_s: float) -> Step:
    return Step.count([(r.arrival_s, r.start_s if r.start_s is not None else t_end_s) for r in requests])


def outstanding(requests: Sequence[ServedRequest], t_end_s: float) -> Step:
    """Requests that have arrived and not finished (the client's queue included)."""
    return Step.count([(r.arrival_s, r.finish_s if r.finish_s is not None else t_end_s) for r in requests])


def in_flight(requests: Sequence[ServedRequest], t_end_s: float) -> Step:
    return Step.count([(r.submit_s, r.finish_s if r.finish_s is not None else t_end_s)
                       for r in requests if r.submit_s is not None])


@dataclass(frozen=True)
class SteadyWindow:
    t_start_s: float
    t_end_s: float
    level: float  # the running count the window holds at or above (the steady batch)

    @property
    def duration_s(self) -> float:
        return self.t_end_s - self.t_start_s


def steady_window(run: ServedRun) -> SteadyWindow | None:
    """The run's steady-state window (module docstring), or None when there is none: nothing
    ran, or the run was shorter than one request's life at the steady level."""
    busy = running(run.completed)
    if busy.times.size == 0:
        return None
    t_first, t_last = float(busy.times[0]), float(busy.times[-1])
    level = max(1.0, busy.weighted_median(t_first, t_last))
    at_level = np.nonzero(busy.values >= level)[0]
    last = int(at_level[-1])
    # From the later of (the level reached, the first completion) to the earlier of (the
    # level's last stretch ending, the last first token): see the module docstring.
    first_done = min(r.finish_s for r in run.completed if r.finish_s is not None)
    last_admitted = max(r.first_token_s for r in run.completed if r.first_token_s is not None)
    start = max(float(busy.times[at_level[0]]), first_done)
    end = min(float(busy.times[last + 1]) if last + 1 < busy.times.size else t_last, last_admitted)
    return SteadyWindow(start, end, level) if end > start else None


@dataclass(frozen=True)
class Saturation:
    saturated: bool
    queue_growth: float  # requests outstanding at the end of the arrivals (within the window) less at its start
    reason: str | None


def saturation(run: ServedRun, window: SteadyWindow, offered_rate_req_s: float,
               achieved_rate_req_s: float | None) -> Saturation:
    """Whether the engine kept up with the offered load (module docstring).

    While requests still arrive inside the window, a queue that grows by more than
    ``max(MIN_QUEUE_GROWTH, QUEUE_GROWTH_SHARE x requests)`` means it did not. With
    every request sent at once (no arrivals inside the window) it means requests
    waited behind a full engine as the window opened: the engine ran at capacity.
    """
    arrivals = [r.arrival_s for r in run.requests]
    a0, a1 = max(window.t_start_s, min(arrivals)), min(window.t_end_s, max(arrivals))
    limit = max(MIN_QUEUE_GROWTH, QUEUE_GROWTH_SHARE * len(run.requests))
    if a1 > a0:
        held = outstanding(run.requests, run.t_end_s)
        growth = held.at(a1) - held.at(a0)
        completions = sum(1 for r in run.completed if r.finish_s is not None
                          and window.t_start_s < r.finish_s <= window.t_end_s)
        short = (achieved_rate_req_s is not None and completions >= MIN_RATE_COMPLETIONS
                 and achieved_rate_req_s < (1.0 - RATE_SHORTFALL) * offered_rate_req_s)
        saturated = growth > limit or short
        reason = None
        if growth > limit:
            reason = (f"requests outstanding grew by {growth:g} while they arrived in the steady window "
                      f"(more than {limit:g})")
        elif short:
            reason = f"the achieved rate fell more than {RATE_SHORTFALL:.0%} short of the offered rate"
    else:
        growth = 0.0
        backlog = waiting(run.requests, run.t_end_s).at(window.t_start_s)
        saturated = backlog > 0
        reason = f"{backlog:g} requests waited behind a full engine as the steady window opened" if saturated else None
    if saturated and achieved_rate_req_s is not None and not math.isinf(offered_rate_req_s):
        reason = f"{reason}; achieved {achieved_rate_req_s:.3g} req/s against {offered_rate_req_s:.3g} offered"
    return Saturation(saturated, growth, reason)


def meets(request: ServedRequest, bounds_s: dict[str, float]) -> bool:
    """Whether a request met every bound (ttft, tpot, e2e, in seconds). A request with one
    token has no TPOT, which then counts as 0 (vLLM's rule); a failed one meets none."""
    if not request.ok:
        return False
    measured = {"ttft": request.ttft_s, "tpot": request.tpot_s or 0.0, "e2e": request.e2e_s}
    for name, bound in bounds_s.items():
        value = measured[name]
        if value is None or value > bound:
            return False
    return True


def latency_columns(requests: Sequence[ServedRequest]) -> dict[str, Any]:
    """Mean and percentiles over completed requests; ITL pooled over every gap of every request."""
    ok = [r for r in requests if r.ok]
    cols: dict[str, Any] = {}
    cols.update(percentiles("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]))
    cols.update(percentiles("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]))
    cols.update(percentiles("itl", [g for r in ok for g in r.itl_s]))
    cols.update(percentiles("e2e", [r.e2e_s for r in ok if r.e2e_s is not None]))
    queue = [r.queue_s for r in ok if r.queue_s is not None]
    cols["queue_s"] = float(np.mean(queue)) if queue else None
    return cols
