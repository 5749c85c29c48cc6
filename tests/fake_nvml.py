"""The one test double of ``pynvml``: simulated GPUs on a controllable clock.

Only NVML is replaced; the telemetry code under test is the real one. Install
it with ``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(...))``.

What it simulates, after measurements on H100/H200:
- each GPU's energy counter (mJ since "driver load") changes only at update
  instants ``update_phase_s + k * update_period_s`` and then holds the exact
  integral of the scripted power up to that instant;
- the instantaneous power field (``NVML_FI_DEV_POWER_INSTANT``) steps at the
  same instants and holds the mean power of the period just ended, while
  ``nvmlDeviceGetPowerUsage`` holds a one-second trailing mean, as it does on
  Ampere and newer (``power_average_s``); pre-Volta boards have neither the
  counter nor the field, and an instantaneous ``nvmlDeviceGetPowerUsage``;
- exceptions are the real ``pynvml`` classes, so ``except NVMLError`` in the
  code under test means what it means against a driver.
"""

from __future__ import annotations

import bisect
import math
import random
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
        if self.steps and self.steps[0][0] < 0:
            raise ValueError("steps start at t >= 0")
        self._times = [t for t, _ in self.steps]
        self._energy_at_step_j = []  # energy from time 0 to each step
        energy_j, t_prev, level_w = 0.0, 0.0, initial_w
        for t, power_w in self.steps:
            energy_j += level_w * (t - t_prev)
            self._energy_at_step_j.append(energy_j)
            t_prev, level_w = t, power_w

    def then(self, t_s: float, power_w: float) -> None:
        """Switch to ``power_w`` from ``t_s`` on (at or after the last step): scripts a
        trace as a test goes, the way a workload drives a real GPU."""
        if self.steps and t_s < self.steps[-1][0]:
            raise ValueError("steps are appended in time order")
        level_w = self.steps[-1][1] if self.steps else self.initial_w
        t_prev = self._times[-1] if self._times else 0.0
        energy_j = self._energy_at_step_j[-1] if self._energy_at_step_j else 0.0
        self._energy_at_step_j.append(energy_j + level_w * (t_s - t_prev))
        self.steps.append((t_s, power_w))
        self._times.append(t_s)

    @classmethod
    def constant(cls, power_w: float) -> PowerTrace:
        return cls(power_w)

    def __call__(self, t_s: float) -> float:
        k = bisect.bisect_right(self._times, t_s)
        return self.initial_w if k == 0 else self.steps[k - 1][1]

    def energy_j(self, t_s: float) -> float:
        """Energy from time 0 to ``t_s``."""
        k = bisect.bisect_right(self._times, t_s) - 1
        if k < 0:
            return self.initial_w * t_s
        return self._energy_at_step_j[k] + self.steps[k][1] * (t_s - self._times[k])

    def energy_between_j(self, t0_s: float, t1_s: float) -> float:
        return self.energy_j(t1_s) - self.energy_j(t0_s)


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    power: PowerTrace = field(default_factory=lambda: PowerTrace.constant(300.0))
    update_period_s: float = 0.1
    update_phase_s: float = 0.0
    update_jitter_s: float = 0.0  # each update instant moves by up to this much (an H200 shows ~4 ms)
    power_limit_mw: int | None = 700_000
    energy_supported: bool = True
    instant_power_supported: bool = True
    power_average_s: float = 1.0  # window of nvmlDeviceGetPowerUsage's trailing mean
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
    process_pids: tuple[int, ...] = ()  # compute processes on it (nvmlDeviceGetComputeRunningProcesses)

    def update_s(self, k: int) -> float:
        jitter = self.update_jitter_s * (2 * random.Random(k).random() - 1) if self.update_jitter_s else 0.0
        return self.update_phase_s + k * self.update_period_s + jitter

    def last_update_s(self, t_s: float) -> float:
        k = math.floor((t_s - self.update_phase_s) / self.update_period_s + 1e-9) + 1
        while self.update_s(k) > t_s + 1e-12:
            k -= 1
        return self.update_s(k)

    def counter_mj(self, t_s: float) -> int:
        return self.counter_at_zero_mj + round(1000 * self.power.energy_j(self.last_update_s(t_s)))

    def mean_power_mw(self, t_s: float, over_s: float) -> int:
        u = self.last_update_s(t_s)
        return round(1000 * self.power.energy_between_j(u - over_s, u) / over_s)

    @classmethod
    def pre_volta(cls, uuid: str, **kwargs) -> FakeGpu:
        return cls(uuid, name="Tesla P100-PCIE-16GB", energy_supported=False, instant_power_supported=False,
                   power_average_s=kwargs.pop("update_period_s", 0.1), **kwargs)


@dataclass(frozen=True)
class _Handle:
    gpu: FakeGpu
    mig_uuid: str | None = None


class FakeNvml:
    """Stands in for the ``pynvml`` module (``import pynvml`` returns this object)."""

    NVML_CLOCK_SM = _real.NVML_CLOCK_SM
    NVML_TEMPERATURE_GPU = _real.NVML_TEMPERATURE_GPU
    NVML_FI_DEV_POWER_INSTANT = _real.NVML_FI_DEV_POWER_INSTANT
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = _real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION

    def __init__(self, gpus: list[FakeGpu], clock: FakeClock | None = None, *,
                 driver_version: str = "580.95.05", init_error: Exception | None = None,
                 energy_read_s: float = 0.0) -> None:
        self.gpus = gpus
        # An energy-counter read takes ~4 ms inside the driver on an H200; time passes during it.
        self.energy_read_s = energy_read_s
        self.clock = clock or FakeClock()
        self.driver_version = driver_version
        self.init_error = init_error
        self.initialized = False
        self.calls: dict[str, int] = {}
        self.reads_by_uuid: dict[str, set[str]] = {}  # per GPU, the functions called on its handle

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
        self.reads_by_uuid.setdefault(handle.gpu.uuid, set()).add(fn)
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
        if self.energy_read_s:
            self.clock.sleep(self.energy_read_s)
        return handle.gpu.counter_mj(self.clock())

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._call("nvmlDeviceGetPowerUsage", handle)
        return handle.gpu.mean_power_mw(self.clock(), handle.gpu.power_average_s)

    def nvmlDeviceGetFieldValues(self, handle: _Handle, field_ids: list) -> list[SimpleNamespace]:
        self._call("nvmlDeviceGetFieldValues", handle)
        out = []
        for field_id in field_ids:
            field_id = field_id[0] if isinstance(field_id, tuple) else field_id
            if field_id == _real.NVML_FI_DEV_POWER_INSTANT and handle.gpu.instant_power_supported:
                mw = handle.gpu.mean_power_mw(self.clock(), handle.gpu.update_period_s)
                out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=_real.NVML_SUCCESS,
                                           valueType=_real.NVML_VALUE_TYPE_UNSIGNED_INT, value=SimpleNamespace(uiVal=mw)))
            elif field_id == _real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION and handle.gpu.energy_supported:
                # The same counter as nvmlDeviceGetTotalEnergyConsumption, as an unsigned long long.
                out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=_real.NVML_SUCCESS,
                                           valueType=_real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                                           value=SimpleNamespace(ullVal=handle.gpu.counter_mj(self.clock()))))
            else:
                out.append(SimpleNamespace(fieldId=field_id, nvmlReturn=_real.NVML_ERROR_NOT_SUPPORTED,
                                           valueType=_real.NVML_VALUE_TYPE_UNSIGNED_INT, value=SimpleNamespace(uiVal=0)))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[SimpleNamespace]:
        self._call("nvmlDeviceGetComputeRunningProcesses", handle)
        return [SimpleNamespace(pid=pid, usedGpuMemory=2**30) for pid in handle.gpu.process_pids]

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
