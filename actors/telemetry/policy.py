"""How telemetry reads the GPUs and places window boundaries: one injectable strategy.

``SamplingPolicy()`` is the method the actor measures with. Every other value is a
variant that benchmarks compare against it (what a sparser timeline costs or saves,
another driver path to the same counter) or that tests use to isolate one mechanism.
The sampler and the meter read their choices from the policy they are given and
take no other switches, so the product's code path is the default policy's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Which driver path reads the energy counter: ``nvmlDeviceGetTotalEnergyConsumption``
# ("call") or the field-values API with ``NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION``
# ("field"). Both read the same counter; on an H200 they cost the same ~3.6 ms.
EnergyRead = Literal["call", "field"]
ENERGY_READS: tuple[EnergyRead, ...] = ("call", "field")


@dataclass(frozen=True)
class SamplingPolicy:
    """The measurement variant; the defaults are the product's.

    Sampler (the timeline):

    ``energy_every``: read the energy counter on every n-th sample only (null in
    the others, stamped at the power read). On an H200 that one read costs
    3.6-4.0 ms and the other fields microseconds. The meter places counter
    updates between the reads it has, so values above 1 coarsen its curve between
    window boundaries (the boundaries themselves are caught by the meter's own
    reads). On an H200, reading every 10th tick left window totals as they were
    but put prefill energy 11 % lower, and bought no throughput that could be
    resolved: the product reads every tick.

    ``slow_every``: read utilisation, memory, SM clock and temperature on every
    n-th sample only (null in the others): each NVML call is a driver round trip
    that can delay the trial's own CUDA calls, and the meter needs only energy
    and power at the full rate. Those reads take microseconds on an H200, so
    skipping them saves nothing measurable: the product reads every tick.

    ``energy_read``: the sampler's driver path to the energy counter (see
    ``EnergyRead``). The meter's own boundary reads always use the plain call.

    Meter (the window boundaries):

    ``catch_updates``: around each boundary, read the counters back to back until
    each moves, which places the nearest update to a few ms (the sampler's 100 ms
    reads place one only to within +-50 ms); those reads join the sampler's in
    the energy curve. Off, the curve is the sampler's timeline alone.

    ``quiet_boundaries``: the GPU runs none of the measured work on the outer
    side of each boundary (the caller synchronizes before it opens and after it
    closes a window, and holds the GPU alone), so each boundary is extrapolated
    from its caught update at the quiet side's power instead of interpolated
    across the step in power the boundary is. True for the actor's windows; a
    GPU that may be busy on either side of a boundary needs False.
    """

    energy_every: int = 1
    slow_every: int = 1
    energy_read: EnergyRead = "call"
    catch_updates: bool = True
    quiet_boundaries: bool = True

    def __post_init__(self) -> None:
        if self.slow_every < 1 or self.energy_every < 1:
            raise ValueError(f"slow_every and energy_every must be >= 1, got {self.slow_every}, {self.energy_every}")
        if self.energy_read not in ENERGY_READS:
            raise ValueError(f"energy_read {self.energy_read!r}: expected one of {ENERGY_READS}")


# The product's method: what the actor measures every trial with.
DEFAULT_POLICY = SamplingPolicy()
