"""What the actor holds: ``Telemetry`` on GPUs, ``NullTelemetry`` where there are none.

Both implement ``TelemetryBase``, so the measurement code has no GPU branch
beyond ``active``; on the null path every energy column is None, never 0,
because "not measured" and "no energy" must stay different in the results.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import statistics
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, fields, replace
from typing import ClassVar, TypeVar

import pyarrow as pa

from actors.telemetry.baseline import BaselineReuse
from actors.telemetry.meter import IDLE_SETTLE_MAX_S, EnergyMeter, EnergyWindow, IdleBaseline
from actors.telemetry.nvml import GpuInfo, NvmlUnavailableError, TelemetryError, resolve_gpus
from actors.telemetry.policy import DEFAULT_POLICY, SamplingPolicy
from actors.telemetry.rapl import RaplReader
from actors.telemetry.sampler import TIMELINE_SCHEMA, Sampler
from sweeper.core.results import Environment

log = logging.getLogger(__name__)

# The held GPUs' columns (``environment``), the same for every trial of a telemetry.
@dataclass(frozen=True)
class MeteredGpus:
    """The GPUs a telemetry meters, as a trial's row names them (all None: none metered)."""

    gpu_uuids: str | None = None  # comma-separated, in the metered order
    gpu_names: str | None = None
    gpu_power_limit_w: float | None = None  # summed over them
    driver_version: str | None = None

    def applied_to(self, environment: Environment) -> Environment:
        """``environment`` with these GPUs' columns."""
        return replace(environment, gpu_uuids=self.gpu_uuids, gpu_names=self.gpu_names,
                                   gpu_power_limit_w=self.gpu_power_limit_w, driver_version=self.driver_version)


GPU_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(MeteredGpus))


def default_sync() -> None:
    """Wait for this process's CUDA work, on every device it has used.

    Looks torch up instead of importing it: a process that never imported
    torch, or never touched CUDA, has no device work to wait for, and must not
    pay for an import or create a CUDA context just to be told so.
    """
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return
    current = torch.cuda.current_device()
    for i in range(torch.cuda.device_count()):
        # Synchronizing an untouched device would create a context on it.
        if i == current or torch.cuda.memory_reserved(i) > 0:
            torch.cuda.synchronize(i)


@dataclass
class MeterReading:
    """What the telemetry read over one ``measure`` block: its times, the GPUs' energy window,
    the host's CPU and DRAM energy, or why there is no window. Yielded by ``measure`` as a
    handle and filled in when the block exits."""

    name: str
    t_start_s: float | None = None
    t_end_s: float | None = None
    window: EnergyWindow | None = None
    cpu_energy_j: float | None = None
    dram_energy_j: float | None = None
    error: str | None = None  # why ``window`` is None, when it is

    @property
    def duration_s(self) -> float | None:
        if self.t_start_s is None or self.t_end_s is None:
            return None
        return self.t_end_s - self.t_start_s


Marks = list[tuple[str, float, float]]  # (phase name, t0, t1) on the telemetry's clock


@dataclass(frozen=True)
class EnergyReport:
    """What the telemetry measured over one trial's window, as Zeus's ``end_window`` returns
    its ``Measurement``: the window's energy and power, the energy of each phase of the work
    in it, of the host's gaps between phases, and how evenly its iterations drew. Figures
    only: per-token and per-request figures are the measurement method's to derive
    (``actors.method``), and whether they can be trusted is ``actors.stability``'s verdict."""

    window: EnergyWindow
    phase_energy_j: dict[str, float]  # by phase name (prefill, decode); empty: not computable
    between_phases_energy_j: float | None  # None: no phases
    iteration_energy_cv: float | None  # None: fewer than two >= 1 s blocks
    cpu_energy_j: float | None = None
    dram_energy_j: float | None = None


# NVML's energy counter moves about every 100 ms, so the energy of a 0.2 s
# iteration is resolved only to tens of per cent (on an H200, vLLM's 1B batch-1
# iterations of 0.2 s showed a 7 % CV at steady throughput). Iterations are
# judged in consecutive blocks of at least this long: ten counter updates.
MIN_STABILITY_BLOCK_S = 1.0


def iteration_blocks(bounds: list[tuple[float, float]], min_s: float) -> list[tuple[float, float, int]]:
    """Consecutive iterations merged into spans of at least ``min_s`` (iterations that
    long stay as they are), as ``(start, end, iterations)``; a short remainder joins
    the last block, which then holds more iterations than the others."""
    blocks: list[tuple[float, float, int]] = []
    start: float | None = None
    count = 0
    for t0, t1 in bounds:
        start = t0 if start is None else start
        count += 1
        if t1 - start >= min_s:
            blocks.append((start, t1, count))
            start, count = None, 0
    if start is not None:
        if blocks:
            first, _, n = blocks[-1]
            blocks[-1] = (first, bounds[-1][1], n + count)
        else:
            blocks.append((start, bounds[-1][1], count))
    return blocks


def _with_trial_id(table: pa.Table, trial_id: str, marks: Marks | None) -> pa.Table:
    table = table.add_column(0, pa.field("trial_id", pa.string()),
                             pa.array([trial_id] * table.num_rows, pa.string()))
    if marks is None:
        return table
    # A sample belongs to the mark that starts last at or before it, if it has not ended.
    ordered = sorted(marks, key=lambda m: m[1])
    starts = [m[1] for m in ordered]
    phases = []
    for t in table.column("t_s").to_pylist():
        k = bisect.bisect_right(starts, t) - 1
        phases.append(ordered[k][0] if k >= 0 and t <= ordered[k][2] else None)
    return table.append_column(pa.field("phase", pa.string()), pa.array(phases, pa.string()))


_TelemetryT = TypeVar("_TelemetryT", bound="TelemetryBase")


class TelemetryBase(ABC):
    """What a trial is measured with: the GPUs' energy and timeline, or a stand-in.

    ``Telemetry`` meters the GPUs this process holds; ``NullTelemetry`` answers
    the same calls where there are none, with every energy column None.
    ``active`` says which: code that needs a GPU reading asks it, and nothing else.
    """

    active: ClassVar[bool]
    gpus: list[GpuInfo]

    @abstractmethod
    def start(self) -> None:
        """Begin sampling (idempotent)."""

    @abstractmethod
    def close(self) -> None:
        """Stop sampling; the object answers reads of what it recorded afterwards."""

    def __enter__(self: _TelemetryT) -> _TelemetryT:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @abstractmethod
    def idle_baseline(self, duration_s: float, reuse: BaselineReuse | None = None) -> IdleBaseline | None:
        """Idle power summed over GPUs, over a quiet window of ``duration_s`` begun once the
        power has stopped falling; None without GPUs. With ``reuse``, the last baseline
        this telemetry took stands instead wherever the rule allows (``reused`` says so)."""

    @abstractmethod
    def measure(self, name: str) -> AbstractContextManager[MeterReading]:
        """A window around a block; the yielded handle is complete when the block exits."""

    @abstractmethod
    def phase_energy(self, marks: Marks) -> dict[str, float]:
        """J per phase name over all of that phase's intervals; raises ``TelemetryError``
        when the energy there cannot be computed (always, without GPUs)."""

    @abstractmethod
    def energies_between(self, intervals: list[tuple[float, float]]) -> list[float]:
        """J over each (t0, t1) on the same energy curve as the windows (intervals that
        partition a window add up to it); raises ``TelemetryError`` without GPUs."""

    @abstractmethod
    def interval(self, name: str, t0_s: float, t1_s: float) -> EnergyWindow:
        """A window over [t0, t1] chosen after the fact, with its uncertainty; raises
        ``TelemetryError`` without GPUs."""

    @abstractmethod
    def report(self, handle: MeterReading, *, marks: Marks,
               iteration_bounds: list[tuple[float, float]]) -> EnergyReport | None:
        """The energy of the window ``measure`` yielded, split by ``marks`` and judged over
        ``iteration_bounds``; None where there is none (no GPUs, or the window failed:
        ``handle.error`` says why)."""

    @abstractmethod
    def environment(self) -> MeteredGpus:
        """The held GPUs: uuids, names, summed power limit, driver version."""

    def gpu_processes(self) -> list[tuple[int, str]] | None:
        """(pid, name) of the compute processes on the metered GPUs now; None where that
        cannot be known (no GPU, or NVML would not say)."""
        return None

    @abstractmethod
    def timeline_table(self, trial_id: str, t0_s: float, t1_s: float, marks: Marks | None = None) -> pa.Table:
        """Timeline rows in [t0, t1] with ``trial_id`` first; with ``marks``, a ``phase`` column last."""


class Telemetry(TelemetryBase):
    """NVML sampler, energy meter and RAPL for the GPUs this process holds."""

    active = True

    def __init__(self, gpus: list[GpuInfo], sampler: Sampler, meter: EnergyMeter, rapl: RaplReader,
                 sync: Callable[[], None] = default_sync, clock: Callable[[], float] = time.monotonic) -> None:
        self.gpus = gpus
        self.sampler = sampler
        self.meter = meter
        self.rapl = rapl
        self._sync = sync
        self._clock = clock
        self._baseline: IdleBaseline | None = None  # the last one taken: what reuse stands on

    @classmethod
    def open(cls, interval_s: float = 0.1, clock: Callable[[], float] = time.monotonic,
             cuda_visible_devices: str | None = None, sync: Callable[[], None] | None = None, *,
             sleep: Callable[[float], None] = time.sleep, rapl_root: str = "/sys/class/powercap",
             policy: SamplingPolicy = DEFAULT_POLICY) -> Telemetry | NullTelemetry:
        """Telemetry for the GPUs Ray assigned, or NullTelemetry (with ``reason``) if there are none.

        A ``CUDA_VISIBLE_DEVICES`` entry that names no GPU raises
        ``DeviceMappingError``: metering some other device must not pass silently.
        ``sync`` must return only once all of the trial's device work is done
        (the default waits for this process's CUDA streams; a backend whose
        generate call blocks until its workers finish may pass its own).
        ``policy`` is the measurement variant; the default is the product's, whose
        quiet boundaries hold because the actor synchronizes both ends of each
        window and holds its GPUs alone.
        """
        try:
            gpus = resolve_gpus(cuda_visible_devices)
        except NvmlUnavailableError as exc:
            # Asked for GPU telemetry and got none: worth a warning, not a failure.
            return NullTelemetry(reason=str(exc), clock=clock, log_level=logging.WARNING)
        if not gpus:
            shown = cuda_visible_devices if cuda_visible_devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
            return NullTelemetry(reason=f"no GPU visible to this process (CUDA_VISIBLE_DEVICES={shown!r})", clock=clock)
        sync = sync or default_sync
        sampler = Sampler(gpus, interval_s=interval_s, clock=clock, policy=policy)
        meter = EnergyMeter(gpus, sampler, sync=sync, clock=clock, sleep=sleep, policy=policy)
        return cls(gpus, sampler, meter, RaplReader(rapl_root), sync=sync, clock=clock)

    @property
    def policy(self) -> SamplingPolicy:
        return self.sampler.policy

    @policy.setter
    def policy(self, policy: SamplingPolicy) -> None:
        """Measure with another variant: the sampler from its next sample, the meter from its next window."""
        self.sampler.policy = policy
        self.meter.policy = policy

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> None:
        self.sampler.start()

    def close(self) -> None:
        self.sampler.stop()

    # -- measuring --------------------------------------------------------------------

    def idle_baseline(self, duration_s: float, reuse: BaselineReuse | None = None) -> IdleBaseline | None:
        now = self._clock()
        held = self._baseline
        if reuse is None or held is None or now - held.taken_at_s > reuse.max_age_s:
            self._baseline = replace(self.meter.idle_baseline(duration_s), taken_at_s=now)
            return self._baseline
        # Settle as for a fresh baseline, then read the settled power briefly: the held
        # baseline stands if that reading agrees with it, else the full window follows.
        settle_s = self.meter.settle()
        reading = self.meter.sampled_power_w(reuse.recheck_s)
        reference = held.sampled_power_w if held.sampled_power_w is not None else held.power_w
        if reading is not None and reuse.agrees(reference, reading, len(self.gpus)):
            return replace(held, reused=True, age_s=now - held.taken_at_s, settle_s=settle_s,
                           settled=settle_s < IDLE_SETTLE_MAX_S, recheck_power_w=reading)
        fresh = self.meter.idle_baseline(duration_s, settled_after_s=settle_s)
        self._baseline = replace(fresh, taken_at_s=now, recheck_power_w=reading)
        return self._baseline

    @contextmanager
    def measure(self, name: str) -> Iterator[MeterReading]:
        """An energy window around the block; the handle is complete on exit.

        If the window cannot be computed the block's results still stand:
        ``handle.window`` stays None, ``handle.error`` says why, and the trial's
        energy columns come out null and flagged unstable.
        """
        handle = MeterReading(name)
        handle.t_start_s = self.meter.begin(name)
        rapl_start = self.rapl.read() if self.rapl.available else None
        try:
            yield handle
        except BaseException:
            self.meter.cancel(name)
            raise
        self._sync()
        rapl_end = self.rapl.read() if rapl_start is not None else None
        try:
            handle.window = self.meter.end(name)
        except TelemetryError as exc:
            log.error("energy window %r failed: %s", name, exc)
            handle.error = str(exc)
            return
        handle.t_start_s, handle.t_end_s = handle.window.t_start_s, handle.window.t_end_s
        if rapl_start is not None and rapl_end is not None:
            handle.cpu_energy_j, handle.dram_energy_j = self.rapl.delta(rapl_start, rapl_end)

    def phase_energy(self, marks: Marks) -> dict[str, float]:
        return self.meter.phase_energy(list(marks))

    def energies_between(self, intervals: list[tuple[float, float]]) -> list[float]:
        return self.meter.energies_between(intervals)

    def interval(self, name: str, t0_s: float, t1_s: float) -> EnergyWindow:
        return self.meter.interval(name, t0_s, t1_s)

    # -- reporting ----------------------------------------------------------------------

    def report(self, handle: MeterReading, *, marks: Marks,
               iteration_bounds: list[tuple[float, float]]) -> EnergyReport | None:
        w = handle.window
        if w is None:
            return None
        try:
            phases = self.phase_energy(marks)
        except TelemetryError as exc:
            log.warning("phase energy unavailable: %s", exc)
            phases = {}
        return EnergyReport(
            window=w, phase_energy_j=phases,
            between_phases_energy_j=self._between_phases_energy(w, marks) if phases else None,
            iteration_energy_cv=self._iteration_energy_cv(iteration_bounds),
            cpu_energy_j=handle.cpu_energy_j, dram_energy_j=handle.dram_energy_j)

    def _between_phases_energy(self, window: EnergyWindow, marks: Marks) -> float | None:
        """J in the window outside every phase mark: host time between generate calls, where the
        GPU idles at the power of a loaded model. Measured over those gaps on the same curve as
        the phases, so prefill + decode + this accounts for energy_j up to the boundary error."""
        spans = sorted((max(a, window.t_start_s), min(b, window.t_end_s)) for _, a, b in marks)
        gaps, t = [], window.t_start_s
        for a, b in spans:
            if a > t:
                gaps.append((t, a))
            t = max(t, b)
        if window.t_end_s > t:
            gaps.append((t, window.t_end_s))
        if not gaps:
            return 0.0
        try:
            return sum(self.meter.energies_between(gaps))
        except TelemetryError as exc:
            log.warning("energy between phases unavailable: %s", exc)
            return None

    def _iteration_energy_cv(self, bounds: list[tuple[float, float]]) -> float | None:
        """The CV of energy per iteration over blocks of >= 1 s (counters move every ~100 ms);
        None with fewer than two blocks."""
        blocks = iteration_blocks(bounds, MIN_STABILITY_BLOCK_S)
        if len(blocks) < 2:
            return None
        try:
            block_energies = self.meter.energies_between([(t0, t1) for t0, t1, _ in blocks])
        except TelemetryError as exc:
            log.warning("per-iteration energy unavailable: %s", exc)
            return None
        # Per iteration, not per block: blocks differ in iteration count (the remainder
        # joins the last), and on an H200 17 steady 0.74 s iterations read as CV 0.17
        # when their 2-, 2-, ..., 3-iteration blocks were compared whole.
        energies = [e / n for e, (_, _, n) in zip(block_energies, blocks, strict=True)]
        mean = statistics.fmean(energies)
        if mean <= 0:
            return None
        cv = statistics.stdev(energies) / mean
        return cv if math.isfinite(cv) else None

    def environment(self) -> MeteredGpus:
        limits = [g.power_limit_w for g in self.gpus if g.power_limit_w is not None]
        return MeteredGpus(gpu_uuids=",".join(g.uuid for g in self.gpus), gpu_names=",".join(g.name for g in self.gpus),
                           gpu_power_limit_w=sum(limits) if limits else None,
                           driver_version=self.gpus[0].driver_version if self.gpus else None)

    def gpu_processes(self) -> list[tuple[int, str]] | None:
        from actors.telemetry.nvml import gpu_processes

        try:
            return gpu_processes([g.uuid for g in self.gpus])
        except TelemetryError as exc:
            log.warning("%s", exc)
            return None

    def timeline_table(self, trial_id: str, t0_s: float, t1_s: float, marks: Marks | None = None) -> pa.Table:
        return _with_trial_id(self.sampler.table(t0_s, t1_s), trial_id, marks)


class NullTelemetry(TelemetryBase):
    """No GPU to meter: every call works and every energy column is None."""

    active = False

    def __init__(self, reason: str, clock: Callable[[], float] = time.monotonic,
                 sync: Callable[[], None] | None = None, log_level: int = logging.INFO) -> None:
        self.reason = reason
        self.gpus = []
        self._clock = clock
        self._sync = sync or (lambda: None)
        log.log(log_level, "GPU telemetry off: %s", reason)

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def idle_baseline(self, duration_s: float, reuse: BaselineReuse | None = None) -> IdleBaseline | None:
        return None

    @contextmanager
    def measure(self, name: str) -> Iterator[MeterReading]:
        handle = MeterReading(name, error=self.reason)
        self._sync()
        handle.t_start_s = self._clock()
        yield handle
        self._sync()
        handle.t_end_s = self._clock()

    def phase_energy(self, marks: Marks) -> dict[str, float]:
        raise TelemetryError(f"no GPU telemetry: {self.reason}")

    def energies_between(self, intervals: list[tuple[float, float]]) -> list[float]:
        raise TelemetryError(f"no GPU telemetry: {self.reason}")

    def interval(self, name: str, t0_s: float, t1_s: float) -> EnergyWindow:
        raise TelemetryError(f"no GPU telemetry: {self.reason}")

    def report(self, handle: MeterReading, *, marks: Marks,
               iteration_bounds: list[tuple[float, float]]) -> EnergyReport | None:
        return None

    def environment(self) -> MeteredGpus:
        return MeteredGpus()

    def timeline_table(self, trial_id: str, t0_s: float, t1_s: float, marks: Marks | None = None) -> pa.Table:
        return _with_trial_id(TIMELINE_SCHEMA.empty_table(), trial_id, marks)
