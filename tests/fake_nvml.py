"""The one test double of ``pynvml``: simulated GPUs on a controllable clock.

Only NVML is replaced; the telemetry code under test is the real one. Install
it with ``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(...))``.

What it simulates, after measurements on H100/H200:
- each GPU's energy counter (mJ since "driver load") changes only at update
  instants ``update_phase_s + k * update_period_s`` and then holds the exact
  integral of the scripted power up to that instant;
- the power reading steps at the same instants and holds the mean power of
  the period just ended;
- exceptions are the real ``pynvml`` classes, so ``except NVMLError`` in the
  code under test means what it means against a driver.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml as _real


class FakeClock:
    """A clock that moves only when told; doubles as the ``sleep`` to inject."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.t_s = start_s

    def __call__(self) -> float:
        return self.t_s

    def sleep(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self.t_s += seconds

    advance = sleep


class PowerTrace:
    """Piecewise-constant power in W: ``initial_w`` until the first step, then each
    ``(t_s, power_w)`` from its time on. Callable as a function of time; the
    cumulative energy is exact (no numerical integration to blur the tests)."""

    def __init__(self, initial_w: float, steps: list[tuple[float, float]] | tuple = ()) -> None:
        self.initial_w = initial_w
        self.steps = sorted(steps)
        self._times = [t for t, _ in self.steps]
        levels = [initial_w] + [w for _, w in self.steps]
        self._deltas = [b - a for a, b in zip(levels, levels[1:], strict=False)]

    @classmethod
    def constant(cls, power_w: float) -> PowerTrace:
        return cls(power_w)

    def __call__(self, t_s: float) -> float:
        k = bisect.bisect_right(self._times, t_s)
        return self.initial_w if k == 0 else self.steps[k - 1][1]

    def energy_j(self, t_s: float) -> float:
        """Energy from time 0 to ``t_s``: a sum of ramps, one per step."""
        total = self.initial_w * t_s
        for t_step, delta in zip(self._times, self._deltas, strict=True):
            if t_step < t_s:
                total += delta * (t_s - t_step)
        return total

    def energy_between_j(self, t0_s: float, t1_s: float) -> float:
        return self.energy_j(t1_s) - self.energy_j(t0_s)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    power: PowerTrace = field(default_factory=lambda: PowerTrace.constant(300.0))
    update_period_s: float = 0.1
    update_phase_s: float = 0.0
    power_limit_mw: int | None = 700_000
    energy_supported: bool = True
    counter_at_zero_mj: int = 987_654_321  # energy since "driver load", before time 0
    mig_uuids: tuple[str, ...] = ()
    # NVML function name -> fail every n-th call with NVMLError_Unknown (1 = always)
    fail_every: dict[str, int] = field(default_factory=dict)
    # NVML function name -> raise this non-NVML exception (a bug, not a driver error)
    crash: dict[str, Exception] = field(default_factory=dict)
    memory_used_bytes: int = 40 * 2**30
    sm_clock_mhz: int = 1980
    temperature_c: int = 55
    util_gpu_pct: int = 97

    def last_update_s(self, t_s: float) -> float:
        k = math.floor((t_s - self.update_phase_s) / self.update_period_s + 1e-9)
        return self.update_phase_s + k * self.update_period_s

    def counter_mj(self, t_s: float) -> int:
        return self.counter_at_zero_mj + round(1000 * self.power.energy_j(self.last_update_s(t_s)))

    def power_mw(self, t_s: float) -> int:
        u = self.last_update_s(t_s)
        return round(1000 * self.power.energy_between_j(u - self.update_period_s, u) / self.update_period_s)


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig_uuid: str | None = None


class FakeNvml:
    """Stands in for the ``pynvml`` module (``import pynvml`` returns this object)."""

    NVML_CLOCK_SM = _real.NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU

    def __init__(self, gpus: list[FakeGpu], clock: FakeClock | None = None, *,
                 driver_version: str = "580.95.05", init_error: Exception | None = None) -> None:
        self.gpus = gpus
        self.clock = clock or FakeClock()
        self.driver_version = driver_version
        self.init_error = init_error
        self.initialized = False
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        # Exception classes (NVMLError, NVMLError_NotSupported, ...) are the real ones.
        if name.startswith("NVMLError"):
            return getattr(_real, name)
        raise AttributeError(name)

    # -- plumbing ---------------------------------------------------------------------

    def _call(self, fn: str, handle: _Handle | None = None) -> None:
        if not self.initialized:
            raise _real.NVMLError_Uninitialized()
        n = self.calls[fn] = self.calls.get(fn, 0) + 1
        if handle is None:
            return
        if fn in handle.gpu.crash:
            raise handle.gpu.crash[fn]
        every = handle.gpu.fail_every.get(fn)
        if every and n % every == 0:
            raise _real.NVMLError_Unknown()

    # -- system -----------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise _real.NVMLError_InvalidArgument()
        return _Handle(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> _Handle:
        self._call("nvmlDeviceGetHandleByUUID")
        for gpu in self.gpus:
            if gpu.uuid == uuid:
                return _Handle(gpu)
            if uuid in gpu.mig_uuids:
                return _Handle(gpu, mig_uuid=uuid)
        raise _real.NVMLError_NotFound()

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: _Handle) -> _Handle:
        self._call("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        if handle.mig_uuid is None:
            raise _real.NVMLError_InvalidArgument()
        return _Handle(handle.gpu)

    # -- identity ---------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._call("nvmlDeviceGetUUID", handle)
        return handle.mig_uuid or handle.gpu.uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._call("nvmlDeviceGetName", handle)
        return handle.gpu.name

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._call("nvmlDeviceGetIndex", handle)
        return self.gpus.index(handle.gpu)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:
        self._call("nvmlDeviceGetEnforcedPowerLimit", handle)
        if handle.gpu.power_limit_mw is None:
            raise _real.NVMLError_NotSupported()
        return handle.gpu.power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: _Handle) -> int:
        return self.nvmlDeviceGetEnforcedPowerLimit(handle)

    # -- readings ---------------------------------------------------------------------

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: _Handle) -> int:
        self._call("nvmlDeviceGetTotalEnergyConsumption", handle)
        if not handle.gpu.energy_supported:
            raise _real.NVMLError_NotSupported()
        return handle.gpu.counter_mj(self.clock())

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._call("nvmlDeviceGetPowerUsage", handle)
        return handle.gpu.power_mw(self.clock())

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> SimpleNamespace:
        self._call("nvmlDeviceGetUtilizationRates", handle)
        return SimpleNamespace(gpu=handle.gpu.util_gpu_pct, memory=40)

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> SimpleNamespace:
        self._call("nvmlDeviceGetMemoryInfo", handle)
        total = 80 * 2**30
        used = handle.gpu.memory_used_bytes
        return SimpleNamespace(total=total, used=used, free=total - used)

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        self._call("nvmlDeviceGetClockInfo", handle)
        if clock_type != _real.NVML_CLOCK_SM:
            raise _real.NVMLError_InvalidArgument()
        return handle.gpu.sm_clock_mhz

    def nvmlDeviceGetTemperatureV(self, handle: _Handle, sensor: int) -> int:
        self._call("nvmlDeviceGetTemperatureV", handle)
        if sensor != _real.NVML_TEMPERATURE_GPU:
            raise _real.NVMLError_InvalidArgument()
        return handle.gpu.temperature_c

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        return self.nvmlDeviceGetTemperatureV(handle, sensor)
