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
the client's concurrency cap). An engine that sustains the offered rate holds a
count that wanders about a level; one that does not holds a count that grows,
and latency grows with the run's length. Two instants of a wandering count differ
by a few requests (their difference's standard deviation is sqrt(2) times the
count's, about sqrt(2 x mean outstanding) under Poisson arrivals), so the count is
judged by its trend. While requests arrive inside the steady window, either test
marks the run saturated:

- the trend: a least-squares line through ``outstanding`` over the window's span of
  arrivals (sampled on a grid of ``TREND_GRID`` points) rises by more than
  ``QUEUE_TREND_Z`` standard errors, and by a material amount (a slope of at least
  ``QUEUE_GROWTH_SHARE`` of the offered rate and ``MIN_QUEUE_GROWTH`` requests). The
  count is strongly autocorrelated, so the standard error counts independent
  stretches, not samples: a stationary count of requests each outstanding for S has
  an integrated autocorrelation time E[S^2] / (2 E[S]) (exact for Poisson arrivals
  to an engine with room), so a span D holds n = D / (E[S^2] / E[S]) independent
  stretches, and the line's rise across D has standard error
  ``spread x sqrt(12 / (n - 2))``, ``spread`` being the count's standard deviation
  about the line (over n - 2 degrees of freedom, as for n independent points, the
  line's two fitted parameters taken). S is each request's time in the engine (start to finish), not
  its time outstanding: a queue that grows lengthens the latter, which would hide
  the trend it measures. Below n = 2 the span is too short to tell a trend from a
  wander and the trend test says nothing. On the noop engine (1,000 seeds each: at
  half its capacity with 60 requests, fixed and natural lengths; at 1 % of it with
  42 natural-length requests) the rise in standard errors had a standard deviation
  of 1.0-1.07 and exceeded 3 on 0-0.4 % of the runs;
- the rate: the steady window's completions (achieved rate x duration) fall below
  the lower end of the two-sided 95 % Poisson interval (``SHORTFALL_ALPHA`` each
  side) of the arrivals the offered rate sends over the window, *and* more than
  ``RATE_SHORTFALL`` short of them. A stable engine's completions over a window are
  its arrivals, delayed: a Poisson count at the offered rate. The interval keeps a
  short window's noise from reading as a shortfall, the 10 % keeps a long window's
  trifle from counting. 95 %, not 99 %: 64 prompts at about 1.5 times the noop
  engine's capacity (sweeps/serving.yaml at 128 requests/s, seed 2) completed 42
  against the 99 % interval's lower end of 42, and on the light-load runs above the
  test flagged none at 95 % (completions track arrivals closer than a Poisson
  count). It catches an engine with room in its batch that admits the excess and
  slows every step instead of queueing it (vLLM at max_num_seqs 256 on an H100 at
  94 requests/s offered completed 74: its outstanding count rose by 49 across the
  window, 0.4 standard errors, the count bending as the batch filled).

Outstanding, not waiting: such an engine queues next to nothing. Near capacity
(the noop engine at 80 %) the trend test flags a few runs in a hundred: queueing
there lengthens the count's memory beyond a request's time in the engine, and a
run long enough to tell would have to be very long; a sweep over rates shows where
that begins. With every request sent at once (no arrivals inside the window) the
trend has nothing to judge: requests waiting behind a full engine as the window
opens mean it ran at capacity.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from actors.figures import percentiles
from actors.serving.records import ServedRequest, ServedRun
from sweeper.core.results import Latency, PrefixCacheUse

# Saturation (module docstring). A trend of requests outstanding counts when its rise across
# the window's arrivals exceeds this many standard errors...
QUEUE_TREND_Z = 3.0
# ...and is material: at least this share of the offered rate, and this many requests.
QUEUE_GROWTH_SHARE = 0.05
MIN_QUEUE_GROWTH = 2.0
# Points of the grid the trend is fitted on (requests outstanding sampled at each).
TREND_GRID = 4096
# A rate shortfall counts when the window's completions fall below the lower end of the
# Poisson interval (two-sided, 1 - 2 x this) of the arrivals offered over it, and short by more
# than RATE_SHORTFALL.
SHORTFALL_ALPHA = 0.025
RATE_SHORTFALL = 0.10


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

    def sample(self, times: np.ndarray) -> np.ndarray:
        """The value at each of ``times`` (0 before the first piece)."""
        k = np.searchsorted(self.times, times, side="right") - 1
        return np.where(k >= 0, self.values[np.maximum(k, 0)], 0.0) if self.times.size else np.zeros(len(times))

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


def window_output_tokens(run: ServedRun, window: SteadyWindow) -> int:
    """Output tokens of completed requests that came within the window (its start excluded)."""
    tokens = np.array([t for r in run.completed for t in r.token_times_s])
    return int(((tokens > window.t_start_s) & (tokens <= window.t_end_s)).sum())


def achieved_rate(run: ServedRun, window: SteadyWindow) -> float:
    """Requests completed per second at the window's token rate: its output tokens / its duration
    / the mean output tokens of a completed request. Robust to the window's edges, where a
    batch's requests finish within microseconds of each other, on either side."""
    mean_output = float(np.mean([r.output_tokens for r in run.completed]))
    return window_output_tokens(run, window) / window.duration_s / mean_output


@dataclass(frozen=True)
class QueueTrend:
    """The least-squares line through ``outstanding(t)`` over a span, and the noise its rise is
    judged against (module docstring)."""

    span_s: float  # the stretch of the steady window over which requests arrived
    slope_req_s: float  # requests outstanding gained per second, along the line
    spread: float  # the count's standard deviation about the line, in requests
    decorrelation_s: float  # E[S^2] / E[S] over the requests' times in the engine

    @property
    def growth(self) -> float:
        """The line's rise across the span, in requests."""
        return self.slope_req_s * self.span_s

    @property
    def stretches(self) -> float:
        """How many independent stretches the span holds: span / decorrelation."""
        if self.decorrelation_s <= 0:
            return math.inf
        return self.span_s / self.decorrelation_s

    @property
    def growth_se(self) -> float:
        """The rise's standard error were the count stationary: ``spread x sqrt(12 / (n - 2))``
        over n independent stretches (the OLS slope's, its residual variance over n - 2 degrees
        of freedom); inf with n <= 2, too short to tell a trend from a wander."""
        n = self.stretches
        if n <= 2:
            return math.inf
        return self.spread * math.sqrt(12.0 / (n - 2.0)) if math.isfinite(n) else 0.0

    @property
    def z(self) -> float:
        """The rise in standard errors (inf for a rise with no noise about it)."""
        se = self.growth_se
        if 0 < se < math.inf:
            return self.growth / se
        return math.inf if se == 0 and self.growth > 0 else 0.0


def queue_trend(run: ServedRun, t0_s: float, t1_s: float) -> QueueTrend:
    """Requests outstanding over [t0_s, t1_s], sampled on a fine grid, fitted with a line."""
    span = max(t1_s - t0_s, 0.0)
    times = t0_s + (np.arange(TREND_GRID) + 0.5) * (span / TREND_GRID)
    counts = outstanding(run.requests, run.t_end_s).sample(times)
    centred = times - times.mean()
    denominator = float((centred ** 2).sum())
    slope = float((centred * (counts - counts.mean())).sum() / denominator) if denominator > 0 else 0.0
    spread = float(np.std(counts - counts.mean() - slope * centred))
    lives = np.array([r.finish_s - r.start_s for r in run.completed
                      if r.finish_s is not None and r.start_s is not None])
    decorrelation = float((lives ** 2).mean() / lives.mean()) if lives.size and lives.mean() > 0 else 0.0
    return QueueTrend(span, slope, spread, decorrelation)


def poisson_lower(mean: float, alpha: float) -> int:
    """The lower end of a Poisson count's two-sided ``1 - 2 alpha`` interval: the smallest k
    with P(X <= k) > alpha, for X ~ Poisson(mean)."""
    if mean <= 0:
        return 0
    # Terms below 12 standard deviations under the mean add less than 1e-30: start there.
    k = max(0, math.floor(mean - 12.0 * math.sqrt(mean) - 12.0))
    log_mean, cdf = math.log(mean), 0.0
    while True:
        cdf += math.exp(k * log_mean - mean - math.lgamma(k + 1))
        if cdf > alpha:
            return k
        k += 1


@dataclass(frozen=True)
class RateShortfall:
    """The steady window's completions against the arrivals the offered rate sends over it."""

    offered_count: float  # offered rate x window duration
    achieved_count: float  # achieved rate x window duration (completions' worth of output tokens)
    lower: int  # the lower end of the offered count's Poisson interval (1 - 2 x SHORTFALL_ALPHA)

    @property
    def short(self) -> float:
        """The share by which the achieved count falls short of the offered one."""
        return 1.0 - self.achieved_count / self.offered_count if self.offered_count > 0 else 0.0

    @property
    def significant(self) -> bool:
        return self.achieved_count < self.lower and self.short > RATE_SHORTFALL


@dataclass(frozen=True)
class Saturation:
    saturated: bool
    queue_growth: float  # the trend's rise across the window's arrivals, in requests (0 with none there)
    reason: str | None
    trend: QueueTrend | None = None  # None with no arrivals inside the window (every request sent at once)
    shortfall: RateShortfall | None = None  # None likewise, or without an achieved rate


def saturation(run: ServedRun, window: SteadyWindow, offered_rate_req_s: float,
               achieved_rate_req_s: float | None) -> Saturation:
    """Whether the engine kept up with the offered load (module docstring).

    While requests still arrive inside the window, either of two tests says it did
    not: requests outstanding trend upwards (the line's rise more than
    ``QUEUE_TREND_Z`` standard errors, at least ``QUEUE_GROWTH_SHARE`` of the offered
    rate and ``MIN_QUEUE_GROWTH`` requests), or the window's completions fall below the
    Poisson interval of the arrivals offered over it and more than ``RATE_SHORTFALL``
    short. With every request sent at once (no arrivals inside the window) requests
    waiting behind a full engine as the window opened mean it ran at capacity.
    """
    arrivals = [r.arrival_s for r in run.requests]
    a0, a1 = max(window.t_start_s, min(arrivals)), min(window.t_end_s, max(arrivals))
    if a1 <= a0:
        backlog = waiting(run.requests, run.t_end_s).at(window.t_start_s)
        reason = f"{backlog:g} requests waited behind a full engine as the steady window opened" if backlog else None
        if reason is not None and achieved_rate_req_s is not None and math.isfinite(offered_rate_req_s):
            reason = f"{reason}; achieved {achieved_rate_req_s:.3g} req/s against {offered_rate_req_s:.3g} offered"
        return Saturation(backlog > 0, 0.0, reason)
    trend = queue_trend(run, a0, a1)
    reasons = []
    if (trend.z > QUEUE_TREND_Z and trend.growth >= MIN_QUEUE_GROWTH
            and trend.slope_req_s >= QUEUE_GROWTH_SHARE * offered_rate_req_s):
        reasons.append(f"requests outstanding rose by {trend.growth:.3g} across the {trend.span_s:.3g} s of "
                       f"arrivals in the steady window (a trend of {trend.slope_req_s:.3g} req/s), "
                       f"{trend.z:.1f} times its standard error of {trend.growth_se:.3g} (spread about the trend "
                       f"{trend.spread:.3g} requests, decorrelation time {trend.decorrelation_s:.3g} s)")
    shortfall = None
    if achieved_rate_req_s is not None and math.isfinite(offered_rate_req_s):
        offered = offered_rate_req_s * window.duration_s
        shortfall = RateShortfall(offered, achieved_rate_req_s * window.duration_s,
                                  poisson_lower(offered, SHORTFALL_ALPHA))
        if shortfall.significant:
            reasons.append(f"the steady window completed {shortfall.achieved_count:.1f} requests' worth of "
                           f"{shortfall.offered_count:.1f} offered over it ({shortfall.short:.0%} short), below "
                           f"{shortfall.lower}, the lower end of the offered count's "
                           f"{1 - 2 * SHORTFALL_ALPHA:.0%} Poisson interval")
    reason = "; ".join(reasons) or None
    if reason is not None and achieved_rate_req_s is not None:
        reason = f"{reason}; achieved {achieved_rate_req_s:.3g} req/s against {offered_rate_req_s:.3g} offered"
    return Saturation(reason is not None, trend.growth, reason, trend, shortfall)


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


def served_latency(requests: Sequence[ServedRequest]) -> Latency:
    """Mean and percentiles over completed requests; ITL pooled over every gap of every request."""
    ok = [r for r in requests if r.ok]
    queue = [r.queue_s for r in ok if r.queue_s is not None]
    return Latency(**percentiles("ttft", [r.ttft_s for r in ok if r.ttft_s is not None]),
                   **percentiles("tpot", [r.tpot_s for r in ok if r.tpot_s is not None]),
                   **percentiles("itl", [g for r in ok for g in r.itl_s]),
                   **percentiles("e2e", [r.e2e_s for r in ok if r.e2e_s is not None]),
                   queue_s=float(np.mean(queue)) if queue else None)


def prefix_cache_use(requests: Sequence[ServedRequest]) -> PrefixCacheUse:
    """``prefix_cache_hit_rate``: of the prompt tokens of the completed requests whose engine said
    how many its prefix cache held, the share it held (vLLM's own hit rate, per request rather
    than per block); null where no request's was reported."""
    told = [r for r in requests if r.ok and r.cached_tokens is not None]
    prompt_tokens = sum(r.prompt_tokens for r in told)
    hit = sum(r.cached_tokens or 0 for r in told) / prompt_tokens if prompt_tokens else None
    return PrefixCacheUse(prefix_cache_hit_rate=hit)
