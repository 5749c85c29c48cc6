"""Cumulative-energy curves over samples: pure functions of the reads, no NVML, no threads.

NVML's total-energy counter (mJ since driver load) moves only at *update
instants*, about every 100 ms on H100/H200 (on an H200 here: median 100.0 ms,
4 ms standard deviation, 77-120 ms extremes). A raw read holds the energy up to
the last update, not up to the read.

``CounterCurve`` rebuilds one GPU's cumulative energy E(t) from every counter
read it is given, merged in time. An update instant is detected between the last
read that did not see it and the first that did (and, the counter moving every
~100 ms, no more than one update period before that read), and placed at the
middle of that interval. E(t) is linear between successive instants; where
instants are far apart (the counter read sparsely) it follows the integral of
sampled power instead. Any interval's energy is a difference of this one
function, so energies over a partition of an interval add up to the interval.

``PowerCurve`` is sampled power, linear between samples, with its exact
integral: the fallback where a GPU has no counter, and the shape of E(t) between
sparse counter reads.

Both curves also bound their own error at a point (``boundary_uncertainty_j``):
how far E(t) can be from the truth given the power nearby and how precisely the
knots around t are placed.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Iterable

# The counter's update period, at its longest seen (H200: median 100 ms, 77-120 ms).
# A read that sees the counter move holds the value of its *last* update, which came
# at most this long before the read, however long ago the previous read was.
COUNTER_UPDATE_MAX_S = 0.12
# Between knots further apart than this (sparse counter reads, SamplingPolicy.energy_every),
# E(t) follows the sampled power's shape rather than a straight line.
SHAPED_SEGMENT_S = 0.25


class CounterCurve:
    """One GPU's cumulative energy E(t) in J, between the counter's update instants.

    Knots are update instants, each placed at the middle of the interval it must
    lie in (``gap_s`` wide): after the last read that did not see it, before the
    first that did, and no more than ``COUNTER_UPDATE_MAX_S`` before that read;
    and anchors: window-boundary estimates the meter made and keeps, so that later
    intervals read the very function the window was computed from. Between knots
    E(t) is linear, except across segments longer than ``SHAPED_SEGMENT_S`` where
    a sampled ``power`` curve is given: there it follows the integral of power,
    scaled so the knots' energies still hold exactly.
    """

    def __init__(self, t_s: list[float], energy_j: list[float], gap_s: list[float],
                 is_anchor: list[bool] | None = None, power: PowerCurve | None = None) -> None:
        if len(t_s) < 2:
            raise ValueError("a counter curve needs at least two knots")
        self.t_s = t_s
        self.energy_j = energy_j
        self.gap_s = gap_s
        self.is_anchor = is_anchor or [False] * len(t_s)
        self.power = power
        real = [t for t, anchor in zip(t_s, self.is_anchor, strict=True) if not anchor]
        spacing = [b - a for a, b in itertools.pairwise(real)]
        self._update_period_s = statistics.median(spacing) if spacing else t_s[-1] - t_s[0]

    @staticmethod
    def update_instants(samples: Iterable[tuple[float, int | None]]) -> tuple[list[float], list[float], list[float]]:
        """(instant_s, energy_j, gap_s) for every counter change seen in time-ordered reads."""
        times: list[float] = []
        values: list[float] = []
        gaps: list[float] = []
        prev_t: float = -math.inf  # meaningful once prev_v is set: they are set together
        prev_v: int | None = None
        for t, v in samples:
            if v is None:
                continue
            if prev_v is not None and v > prev_v:
                lo = max(prev_t, t - COUNTER_UPDATE_MAX_S)
                instant = 0.5 * (lo + t)
                if times and instant <= times[-1]:  # equal stamps: keep the newer value
                    values[-1] = v / 1000.0
                else:
                    times.append(instant)
                    values.append(v / 1000.0)
                    gaps.append(t - lo)
            if prev_v is None or v >= prev_v:  # a lower value is a glitch, not progress
                prev_t, prev_v = t, v
        return times, values, gaps

    @classmethod
    def from_samples(cls, samples: Iterable[tuple[float, int | None]],
                     anchors: Iterable[tuple[float, float]] = (),
                     power: PowerCurve | None = None) -> CounterCurve | None:
        times, values, gaps = cls.update_instants(samples)
        if len(times) < 2:
            return None
        flags = [False] * len(times)
        for t, e in sorted(anchors):
            if not times[0] < t < times[-1]:
                continue  # an anchor only refines between update instants seen
            k = bisect.bisect_left(times, t)
            if times[k] == t:
                continue
            # Counters only grow: keep the anchor between its neighbours.
            e = min(max(e, values[k - 1]), values[k])
            times.insert(k, t)
            values.insert(k, e)
            gaps.insert(k, 0.0)
            flags.insert(k, True)
        return cls(times, values, gaps, flags, power)

    def covers(self, t: float) -> bool:
        return self.t_s[0] <= t <= self.t_s[-1]

    def _segment(self, t: float) -> int:
        k = bisect.bisect_right(self.t_s, t) - 1
        return min(max(k, 0), len(self.t_s) - 2)

    def _slope_w(self, k: int) -> float:
        return (self.energy_j[k + 1] - self.energy_j[k]) / (self.t_s[k + 1] - self.t_s[k])

    def at(self, t: float) -> float:
        """E(t) in J on the counter's scale; outside the knots, the nearest segment extends."""
        k = self._segment(t)
        a, b = self.t_s[k], self.t_s[k + 1]
        if self.power is not None and b - a > SHAPED_SEGMENT_S and a <= t <= b:
            p_a, p_b = self.power.at(a), self.power.at(b)
            if p_b > p_a:
                share = (self.power.at(t) - p_a) / (p_b - p_a)
                return self.energy_j[k] + (self.energy_j[k + 1] - self.energy_j[k]) * share
        return self.energy_j[k] + self._slope_w(k) * (t - a)

    def update_period_s(self) -> float:
        return self._update_period_s

    def power_near_w(self, t: float) -> float:
        k = self._segment(t)
        return max(self._slope_w(j) for j in (k - 1, k, k + 1) if 0 <= j <= len(self.t_s) - 2)

    def boundary_uncertainty_j(self, t: float) -> float:
        """Worst-case error of ``at(t)``: E(t) lies within P·d of either bracketing
        knot's value, d its distance from t, and so does the interpolation; each
        knot also sits up to half its detection gap from the true instant."""
        k = self._segment(t)
        before, after = t - self.t_s[k], self.t_s[k + 1] - t
        nearer, distance = (k, before) if before <= after else (k + 1, after)
        return self.power_near_w(t) * (max(distance, 0.0) + 0.5 * self.gap_s[nearer])

    def start_anchor(self, t: float, precise_s: float) -> tuple[float, float] | None:
        """E(t) for a window that starts at t on a quiet GPU: from the last update
        instant before t, at the power of the segment before that instant.
        None unless that instant is known to within ``precise_s``."""
        k = bisect.bisect_right(self.t_s, t) - 1
        if k < 1 or self.is_anchor[k] or self.gap_s[k] > precise_s or k + 1 >= len(self.t_s):
            return None
        outer_w = self._slope_w(k - 1)
        lead_s = t - self.t_s[k]
        energy_j = min(self.energy_j[k] + outer_w * lead_s, self.energy_j[k + 1])
        return energy_j, outer_w * lead_s + 0.5 * self.gap_s[k] * self.power_near_w(t)

    def end_anchor(self, t: float, precise_s: float) -> tuple[float, float] | None:
        """E(t) for a window that ends at t on a GPU left quiet: back from the first
        update instant after t, at the power of the segment after that instant."""
        k = bisect.bisect_left(self.t_s, t)
        if k < 1 or k + 1 >= len(self.t_s) or self.is_anchor[k] or self.gap_s[k] > precise_s:
            return None
        outer_w = self._slope_w(k)
        lag_s = self.t_s[k] - t
        energy_j = max(self.energy_j[k] - outer_w * lag_s, self.energy_j[k - 1])
        return energy_j, outer_w * lag_s + 0.5 * self.gap_s[k] * self.power_near_w(t)


class PowerCurve:
    """Sampled power, linear between samples and flat beyond them; integrates exactly."""

    def __init__(self, t_s: list[float], power_w: list[float]) -> None:
        if not t_s:
            raise ValueError("a power curve needs at least one sample")
        self.t_s = t_s
        self.power_w = power_w
        self._cumulative_j = [0.0]
        for k in range(1, len(t_s)):
            step = 0.5 * (power_w[k] + power_w[k - 1]) * (t_s[k] - t_s[k - 1])
            self._cumulative_j.append(self._cumulative_j[-1] + step)

    @classmethod
    def from_samples(cls, samples: Iterable[tuple[float, float | None]]) -> PowerCurve | None:
        times: list[float] = []
        powers: list[float] = []
        for t, p in samples:
            if p is None:
                continue
            if times and t <= times[-1]:
                powers[-1] = p
            else:
                times.append(t)
                powers.append(p)
        return cls(times, powers) if times else None

    def power_at_w(self, t: float) -> float:
        k = bisect.bisect_right(self.t_s, t) - 1
        if k < 0:
            return self.power_w[0]
        if k >= len(self.t_s) - 1:
            return self.power_w[-1]
        f = (t - self.t_s[k]) / (self.t_s[k + 1] - self.t_s[k])
        return self.power_w[k] + f * (self.power_w[k + 1] - self.power_w[k])

    def at(self, t: float) -> float:
        """Integral of power from the first sample to t, in J (negative before it)."""
        if t <= self.t_s[0]:
            return self.power_w[0] * (t - self.t_s[0])
        k = bisect.bisect_right(self.t_s, t) - 1
        if k >= len(self.t_s) - 1:
            return self._cumulative_j[-1] + self.power_w[-1] * (t - self.t_s[-1])
        return self._cumulative_j[k] + 0.5 * (self.power_w[k] + self.power_at_w(t)) * (t - self.t_s[k])

    def sample_gap_s(self, t: float) -> float:
        if len(self.t_s) < 2:
            return 0.0
        k = min(max(bisect.bisect_right(self.t_s, t) - 1, 0), len(self.t_s) - 2)
        return self.t_s[k + 1] - self.t_s[k]

    def boundary_uncertainty_j(self, t: float) -> float:
        return self.power_at_w(t) * self.sample_gap_s(t)
