"""Energy over named windows and arbitrary intervals, from NVML's energy counter.

The method
----------
NVML's total-energy counter (mJ since driver load) moves only at *update
instants*, about every 100 ms on H100/H200 (on an H200 here: median 100.0 ms,
4 ms standard deviation, 77-120 ms extremes). A raw read at a window boundary
holds the energy up to the last update, not up to "now": up to one update
period of energy is misplaced at each end.

Per GPU the meter rebuilds the cumulative energy E(t) from every counter read
it has (the sampler's timeline and the meter's own reads, merged in time) as a
``CounterCurve`` (actors/telemetry/curves.py, which says how update instants are
placed). Windows, phases and iterations are all differences of this one
function, so energies over a partition of a window add up to the window exactly.

The sampler's 100 ms reads place an instant only to within +-50 ms. So the
meter reads the counters back to back around each boundary until each moves
(``SamplingPolicy.catch_updates``), which places the nearest update to a few ms:
``begin`` stamps t0 just after one, ``end`` catches the first after t1. The
actor's boundaries are also steps in power (idle, then the synchronized work,
then idle), and interpolating across a step smears it; with
``SamplingPolicy.quiet_boundaries`` each boundary is instead extrapolated from
its caught update at the power of the quiet side, and kept as an anchor of E(t).
On an H200, over identical 0.65 s and 2 s windows, this gave an
energy-per-operation spread (CV) of 0.46% and 0.17%, against 4.6% and 1.4%
interpolating the sampler's timeline alone; raw deltas at the same boundaries
were as repeatable but 40 J low, the energy between the last update and the end
of the work.

Uncertainty (``uncertainty_j``)
-------------------------------
Per boundary b and GPU, a worst case:
- interpolated: E(b) lies within P*d of either bracketing instant's value (d
  the distance from b), and so does the line between them; the instant itself
  is off by up to half its detection gap g. Bound: P_b * (d_nearer + g/2).
- quiet-side extrapolation: the quiet side's power may be off by 100% over the
  d extrapolated: P_quiet * d + P_b * g/2.
P_b is the largest counter-derived power of the segments around b. The 2 terms
per GPU are independent; ``uncertainty_j`` is their root-sum-square.

Fallbacks, named in ``method``:
- ``nvml_counter``: nothing brackets a boundary (no sampler, no update caught):
  raw counter deltas, with P * (update period) per boundary.
- ``power_integral``: no counter (pre-Volta): trapezoidal integral of sampled
  power, with P * (sample gap) per boundary. This bounds only the boundary
  placement, not the power sensor's own sampling error.
"""

from __future__ import annotations

import heapq
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from actors.telemetry.curves import CounterCurve, PowerCurve
from actors.telemetry.nvml import DeviceReader, GpuInfo, TelemetryError, unique_by_uuid
from actors.telemetry.policy import DEFAULT_POLICY, SamplingPolicy
from actors.telemetry.sampler import ENERGY_MJ, GPU_UUID, MEMORY_USED_BYTES, POWER_W, T_S, Sampler

log = logging.getLogger(__name__)

METHOD_INTERPOLATED = "nvml_counter_interpolated"
METHOD_COUNTER = "nvml_counter"
METHOD_POWER = "power_integral"
# A window is only as good as its weakest GPU.
_METHOD_RANK = {METHOD_INTERPOLATED: 0, METHOD_COUNTER: 1, METHOD_POWER: 2}


def _no_sync() -> None:
    pass


@dataclass(frozen=True)
class GpuShare:
    """One metered GPU's part of a window: its own counter's energy over the window's
    boundaries, and what its own samples there read."""

    uuid: str
    energy_j: float
    avg_power_w: float  # energy_j / the window's duration
    peak_power_w: float | None  # the highest sampled power reading in the window (None: no sample)
    peak_memory_bytes: int | None  # the highest sampled device memory in use (None: no sample)


@dataclass(frozen=True)
class EnergyWindow:
    name: str
    t_start_s: float
    t_end_s: float
    duration_s: float
    energy_j: float  # total over GPUs: the sum of ``gpus``' energies
    gpus: tuple[GpuShare, ...]  # one per metered GPU, in the telemetry's GPU order
    method: str
    uncertainty_j: float
    avg_power_w: float
    # Per-sample sums over GPUs of the sampled power reading (the instantaneous field where the
    # driver has one, NVML's own ~100 ms average; else the 1 s trailing mean) within the window:
    peak_power_w: float | None  # the highest such sum: one reading can set it
    p99_power_w: float | None = None  # their 99th percentile: what a single reading cannot dominate

    @property
    def energy_j_per_gpu(self) -> dict[str, float]:
        return {g.uuid: g.energy_j for g in self.gpus}


@dataclass(frozen=True)
class IdleBaseline:
    power_w: float  # mean over the baseline window, summed over GPUs
    settle_s: float  # how long the power took to stop falling before the window began
    settled: bool  # False: still falling when the wait's cap ran out
    window: EnergyWindow
    # Reuse within a group (see actors.telemetry.baseline): when it was asked for (the
    # telemetry clock), whether it stands for a later trial than the one it was taken for,
    # and that trial's re-check: the settled power it read just before deciding.
    taken_at_s: float = 0.0
    reused: bool = False
    age_s: float = 0.0  # for a reused baseline: seconds since taken_at_s
    recheck_power_w: float | None = None
    # The sampled power's mean over the window: what a re-check, which reads the same
    # samples, is compared with (the counter's mean may sit a little apart from it).
    sampled_power_w: float | None = None


# The settle rule (see EnergyMeter.settle): spans compared, the fall that still counts as
# falling, and how long to wait at most (a GPU that keeps cooling past this is flagged).
IDLE_SETTLE_SPAN_S = 0.3
IDLE_SETTLE_TOLERANCE = 0.02
IDLE_SETTLE_MAX_S = 10.0


# -- the meter --------------------------------------------------------------------------


@dataclass(frozen=True)
class _OpenWindow:
    """A window begun and not yet ended: when, and each GPU's energy counter then."""

    t_s: float
    counters_mj: dict[str, int | None]


@dataclass(frozen=True)
class _GpuEstimate:
    energy_j: float
    method: str
    boundary_uncertainty_j: tuple[float, float]
    anchors: tuple[tuple[float, float], ...] = ()


class EnergyMeter:
    """Named energy windows on the GPUs a trial holds.

    ``sync`` is called before every clock read so that a boundary means "all
    device work issued so far is done". Around each boundary the meter reads
    the counters itself, back to back, until each has moved once
    (``policy.catch_updates``): ``begin`` stamps t0 just after an update instant
    known to a few ms, ``end`` finds the first update after t1 as closely. With
    ``policy.quiet_boundaries`` (the GPU runs none of the measured work between
    the synchronize and t0, nor after t1 until ``end`` returns, which is how the
    actor uses it), each boundary is extrapolated from that update at the quiet
    side's power, instead of interpolated across the step in power the boundary
    is. ``policy`` may be replaced between windows.

    Waits happen outside the window. When the sampler thread is not running,
    waits sample on the caller's thread, so a caller driving the sampler with
    an injected ``clock``/``sleep`` gets the same behaviour, deterministically.
    """

    def __init__(self, gpus: list[GpuInfo], sampler: Sampler, sync: Callable[[], None] = _no_sync,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 *, settle_timeout_s: float | None = None, policy: SamplingPolicy = DEFAULT_POLICY) -> None:
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
        self.policy = policy
        # Counters update about every 100 ms (80-120 ms seen on an H200); give up after a few.
        self._catch_timeout_s = 0.5
        self._catch_poll_s = 0.002
        # An update instant bracketed this tightly counts as known (one read costs ~4 ms on an H200).
        self._precise_s = 0.05
        # Timeline reach around an interval: enough to find the bracketing update.
        self._margin_s = max(2.0, 20 * interval)
        self._reads: dict[str, list[tuple[float, int]]] = {g.uuid: [] for g in self.gpus}
        self._anchors: dict[str, list[tuple[float, float]]] = {g.uuid: [] for g in self.gpus}
        self._open: dict[str, _OpenWindow] = {}
        self.last_idle_window: EnergyWindow | None = None

    # -- windows ------------------------------------------------------------------------

    def begin(self, name: str) -> float:
        """Open window ``name``; returns its start t0 on the shared clock."""
        if name in self._open:
            raise TelemetryError(f"energy window {name!r} is already open")
        self._sync()
        if not self._wait_for(self._history_ready):
            log.warning("window %r: no counter update seen before it began; its start may be uncorrected", name)
        if self.policy.catch_updates:
            self._catch_update()
        counters = self._read_counters()
        # Stamped after the reads, right before the caller's work: time between the
        # stamp and the work is idle, yet the curve spreads the first in-window
        # update's energy over it (on an H200, a 17 ms gap took 11 J from the phases).
        t0 = self._clock()
        self._open[name] = _OpenWindow(t0, counters)
        return t0

    def end(self, name: str) -> EnergyWindow:
        opened = self._open.pop(name, None)
        if opened is None:
            raise TelemetryError(f"energy window {name!r} was never begun")
        self._sync()
        t1 = self._clock()
        counters = self._read_counters()
        # The first update after t1 places the end; a second gives the quiet power after it.
        if self.policy.catch_updates and self._catch_update() and self.policy.quiet_boundaries:
            self._catch_update()
        if not self._wait_for(lambda: self._future_ready(t1)):
            log.warning("window %r: no counter update seen after it ended; its end may be uncorrected", name)
        window = self._window(name, opened.t_s, t1, opened.counters_mj, counters)
        self._forget_before(t1 - (self._sampler.retention_s or 3600.0))
        return window

    def cancel(self, name: str) -> None:
        """Forget an open window (its block failed); unknown names are ignored."""
        self._open.pop(name, None)

    def idle_baseline(self, duration_s: float, settle_max_s: float = IDLE_SETTLE_MAX_S, *,
                      settled_after_s: float | None = None) -> IdleBaseline:
        """Idle power in W, summed over GPUs, over a quiet window of ``duration_s`` that
        starts once the power has stopped falling (see ``settle``; ``settled_after_s``:
        the caller has just settled, in that many seconds)."""
        settle_s = self.settle(settle_max_s) if settled_after_s is None else settled_after_s
        name = "__idle_baseline__"
        self.begin(name)
        self._pause(duration_s)
        window = self.end(name)
        self.last_idle_window = window
        return IdleBaseline(power_w=window.avg_power_w, settle_s=settle_s,
                            settled=settle_s < settle_max_s, window=window,
                            sampled_power_w=self._mean_power(window.t_start_s, window.t_end_s))

    def settle(self, max_s: float = IDLE_SETTLE_MAX_S) -> float:
        """Wait until the summed power stops falling; the seconds waited (``max_s`` at most).

        Work just finished leaves its power behind for a while (clocks and fans come
        down over seconds; on an H100 the first idle sample after a warm-up read 530 W
        against 72 W at rest): a baseline that starts in that tail overstates idle power,
        and active energy, which subtracts it, understates. Power is compared over
        consecutive spans of ``IDLE_SETTLE_SPAN_S``; it has stopped falling when a span's
        mean is within ``IDLE_SETTLE_TOLERANCE`` (or 1 W) of the span before.
        """
        self._sync()
        start = self._clock()
        span = max(IDLE_SETTLE_SPAN_S, 3 * self._sampler.interval_s)
        self._pause(span)
        previous = self._mean_power(self._clock() - span, self._clock())
        while self._clock() - start < max_s:
            self._pause(span)
            now = self._clock()
            current = self._mean_power(now - span, now)
            if previous is None or current is None:
                return now - start  # nothing sampled: nothing to wait for
            if previous - current <= max(IDLE_SETTLE_TOLERANCE * previous, 1.0):
                return now - start
            previous = current
        return max_s

    def sampled_power_w(self, seconds: float) -> float | None:
        """Mean sampled power, summed over GPUs, over the next ``seconds`` (None: no samples)."""
        self._pause(seconds)
        now = self._clock()
        return self._mean_power(now - seconds, now)

    def _mean_power(self, t0: float, t1: float) -> float | None:
        sums = self._power_sums(t0, t1)
        return sum(sums) / len(sums) if sums else None

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

    def interval(self, name: str, t0_s: float, t1_s: float) -> EnergyWindow:
        """A window over [t0, t1] chosen after the fact (serving's steady state), from the
        timeline alone: boundaries interpolated on the counter curve (no reads were caught
        there, and the work runs on both sides), with their uncertainty as for any window."""
        lo, hi = t0_s - self._margin_s, t1_s + self._margin_s
        counters, powers = self._series(lo, hi)
        energies: dict[str, float] = {}
        terms, methods = [], []
        for g in self.gpus:
            power = PowerCurve.from_samples(powers[g.uuid])
            curve = (CounterCurve.from_samples(counters[g.uuid], self._anchors_between(g.uuid, lo, hi), power)
                     if g.energy_counter_supported else None)
            best: CounterCurve | PowerCurve | None = curve if curve is not None and curve.covers(t0_s) \
                and curve.covers(t1_s) else power
            if best is None:
                raise TelemetryError(f"GPU {g.uuid}: no counter updates and no power samples for [{t0_s}, {t1_s}]")
            energies[g.uuid] = best.at(t1_s) - best.at(t0_s)
            terms += [best.boundary_uncertainty_j(t0_s), best.boundary_uncertainty_j(t1_s)]
            methods.append(METHOD_INTERPOLATED if best is curve else METHOD_POWER)
        duration_s = t1_s - t0_s
        energy_j = sum(energies.values())
        sums = self._power_sums(t0_s, t1_s)
        return EnergyWindow(
            name=name, t_start_s=t0_s, t_end_s=t1_s, duration_s=duration_s, energy_j=energy_j,
            gpus=self._shares(energies, t0_s, t1_s), method=max(methods, key=_METHOD_RANK.__getitem__, default=METHOD_INTERPOLATED),
            uncertainty_j=math.sqrt(sum(u * u for u in terms)),
            avg_power_w=energy_j / duration_s if duration_s > 0 else 0.0,
            peak_power_w=max(sums) if sums else None,
            p99_power_w=_percentile(sums, 99.0) if sums else None,
        )

    def phase_energy(self, marks: list[tuple[str, float, float]]) -> dict[str, float]:
        """J per phase name, summed over all of that phase's (name, t0, t1) intervals."""
        energies = self.energies_between([(t0, t1) for _, t0, t1 in marks])
        out: dict[str, float] = {}
        for (phase, _, _), energy_j in zip(marks, energies, strict=True):
            out[phase] = out.get(phase, 0.0) + energy_j
        return out

    def diagnostics(self, t0_s: float, t1_s: float) -> dict[str, dict[str, list[tuple[float, float]]]]:
        """By GPU, the meter's own counter reads (``meter_reads``) and boundary
        estimates (``anchors``) in [t0, t1]: with the sampler's rows, everything a
        window there was computed from, to replay it offline."""
        return {
            "meter_reads": {uuid: [(t, v) for t, v in reads if t0_s <= t <= t1_s] for uuid, reads in self._reads.items()},
            "anchors": {uuid: self._anchors_between(uuid, t0_s, t1_s) for uuid in self._anchors},
        }

    def _energy_functions(self, t0_s: float, t1_s: float) -> list[Callable[[float], float]]:
        lo, hi = t0_s - self._margin_s, t1_s + self._margin_s
        counters, powers = self._series(lo, hi)
        functions: list[Callable[[float], float]] = []
        for g in self.gpus:
            curve = None
            power = PowerCurve.from_samples(powers[g.uuid])
            if g.energy_counter_supported:
                curve = CounterCurve.from_samples(counters[g.uuid], self._anchors_between(g.uuid, lo, hi), power)
            best: CounterCurve | PowerCurve | None = curve or power
            if best is None:
                raise TelemetryError(f"GPU {g.uuid}: no counter updates and no power samples near [{t0_s}, {t1_s}]")
            functions.append(best.at)
        return functions

    # -- reading and waiting ------------------------------------------------------------

    def _read_counters(self) -> dict[str, int | None]:
        """One read of every counter, stamped like the sampler's. With ``policy.catch_updates``
        the reads join the sampler's in the curves; without, the curves are the
        sampler's timeline alone and the reads serve only the raw fallback."""
        out = {}
        for uuid, reader in self._readers.items():
            before = self._clock()
            value = reader.energy_mj()
            if value is not None and self.policy.catch_updates:
                self._reads[uuid].append(((before + self._clock()) * 0.5, value))
            out[uuid] = value
        return out

    def _catch_update(self) -> bool:
        """Read the counters back to back until each has moved once, so that the
        update lands between two reads a few ms apart. The GPU idles meanwhile:
        this runs only between a synchronize and a clock read of a boundary."""
        first = self._read_counters()
        pending = {uuid for uuid, v in first.items() if v is not None}
        deadline = self._clock() + self._catch_timeout_s
        while pending and self._clock() < deadline:
            self._sleep(self._catch_poll_s)
            now = self._read_counters()
            pending = {uuid for uuid in pending if now[uuid] == first[uuid]}
        return not pending

    def _series(self, t0_s: float, t1_s: float) -> tuple[dict[str, list], dict[str, list]]:
        """Counter reads (the sampler's and the meter's own, merged in time) and power samples."""
        counters: dict[str, list] = {g.uuid: [] for g in self.gpus}
        powers: dict[str, list] = {g.uuid: [] for g in self.gpus}
        for row in self._sampler.raw_rows(t0_s, t1_s):
            uuid = row[GPU_UUID]
            if uuid in counters:
                counters[uuid].append((row[T_S], row[ENERGY_MJ]))
                powers[uuid].append((row[T_S], row[POWER_W]))
        for uuid, reads in self._reads.items():
            own = [r for r in reads if t0_s <= r[0] <= t1_s]
            if own:
                counters[uuid] = list(heapq.merge(counters[uuid], own, key=lambda r: r[0]))
        return counters, powers

    def _anchors_between(self, uuid: str, t0_s: float, t1_s: float) -> list[tuple[float, float]]:
        return [a for a in self._anchors[uuid] if t0_s <= a[0] <= t1_s]

    def _forget_before(self, t_s: float) -> None:
        for uuid, reads in self._reads.items():
            self._reads[uuid] = [r for r in reads if r[0] >= t_s]
        for uuid, anchors in self._anchors.items():
            self._anchors[uuid] = [a for a in anchors if a[0] >= t_s]

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

    # -- computing ----------------------------------------------------------------------

    def _window(self, name: str, t0: float, t1: float, raw0: dict[str, int | None],
                raw1: dict[str, int | None]) -> EnergyWindow:
        lo, hi = t0 - self._margin_s, t1 + self._margin_s
        counters, powers = self._series(lo, hi)
        estimates = {
            g.uuid: self._estimate(g, t0, t1, raw0.get(g.uuid), raw1.get(g.uuid), counters[g.uuid],
                                   powers[g.uuid], self._anchors_between(g.uuid, lo, hi))
            for g in self.gpus
        }
        for uuid, estimate in estimates.items():
            self._anchors[uuid].extend(estimate.anchors)
            self._anchors[uuid].sort()
        energy_j = sum(e.energy_j for e in estimates.values())
        duration_s = t1 - t0
        terms = [u for e in estimates.values() for u in e.boundary_uncertainty_j]
        sums = self._power_sums(t0, t1)
        return EnergyWindow(
            name=name, t_start_s=t0, t_end_s=t1, duration_s=duration_s,
            energy_j=energy_j,
            gpus=self._shares({uuid: e.energy_j for uuid, e in estimates.items()}, t0, t1),
            method=max((e.method for e in estimates.values()), key=_METHOD_RANK.__getitem__,
                       default=METHOD_INTERPOLATED),
            uncertainty_j=math.sqrt(sum(u * u for u in terms)),
            avg_power_w=energy_j / duration_s if duration_s > 0 else 0.0,
            peak_power_w=max(sums) if sums else None,
            p99_power_w=_percentile(sums, 99.0) if sums else None,
        )

    def _estimate(self, gpu: GpuInfo, t0: float, t1: float, raw0: int | None, raw1: int | None,
                  counter_samples: list, power_samples: list,
                  anchors: list[tuple[float, float]]) -> _GpuEstimate:
        power = PowerCurve.from_samples(power_samples)
        curve = CounterCurve.from_samples(counter_samples, anchors, power) if gpu.energy_counter_supported else None
        if curve is not None and curve.covers(t0) and curve.covers(t1):
            quiet = self.policy.quiet_boundaries
            start = curve.start_anchor(t0, self._precise_s) if quiet else None
            end = curve.end_anchor(t1, self._precise_s) if quiet else None
            e0, u0 = start or (curve.at(t0), curve.boundary_uncertainty_j(t0))
            e1, u1 = end or (curve.at(t1), curve.boundary_uncertainty_j(t1))
            new = tuple(a for a, used in (((t0, e0), start), ((t1, e1), end)) if used)
            return _GpuEstimate(e1 - e0, METHOD_INTERPOLATED, (u0, u1), new)
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

    def _shares(self, energies: dict[str, float], t0: float, t1: float) -> tuple[GpuShare, ...]:
        """Each GPU's part of the window [t0, t1]: its energy (``energies``, by uuid) and the
        peaks of its own samples there. Memory is read on the sampler's slow fields, so a
        window shorter than their period may hold no memory reading (None)."""
        peak_w: dict[str, float] = {}
        peak_bytes: dict[str, int] = {}
        for row in self._sampler.raw_rows(t0, t1):
            uuid, power, memory = row[GPU_UUID], row[POWER_W], row[MEMORY_USED_BYTES]
            if power is not None:
                peak_w[uuid] = max(peak_w.get(uuid, power), power)
            if memory is not None:
                peak_bytes[uuid] = max(peak_bytes.get(uuid, memory), memory)
        duration_s = t1 - t0
        return tuple(GpuShare(uuid=g.uuid, energy_j=energies[g.uuid],
                              avg_power_w=energies[g.uuid] / duration_s if duration_s > 0 else 0.0,
                              peak_power_w=peak_w.get(g.uuid), peak_memory_bytes=peak_bytes.get(g.uuid))
                     for g in self.gpus)

    def _power_sums(self, t0: float, t1: float) -> list[float]:
        """Per sample in [t0, t1], the power summed over the metered GPUs."""
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
        return [s for s in sums if not math.isnan(s)]


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without numpy."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
