"""Energy over named windows and arbitrary intervals, from NVML's energy counter.

The method
----------
NVML's total-energy counter (mJ since driver load) and its power reading move
only at *update instants*, about every 100 ms on H100/H200. A raw read at a
window boundary therefore holds the energy up to the last update, not up to
"now": up to one update period of energy is misplaced at each end, a few per
cent of a one-second window.

From the sampler's timeline we rebuild, per GPU, the cumulative energy E(t):
an update instant is detected at the first sample whose counter differs from
the previous sample, and placed at the midpoint of those two samples (the
update happened somewhere between them). E(t) is linear between successive
update instants. Windows, phases and iterations are all differences of this
one function, so energies over a partition of a window add up to the window.

Uncertainty (``uncertainty_j``)
-------------------------------
At each boundary b the true E(b) lies between the counter values of the two
update instants that bracket b, and so does the interpolated value; each
instant is also only known to within half the sample gap it was detected in.
So the error at b is at most P_b · (T_b + g_b / 2), where T_b is the length of
the bracketing segment (one counter update period, longer if an update was
missed), g_b the detection gap of the nearer instant and P_b the largest
counter-derived power over the bracketing segment and its two neighbours.
Per-boundary terms of every GPU (2 per GPU) are independent, so
``uncertainty_j`` is their root-sum-square: a conservative half-width, since
each term is a worst case that linear interpolation rarely approaches.

Fallbacks, named in ``method``:
- ``nvml_counter``: the timeline does not bracket a boundary (too short, or no
  sampler): raw counter deltas, with P · (update period) per boundary.
- ``power_integral``: no counter (pre-Volta): trapezoidal integral of sampled
  power, with P · (sample gap) per boundary. This bounds only the boundary
  placement, not the power sensor's own sampling error.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from actors.telemetry.nvml import DeviceReader, GpuInfo, TelemetryError, unique_by_uuid
from actors.telemetry.sampler import ENERGY_MJ, GPU_UUID, POWER_W, T_S, Sampler

log = logging.getLogger(__name__)

METHOD_INTERPOLATED = "nvml_counter_interpolated"
METHOD_COUNTER = "nvml_counter"
METHOD_POWER = "power_integral"
# A window is only as good as its weakest GPU.
_METHOD_RANK = {METHOD_INTERPOLATED: 0, METHOD_COUNTER: 1, METHOD_POWER: 2}


def _no_sync() -> None:
    pass


@dataclass(frozen=True)
class EnergyWindow:
    name: str
    t_start_s: float
    t_end_s: float
    duration_s: float
    energy_j: float  # total over GPUs
    energy_j_per_gpu: dict[str, float]  # by uuid
    method: str
    uncertainty_j: float
    avg_power_w: float
    peak_power_w: float | None  # highest per-sample sum over GPUs within the window


# -- the energy curves ----------------------------------------------------------------


class CounterCurve:
    """One GPU's cumulative energy E(t) in J, linear between counter update instants."""

    def __init__(self, t_s: list[float], energy_j: list[float], detect_gap_s: list[float]) -> None:
        if len(t_s) < 2:
            raise ValueError("a counter curve needs at least two update instants")
        self.t_s = t_s
        self.energy_j = energy_j
        self.detect_gap_s = detect_gap_s

    @staticmethod
    def update_instants(samples: Iterable[tuple[float, int | None]]) -> tuple[list[float], list[float], list[float]]:
        """(instant_s, energy_j, detection_gap_s) for every counter change seen."""
        times: list[float] = []
        values: list[float] = []
        gaps: list[float] = []
        prev_t = prev_v = None
        for t, v in samples:
            if v is None:
                continue
            if prev_v is not None and v > prev_v:
                instant = 0.5 * (prev_t + t)
                if times and instant <= times[-1]:  # equal stamps: keep the newer value
                    values[-1] = v / 1000.0
                else:
                    times.append(instant)
                    values.append(v / 1000.0)
                    gaps.append(t - prev_t)
            if prev_v is None or v >= prev_v:  # a lower value is a glitch, not progress
                prev_t, prev_v = t, v
        return times, values, gaps

    @classmethod
    def from_samples(cls, samples: Iterable[tuple[float, int | None]]) -> CounterCurve | None:
        times, values, gaps = cls.update_instants(samples)
        return cls(times, values, gaps) if len(times) >= 2 else None

    def covers(self, t: float) -> bool:
        return self.t_s[0] <= t <= self.t_s[-1]

    def _segment(self, t: float) -> int:
        k = bisect.bisect_right(self.t_s, t) - 1
        return min(max(k, 0), len(self.t_s) - 2)

    def _slope_w(self, k: int) -> float:
        return (self.energy_j[k + 1] - self.energy_j[k]) / (self.t_s[k + 1] - self.t_s[k])

    def at(self, t: float) -> float:
        """E(t) in J on the counter's scale; outside the instants seen, the nearest segment extends."""
        k = self._segment(t)
        return self.energy_j[k] + self._slope_w(k) * (t - self.t_s[k])

    def update_period_s(self) -> float:
        return statistics.median(b - a for a, b in itertools.pairwise(self.t_s))

    def power_near_w(self, t: float) -> float:
        k = self._segment(t)
        return max(self._slope_w(j) for j in (k - 1, k, k + 1) if 0 <= j <= len(self.t_s) - 2)

    def boundary_uncertainty_j(self, t: float) -> float:
        k = self._segment(t)
        segment_s = self.t_s[k + 1] - self.t_s[k]
        nearer = k if t - self.t_s[k] <= self.t_s[k + 1] - t else k + 1
        return self.power_near_w(t) * (segment_s + 0.5 * self.detect_gap_s[nearer])


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


# -- the meter --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Open:
    t_s: float
    counters_mj: dict[str, int | None]


@dataclass(frozen=True)
class _GpuEstimate:
    energy_j: float
    method: str
    boundary_uncertainty_j: tuple[float, float]


class EnergyMeter:
    """Named energy windows on the GPUs a trial holds.

    ``sync`` is called before every clock read so that a boundary means "all
    device work issued so far is done". The meter waits (at most
    ``settle_timeout_s``) for the timeline to bracket each boundary with
    counter updates: before ``begin`` stamps t0 and after ``end`` stamps t1;
    that wait lies outside the window. When the sampler thread is not running,
    waits sample on the caller's thread, so a caller driving ``sample_once``
    with an injected ``clock``/``sleep`` gets the same behaviour, deterministically.
    """

    def __init__(self, gpus: list[GpuInfo], sampler: Sampler, sync: Callable[[], None] = _no_sync,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 settle_timeout_s: float | None = None) -> None:
        self.gpus = unique_by_uuid(gpus)
        sampled = {g.uuid for g in sampler.gpus}
        for g in self.gpus:
            if g.uuid not in sampled:
                log.warning("GPU %s is metered but not sampled: its windows fall back to raw counter deltas", g.uuid)
        self._sampler = sampler
        self._sync = sync
        self._clock = clock
        self._sleep = sleep
        self._readers = {g.uuid: DeviceReader(g) for g in self.gpus}
        interval = sampler.interval_s
        self.settle_timeout_s = settle_timeout_s if settle_timeout_s is not None else max(1.0, 10 * interval)
        # Timeline reach around an interval: enough to find the bracketing update.
        self._margin_s = max(2.0, 20 * interval)
        self._open: dict[str, _Open] = {}
        self.last_idle_window: EnergyWindow | None = None

    # -- windows ------------------------------------------------------------------------

    def begin(self, name: str) -> float:
        """Open window ``name``; returns its start t0 on the shared clock."""
        if name in self._open:
            raise TelemetryError(f"energy window {name!r} is already open")
        self._sync()
        if not self._wait_for(self._history_ready):
            log.warning("window %r: no counter update seen before it began; its start may be uncorrected", name)
        t0 = self._clock()
        self._open[name] = _Open(t0, self._read_counters())
        return t0

    def end(self, name: str) -> EnergyWindow:
        opened = self._open.pop(name, None)
        if opened is None:
            raise TelemetryError(f"energy window {name!r} was never begun")
        self._sync()
        t1 = self._clock()
        counters = self._read_counters()
        if not self._wait_for(lambda: self._future_ready(t1)):
            log.warning("window %r: no counter update seen after it ended; its end may be uncorrected", name)
        return self._window(name, opened.t_s, t1, opened.counters_mj, counters)

    def cancel(self, name: str) -> None:
        """Forget an open window (its block failed); unknown names are ignored."""
        self._open.pop(name, None)

    def idle_baseline(self, duration_s: float) -> float:
        """Idle power in W, summed over GPUs, over a quiet window of ``duration_s``."""
        name = "__idle_baseline__"
        self.begin(name)
        self._pause(duration_s)
        window = self.end(name)
        self.last_idle_window = window
        return window.avg_power_w

    # -- intervals ----------------------------------------------------------------------

    def energy_between(self, t0_s: float, t1_s: float) -> float:
        """J over [t0, t1] on every GPU, from the timeline (counter curve, else power integral)."""
        return sum(f(t1_s) - f(t0_s) for f in self._energy_functions(t0_s, t1_s))

    def energies_between(self, intervals: list[tuple[float, float]]) -> list[float]:
        """``energy_between`` for many intervals (e.g. iterations), reading the timeline once."""
        if not intervals:
            return []
        functions = self._energy_functions(min(a for a, _ in intervals), max(b for _, b in intervals))
        return [sum(f(b) - f(a) for f in functions) for a, b in intervals]

    def phase_energy(self, marks: list[tuple[str, float, float]]) -> dict[str, float]:
        """J per phase name, summed over all of that phase's (name, t0, t1) intervals."""
        energies = self.energies_between([(t0, t1) for _, t0, t1 in marks])
        out: dict[str, float] = {}
        for (phase, _, _), energy_j in zip(marks, energies, strict=True):
            out[phase] = out.get(phase, 0.0) + energy_j
        return out

    def _energy_functions(self, t0_s: float, t1_s: float) -> list[Callable[[float], float]]:
        counters, powers = self._series(t0_s - self._margin_s, t1_s + self._margin_s)
        functions = []
        for g in self.gpus:
            curve = CounterCurve.from_samples(counters[g.uuid]) if g.energy_counter_supported else None
            fallback = PowerCurve.from_samples(powers[g.uuid])
            best = curve or fallback
            if best is None:
                raise TelemetryError(f"GPU {g.uuid}: no counter updates and no power samples near [{t0_s}, {t1_s}]")
            functions.append(best.at)
        return functions

    # -- internals ----------------------------------------------------------------------

    def _read_counters(self) -> dict[str, int | None]:
        return {uuid: r.energy_mj() for uuid, r in self._readers.items()}

    def _series(self, t0_s: float, t1_s: float) -> tuple[dict[str, list], dict[str, list]]:
        counters: dict[str, list] = {g.uuid: [] for g in self.gpus}
        powers: dict[str, list] = {g.uuid: [] for g in self.gpus}
        for row in self._sampler.raw_rows(t0_s, t1_s):
            uuid = row[GPU_UUID]
            if uuid in counters:
                counters[uuid].append((row[T_S], row[ENERGY_MJ]))
                powers[uuid].append((row[T_S], row[POWER_W]))
        return counters, powers

    def _history_ready(self) -> bool:
        now = self._clock()
        counters, powers = self._series(now - self._margin_s, now)
        for g in self.gpus:
            if g.energy_counter_supported:
                if not CounterCurve.update_instants(counters[g.uuid])[0]:
                    return False
            elif not any(p is not None for _, p in powers[g.uuid]):
                return False
        return True

    def _future_ready(self, t_s: float) -> bool:
        counters, powers = self._series(t_s - self._margin_s, math.inf)
        for g in self.gpus:
            if g.energy_counter_supported:
                instants = CounterCurve.update_instants(counters[g.uuid])[0]
                if not instants or instants[-1] < t_s:
                    return False
            elif not any(t >= t_s and p is not None for t, p in powers[g.uuid]):
                return False
        return True

    def _pause(self, seconds: float) -> None:
        # Without the thread (tests, or a caller driving the sampler), keep the
        # timeline recording on this thread, on the thread's grid.
        if self._sampler.running:
            self._sleep(seconds)
        else:
            self._sampler.run_inline(self._clock() + seconds, self._sleep)

    def _wait_for(self, ready: Callable[[], bool]) -> bool:
        deadline = self._clock() + self.settle_timeout_s
        poll = self._sampler.interval_s / 4 if self._sampler.running else self._sampler.interval_s
        while not ready():
            if self._clock() >= deadline:
                return False
            self._pause(poll)
        return True

    def _window(self, name: str, t0: float, t1: float, raw0: dict[str, int | None],
                raw1: dict[str, int | None]) -> EnergyWindow:
        counters, powers = self._series(t0 - self._margin_s, t1 + self._margin_s)
        estimates = {
            g.uuid: self._estimate(g, t0, t1, raw0.get(g.uuid), raw1.get(g.uuid), counters[g.uuid], powers[g.uuid])
            for g in self.gpus
        }
        energy_j = sum(e.energy_j for e in estimates.values())
        duration_s = t1 - t0
        terms = [u for e in estimates.values() for u in e.boundary_uncertainty_j]
        return EnergyWindow(
            name=name, t_start_s=t0, t_end_s=t1, duration_s=duration_s,
            energy_j=energy_j,
            energy_j_per_gpu={uuid: e.energy_j for uuid, e in estimates.items()},
            method=max((e.method for e in estimates.values()), key=_METHOD_RANK.__getitem__,
                       default=METHOD_INTERPOLATED),
            uncertainty_j=math.sqrt(sum(u * u for u in terms)),
            avg_power_w=energy_j / duration_s if duration_s > 0 else 0.0,
            peak_power_w=self._peak_power_w(t0, t1),
        )

    def _estimate(self, gpu: GpuInfo, t0: float, t1: float, raw0: int | None, raw1: int | None,
                  counter_samples: list, power_samples: list) -> _GpuEstimate:
        curve = CounterCurve.from_samples(counter_samples) if gpu.energy_counter_supported else None
        power = PowerCurve.from_samples(power_samples)
        if curve is not None and curve.covers(t0) and curve.covers(t1):
            return _GpuEstimate(curve.at(t1) - curve.at(t0), METHOD_INTERPOLATED,
                                (curve.boundary_uncertainty_j(t0), curve.boundary_uncertainty_j(t1)))
        if raw0 is not None and raw1 is not None:
            energy_j = (raw1 - raw0) / 1000.0
            period_s = curve.update_period_s() if curve is not None else self._sampler.interval_s
            mean_w = energy_j / (t1 - t0) if t1 > t0 else 0.0

            def near_w(t: float) -> float:
                readings = [mean_w]
                if curve is not None:
                    readings.append(curve.power_near_w(t))
                if power is not None:
                    readings.append(power.power_at_w(t))
                return max(readings)

            return _GpuEstimate(energy_j, METHOD_COUNTER, (near_w(t0) * period_s, near_w(t1) * period_s))
        if power is None:
            raise TelemetryError(f"GPU {gpu.uuid}: no energy counter and no power samples for [{t0}, {t1}]")
        return _GpuEstimate(power.at(t1) - power.at(t0), METHOD_POWER,
                            (power.boundary_uncertainty_j(t0), power.boundary_uncertainty_j(t1)))

    def _peak_power_w(self, t0: float, t1: float) -> float | None:
        # Rows of one sample are consecutive, one per GPU; a GPU seen again starts the next sample.
        metered = {g.uuid for g in self.gpus}
        sums: list[float] = []
        seen: set[str] = set()
        for row in self._sampler.raw_rows(t0, t1):
            uuid = row[GPU_UUID]
            if uuid not in metered:
                continue
            if uuid in seen or not sums:
                seen.clear()
                sums.append(math.nan)
            seen.add(uuid)
            if row[POWER_W] is not None:
                sums[-1] = row[POWER_W] if math.isnan(sums[-1]) else sums[-1] + row[POWER_W]
        known = [s for s in sums if not math.isnan(s)]
        return max(known) if known else None
