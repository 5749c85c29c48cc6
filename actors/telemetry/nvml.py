"""NVML access: which physical GPUs this process holds, and reading them.

This is the only module that talks to ``pynvml``. It is imported lazily through
``_pynvml()`` so that importing the telemetry package costs nothing on a
CPU-only head node, and so that tests can put a double in ``sys.modules``.

NVML numbers devices in PCI-bus order and reads the whole device; Ray hands an
actor its GPUs through ``CUDA_VISIBLE_DEVICES`` (indices, UUIDs or MIG ids).
Everything downstream is keyed by UUID, the one name both sides agree on.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from actors.telemetry.policy import EnergyRead

log = logging.getLogger(__name__)


class TelemetryError(RuntimeError):
    """A measurement could not be made as asked."""


class NvmlUnavailableError(TelemetryError):
    """NVML cannot be loaded or initialised here (no driver, no library, no GPU)."""


class DeviceMappingError(TelemetryError):
    """A ``CUDA_VISIBLE_DEVICES`` entry names no device NVML knows."""


@dataclass(frozen=True)
class GpuInfo:
    index: int  # NVML (physical, PCI-bus order) index, not the CUDA-visible ordinal
    uuid: str
    name: str
    power_limit_w: float | None
    driver_version: str
    energy_counter_supported: bool


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError as exc:
        raise NvmlUnavailableError(f"pynvml is not importable: {exc}") from exc
    return pynvml


_init_lock = threading.Lock()
_initialized: Any = None  # the pynvml module we initialised (a test may swap it)


def ensure_initialized() -> Any:
    """Initialise NVML once per process and return the module.

    Never shut down behind the caller's back: handles die with ``nvmlShutdown``
    and other users in the process (torch, vLLM) share NVML's one state.
    """
    global _initialized
    nv = _pynvml()
    with _init_lock:
        if _initialized is not nv:
            try:
                nv.nvmlInit()
            except nv.NVMLError as exc:
                raise NvmlUnavailableError(f"NVML init failed: {exc}") from exc
            _initialized = nv
    return nv


def _text(value: str | bytes) -> str:
    # pynvml < 11.5 returned bytes for strings.
    return value.decode() if isinstance(value, bytes) else value


def unique_by_uuid(gpus: Iterable[Any]) -> list[Any]:
    """Order-preserving dedupe by ``.uuid``: one physical GPU must never be counted twice."""
    seen: set[str] = set()
    out = []
    for g in gpus:
        if g.uuid not in seen:
            seen.add(g.uuid)
            out.append(g)
    return out


# -- device mapping --------------------------------------------------------------


def resolve_gpus(cuda_visible_devices: str | None = None) -> list[GpuInfo]:
    """The physical GPUs behind ``CUDA_VISIBLE_DEVICES``, in visible order, deduplicated.

    ``None`` reads the environment; an unset variable means every GPU and an
    empty one means none. Entries are physical indices, ``GPU-`` UUIDs (or a
    unique prefix, as CUDA accepts) or MIG ids; a MIG instance maps to its
    parent GPU because NVML meters energy only per whole device. A negative
    index ends the list, as it does for CUDA. Any other unknown entry raises
    ``DeviceMappingError``: metering the wrong GPU must never pass silently.
    """
    if cuda_visible_devices is None:
        cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    nv = ensure_initialized()
    try:
        physical = [_physical_device(nv, i) for i in range(nv.nvmlDeviceGetCount())]
        if cuda_visible_devices is None:
            chosen = physical
        else:
            chosen = _parse_visible(nv, cuda_visible_devices, physical)
        driver = _text(nv.nvmlSystemGetDriverVersion())
        return [_describe(nv, dev, driver) for dev in unique_by_uuid(chosen)]
    except nv.NVMLError as exc:
        raise TelemetryError(f"NVML failed while mapping devices: {exc}") from exc


@dataclass(frozen=True)
class _Physical:
    index: int
    uuid: str
    handle: Any


def _physical_device(nv: Any, index: int) -> _Physical:
    handle = nv.nvmlDeviceGetHandleByIndex(index)
    return _Physical(index, _text(nv.nvmlDeviceGetUUID(handle)), handle)


def _parse_visible(nv: Any, spec: str, physical: list[_Physical]) -> list[_Physical]:
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    chosen: list[_Physical] = []
    by_index = False
    for entry in entries:
        if entry.lstrip("+-").isdigit():
            if int(entry) < 0:
                break
            chosen.append(_by_index(entry, physical))
            by_index = True
        elif entry.startswith("GPU-"):
            chosen.append(_by_uuid_prefix(entry, physical))
        elif entry.startswith("MIG-"):
            chosen.append(_mig_parent(nv, entry, physical))
        else:
            raise DeviceMappingError(f"CUDA_VISIBLE_DEVICES entry {entry!r} is not an index, GPU UUID or MIG id")
    if by_index:
        _warn_if_cuda_order_may_differ(nv, physical)
    return chosen


def _by_index(entry: str, physical: list[_Physical]) -> _Physical:
    i = int(entry)
    if i >= len(physical):
        raise DeviceMappingError(f"CUDA_VISIBLE_DEVICES index {i} but NVML sees {len(physical)} GPU(s)")
    return physical[i]


def _by_uuid_prefix(entry: str, physical: list[_Physical]) -> _Physical:
    matches = [d for d in physical if d.uuid == entry] or [d for d in physical if d.uuid.startswith(entry)]
    if len(matches) != 1:
        what = "matches no GPU" if not matches else f"is ambiguous ({len(matches)} GPUs)"
        raise DeviceMappingError(f"CUDA_VISIBLE_DEVICES entry {entry!r} {what}")
    return matches[0]


def _mig_parent(nv: Any, entry: str, physical: list[_Physical]) -> _Physical:
    if "/" in entry:  # CUDA 11 form: MIG-GPU-<uuid>/<gi>/<ci>
        parent = _by_uuid_prefix(entry[len("MIG-"):].split("/", 1)[0], physical)
    else:
        try:
            mig = nv.nvmlDeviceGetHandleByUUID(entry)
            parent_uuid = _text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)))
        except nv.NVMLError as exc:
            raise DeviceMappingError(f"CUDA_VISIBLE_DEVICES entry {entry!r} matches no MIG device: {exc}") from exc
        parent = _by_uuid_prefix(parent_uuid, physical)
    log.warning("%s is a MIG instance: energy and power are those of its whole parent GPU %s",
                entry, parent.uuid)
    return parent


def _warn_if_cuda_order_may_differ(nv: Any, physical: list[_Physical]) -> None:
    # CUDA's default order is fastest-first; it equals NVML's PCI order only
    # when the GPUs are identical. Mixed GPUs need CUDA_DEVICE_ORDER=PCI_BUS_ID
    # for indices to mean the same device on both sides.
    if os.environ.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID":
        return
    names = {_text(nv.nvmlDeviceGetName(d.handle)) for d in physical}
    if len(names) > 1:
        log.warning("CUDA_VISIBLE_DEVICES holds indices on a host with mixed GPUs %s and "
                    "CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA and NVML may number them "
                    "differently; prefer UUIDs or set CUDA_DEVICE_ORDER=PCI_BUS_ID", sorted(names))


def _describe(nv: Any, dev: _Physical, driver: str) -> GpuInfo:
    return GpuInfo(
        index=dev.index,
        uuid=dev.uuid,
        name=_text(nv.nvmlDeviceGetName(dev.handle)),
        power_limit_w=_power_limit_w(nv, dev.handle),
        driver_version=driver,
        energy_counter_supported=_counter_supported(nv, dev),
    )


def _power_limit_w(nv: Any, handle: Any) -> float | None:
    # The enforced limit is what the board obeys (the lowest of all limits set).
    for getter in (nv.nvmlDeviceGetEnforcedPowerLimit, nv.nvmlDeviceGetPowerManagementLimit):
        try:
            return getter(handle) / 1000.0
        except nv.NVMLError:
            continue
    return None


def _counter_supported(nv: Any, dev: _Physical) -> bool:
    try:
        nv.nvmlDeviceGetTotalEnergyConsumption(dev.handle)
    except nv.NVMLError as exc:  # pre-Volta: NotSupported
        log.info("GPU %d (%s): no total-energy counter (%s); energy falls back to the power integral",
                 dev.index, dev.uuid, exc)
        return False
    return True


# -- reading ------------------------------------------------------------------------


class DeviceReader:
    """Reads one GPU's fields. A failing read gives None and never raises; a field
    the device does not support is not asked again (each refusal is a driver call)."""

    def __init__(self, gpu: GpuInfo, energy_read: EnergyRead = "call") -> None:
        nv = ensure_initialized()
        self.gpu = gpu
        self._nv = nv
        self._error = nv.NVMLError
        self._not_supported = nv.NVMLError_NotSupported
        try:
            self._handle = nv.nvmlDeviceGetHandleByUUID(gpu.uuid)
        except nv.NVMLError as exc:
            raise TelemetryError(f"no NVML handle for {gpu.uuid}: {exc}") from exc
        self._unsupported: set[str] = set() if gpu.energy_counter_supported else {"energy_mj"}
        sm = nv.NVML_CLOCK_SM
        get_clock = nv.nvmlDeviceGetClockInfo
        self._energy: Any = None
        self.use_energy_read(energy_read)
        self._power = self._pick_power_call(nv)
        self._util = nv.nvmlDeviceGetUtilizationRates
        self._memory = nv.nvmlDeviceGetMemoryInfo
        self._sm_clock = lambda h: get_clock(h, sm)
        self._temperature = self._pick_temperature_call(nv)

    @property
    def handle(self) -> Any:
        """The device's NVML handle, for callers that time NVML calls of their own."""
        return self._handle

    def use_energy_read(self, via: EnergyRead) -> None:
        """Read the energy counter through ``nvmlDeviceGetTotalEnergyConsumption``
        (``"call"``) or the field-values API (``"field"``): the same counter by
        another driver path."""
        nv = self._nv
        if via == "call":
            self._energy = nv.nvmlDeviceGetTotalEnergyConsumption
        elif via == "field":
            fields = [nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]
            get_fields = nv.nvmlDeviceGetFieldValues

            def energy_field_mj(h: Any) -> int:
                value = get_fields(h, fields)[0]
                if value.nvmlReturn != 0:
                    raise nv.NVMLError(value.nvmlReturn)
                return value.value.ullVal

            self._energy = energy_field_mj
        else:
            raise ValueError(f"energy read via {via!r}: expected 'call' or 'field'")

    def _pick_power_call(self, nv: Any) -> Any:
        # nvmlDeviceGetPowerUsage is a one-second moving average on Ampere and
        # newer. On an H200 it rose 0.7 s after a load step, where the
        # instantaneous field rose within one 100 ms update; integrated over a
        # window that starts from idle, the average undercounts by about
        # (step in power) x 0.5 s, 4% of a 10 s window. Peak power and the
        # power integral need the instantaneous reading where there is one.
        field = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", None)
        get_fields = getattr(nv, "nvmlDeviceGetFieldValues", None)
        if field is not None and get_fields is not None:
            def instant_mw(h: Any) -> int:
                value = get_fields(h, [field])[0]
                if value.nvmlReturn != 0:
                    raise nv.NVMLError(value.nvmlReturn)
                return value.value.uiVal

            try:
                instant_mw(self._handle)
                return instant_mw
            except nv.NVMLError:
                pass  # no such field (older driver); up to GA100 the plain reading is instantaneous
        return nv.nvmlDeviceGetPowerUsage

    def _pick_temperature_call(self, nv: Any) -> Any:
        # nvmlDeviceGetTemperature is deprecated (gone in CUDA 14); the V form
        # needs a recent driver. Use whichever this driver answers.
        sensor = nv.NVML_TEMPERATURE_GPU
        versioned = getattr(nv, "nvmlDeviceGetTemperatureV", None)
        if versioned is not None:
            try:
                versioned(self._handle, sensor)
                return lambda h: versioned(h, sensor)
            except nv.NVMLError:
                pass
        legacy = nv.nvmlDeviceGetTemperature
        return lambda h: legacy(h, sensor)

    def _read(self, field: str, call: Any) -> Any:
        if field in self._unsupported:
            return None
        try:
            return call(self._handle)
        except self._not_supported:
            self._unsupported.add(field)
        except self._error as exc:
            log.debug("GPU %s: reading %s failed: %s", self.gpu.uuid, field, exc)
        return None

    def energy_mj(self) -> int | None:
        return self._read("energy_mj", self._energy)

    def power_w(self) -> float | None:
        mw = self._read("power_w", self._power)
        return None if mw is None else mw / 1000.0

    def util_gpu_pct(self) -> int | None:
        rates = self._read("util_gpu_pct", self._util)
        return None if rates is None else rates.gpu

    def memory_used_bytes(self) -> int | None:
        info = self._read("memory_used_bytes", self._memory)
        return None if info is None else info.used

    def sm_clock_mhz(self) -> int | None:
        return self._read("sm_clock_mhz", self._sm_clock)

    def temperature_c(self) -> int | None:
        return self._read("temperature_c", self._temperature)


def gpu_processes(uuids: Sequence[str]) -> list[tuple[int, str]]:
    """(pid, name) of every compute process NVML sees on the GPUs ``uuids``, in pid order.

    Names come from ``/proc``; a process in another PID namespace (another container)
    shows NVML's pid with the name ``?``.
    """
    nv = ensure_initialized()
    pids: set[int] = set()
    try:
        for uuid in uuids:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            pids.update(int(p.pid) for p in nv.nvmlDeviceGetComputeRunningProcesses(handle))
    except nv.NVMLError as exc:
        raise TelemetryError(f"NVML could not list the processes on {','.join(uuids)}: {exc}") from exc
    return [(pid, _process_name(pid)) for pid in sorted(pids)]


def _process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip() or "?"
    except OSError:
        return "?"
