"""GPU energy and telemetry inside the actor (DESIGN §4, steps 3, 6 and 7).

``Telemetry.open()`` maps the GPUs Ray assigned to NVML by UUID, samples them on
a thread, meters named windows with NVML's energy counter (interpolated across
its ~100 ms updates) and adds CPU/DRAM energy from RAPL. Nothing here imports
torch or pynvml at import time.
"""

from actors.telemetry.telemetry import (
    TRIAL_COLUMNS,
    Measurement,
    NullTelemetry,
    Telemetry,
    default_sync,
)
from actors.telemetry.meter import (
    METHOD_COUNTER,
    METHOD_INTERPOLATED,
    METHOD_POWER,
    CounterCurve,
    EnergyMeter,
    EnergyWindow,
    PowerCurve,
)
from actors.telemetry.nvml import (
    DeviceMappingError,
    GpuInfo,
    NvmlUnavailableError,
    TelemetryError,
    resolve_gpus,
)
from actors.telemetry.rapl import RaplReader, RaplSnapshot
from actors.telemetry.sampler import TIMELINE_SCHEMA, Sampler, SamplerStats

__all__ = [
    "METHOD_COUNTER",
    "METHOD_INTERPOLATED",
    "METHOD_POWER",
    "TIMELINE_SCHEMA",
    "TRIAL_COLUMNS",
    "CounterCurve",
    "DeviceMappingError",
    "EnergyMeter",
    "EnergyWindow",
    "GpuInfo",
    "Measurement",
    "NullTelemetry",
    "NvmlUnavailableError",
    "PowerCurve",
    "RaplReader",
    "RaplSnapshot",
    "Sampler",
    "SamplerStats",
    "Telemetry",
    "TelemetryError",
    "default_sync",
    "resolve_gpus",
]
