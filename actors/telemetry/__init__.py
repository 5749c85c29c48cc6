"""GPU energy and telemetry inside the actor.

``Telemetry.open()`` maps the GPUs Ray assigned to NVML by UUID, samples them on
a thread, meters named windows with NVML's energy counter (interpolated across
its ~100 ms updates) and adds CPU/DRAM energy from RAPL; where there is no GPU it
returns a ``NullTelemetry``. Both implement ``TelemetryBase``, the type the
measurement code holds. ``SamplingPolicy`` is the one switch between the
product's method and the variants benchmarks compare it with. Nothing here
imports torch or pynvml at import time.

Modules, each importing only those before it: ``policy`` (the measurement
variant), ``nvml`` (devices and reads), ``curves`` (pure maths over samples),
``sampler`` (the timeline thread), ``meter`` (windows and intervals), ``rapl``
(CPU and DRAM energy), ``baseline`` (when a group's idle baseline is reused),
``telemetry`` (what the actor holds).
"""

from actors.telemetry.baseline import BaselineReuse
from actors.telemetry.curves import CounterCurve, PowerCurve
from actors.telemetry.idle import baseline_part, trial_baseline
from actors.telemetry.meter import (
    METHOD_COUNTER,
    METHOD_INTERPOLATED,
    METHOD_POWER,
    EnergyMeter,
    EnergyWindow,
    GpuShare,
    IdleBaseline,
)
from actors.telemetry.nvml import (
    DeviceMappingError,
    GpuInfo,
    NvmlUnavailableError,
    TelemetryError,
    resolve_gpus,
)
from actors.telemetry.policy import DEFAULT_POLICY, EnergyRead, SamplingPolicy
from actors.telemetry.rapl import RaplReader, RaplSnapshot
from actors.telemetry.sampler import TIMELINE_SCHEMA, Sampler, SamplerStats
from actors.telemetry.telemetry import (
    GPU_COLUMNS,
    EnergyReport,
    MeteredGpus,
    MeterReading,
    NullTelemetry,
    Telemetry,
    TelemetryBase,
    default_sync,
)

__all__ = [
    "BaselineReuse",
    "DEFAULT_POLICY",
    "METHOD_COUNTER",
    "METHOD_INTERPOLATED",
    "METHOD_POWER",
    "TIMELINE_SCHEMA",
    "GPU_COLUMNS",
    "MeteredGpus",
    "EnergyReport",
    "baseline_part",
    "trial_baseline",
    "CounterCurve",
    "DeviceMappingError",
    "EnergyMeter",
    "EnergyRead",
    "EnergyWindow",
    "GpuInfo",
    "GpuShare",
    "IdleBaseline",
    "MeterReading",
    "NullTelemetry",
    "NvmlUnavailableError",
    "PowerCurve",
    "RaplReader",
    "RaplSnapshot",
    "Sampler",
    "SamplerStats",
    "SamplingPolicy",
    "Telemetry",
    "TelemetryBase",
    "TelemetryError",
    "default_sync",
    "resolve_gpus",
]
