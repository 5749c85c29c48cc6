"""The measurement method's skeleton, the same for every kind of trial.

    prepare (compile the trial's shape, never in the window)
    -> warm-up (unrecorded)
    -> the GPUs settle, the idle baseline is taken (or the group's is re-checked)
    -> the measured window, inside one telemetry window
    -> the window's figures and its verdict (``actors.stability``)
    -> the telemetry timeline over baseline and window, on the window's clock.

What a trial measures is its ``Window``: offline, generate calls until the window
is long and precise enough (``actors.measure``); serving, a schedule of requests
(``actors.serving_measure``). A new kind of trial (an HTTP endpoint, say) is a new
``Window``, not a third copy of the steps around it.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from actors.stability import Verdict
from actors.stages import stage
from actors.telemetry.idle import trial_baseline
from actors.telemetry.occupancy import GpuOccupancy
from sweeper.core.results import Energy, Memory, Outcome, Part, RequestRecord, TrialResult
from sweeper.core.status import Status
from sweeper.core.trial import Trial

if TYPE_CHECKING:
    import pyarrow as pa

    from actors.telemetry import EnergyWindow, MeterReading, TelemetryBase
    from actors.telemetry.telemetry import Marks

def ratio(numerator: float | None, denominator: float | int | None) -> float | None:
    """numerator / denominator, or None where either is missing (or the denominator 0)."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def window_energy(window: EnergyWindow | None, *, idle_power_w: float | None, output_tokens: int) -> Energy:
    """The headline energy of a window that produced ``output_tokens``: its energy and power as
    metered, per token, and above the idle baseline (``active_energy_j``: what the work drew
    beyond the loaded, idle GPUs over the same time). Empty without a window. The same for
    offline windows and a serving run's steady window."""
    if window is None:
        return Energy()
    return Energy(
        energy_j=window.energy_j, energy_per_token_j=ratio(window.energy_j, output_tokens),
        avg_power_w=window.avg_power_w, peak_power_w=window.peak_power_w, p99_power_w=window.p99_power_w,
        active_energy_j=None if idle_power_w is None else window.energy_j - idle_power_w * window.duration_s,
        energy_method=window.method, energy_uncertainty_j=window.uncertainty_j,
        energy_per_token_uncertainty_j=ratio(window.uncertainty_j, output_tokens),
        # Each metered GPU's part, in the order of gpu_uuids; the energies sum to energy_j.
        gpu_energy_j=[g.energy_j for g in window.gpus], gpu_avg_power_w=[g.avg_power_w for g in window.gpus],
        gpu_peak_power_w=[g.peak_power_w for g in window.gpus],
    )


def window_memory(window: EnergyWindow | None, peak_memory_bytes: int | None) -> Memory:
    """The memory a window held: the backend's own peak and, where metered, each GPU's."""
    return Memory(peak_memory_bytes=peak_memory_bytes,
                  gpu_peak_memory_bytes=None if window is None else [g.peak_memory_bytes for g in window.gpus])


@dataclass
class Measurement:
    """What a trial's measured window produced: the typed result parts its figures make (the
    outcome: ok, or failed with what it measured), its requests (a record each, whole) and its
    timeline. The actor adds the parts it knows itself (setup, environment, the later passes)."""

    result: TrialResult
    requests: list[RequestRecord]
    timeline: pa.Table | None  # the telemetry's samples over the trial, or None without GPUs

    @property
    def row(self) -> dict[str, Any]:
        """The measured columns as a flat row, for readers that look them up by name."""
        return self.result.row()


@dataclass
class Figures:
    """What a window measured: the result parts it computed (each once), its requests, its
    verdict so far, where its timeline begins (t = 0 of the trial's timeline and requests) and
    ends, and its outcome (failed, with what it measured, where the run was cut short)."""

    parts: tuple[Part | None, ...]
    requests: list[RequestRecord]
    verdict: Verdict
    t_zero_s: float
    t_end_s: float
    marks: Marks = field(default_factory=list)
    outcome: Outcome = field(default_factory=lambda: Outcome(status=Status.OK))


class Window(ABC):
    """One kind of measured window; the skeleton (``measure``) runs everything around it."""

    @abstractmethod
    def prepare(self) -> None:
        """Work the window's shape needs once, timed as ``compile`` and kept out of the window."""

    @abstractmethod
    def warm_up(self) -> None:
        """Unrecorded work until the engine is in its steady state for this shape."""

    @abstractmethod
    def run(self, telemetry: TelemetryBase) -> None:
        """The measured work; the skeleton holds the telemetry window open around it."""

    @abstractmethod
    def figures(self, handle: MeterReading, telemetry: TelemetryBase, idle_power_w: float | None) -> Figures:
        """The window's columns and requests, and the reasons its figures may not be trusted."""


def measure(trial: Trial, window: Window, telemetry: TelemetryBase,
            clock: Callable[[], float] = time.monotonic, *, owner_pid: int | None = None) -> Measurement:
    """Run ``window`` through the method's steps (module docstring). ``owner_pid``: the process
    whose descendants are the trial's own on its GPUs (``actors.telemetry.occupancy``; None:
    not known, as for an external server)."""
    with stage("compile"):
        window.prepare()
    with stage("warmup"):
        window.warm_up()
    t_idle = clock()
    # After the warm-up, the GPUs first settle (its power tail is not idle), then the baseline.
    with stage("idle_baseline"):
        baseline, baseline_part = trial_baseline(telemetry, trial.measure)
    occupancy = GpuOccupancy(owner_pid)
    occupancy.observe(telemetry.gpu_processes())  # outside the window, as the read after it
    with stage("measure"), telemetry.measure(trial.trial_id) as handle:
        window.run(telemetry)
    occupancy.observe(telemetry.gpu_processes())
    figures = window.figures(handle, telemetry, baseline.power_w if baseline is not None else None)
    figures.verdict.baseline(baseline)
    # The one place a trial's measured parts meet; the actor adds what it knows itself.
    result = TrialResult.of(figures.outcome, *figures.parts, baseline_part, occupancy.part(),
                            figures.verdict.part())
    return Measurement(result=result, requests=figures.requests,
                       timeline=_timeline(telemetry, trial.trial_id, t_idle, figures))


def _timeline(telemetry: TelemetryBase, trial_id: str, t_idle_s: float, figures: Figures) -> pa.Table | None:
    """The samples from the baseline to the window's end and the few after it that closed it
    (the counter updates its end was placed by: with them, each GPU's raw counter brackets
    both boundaries), on the window's clock (t = 0 where its requests' times start), each
    tagged with the phase it fell in."""
    if not telemetry.active:
        return None
    import pyarrow.compute as pc

    table = telemetry.timeline_table(trial_id, t_idle_s, math.inf, marks=figures.marks)
    return table.set_column(table.schema.get_field_index("t_s"), "t_s",
                            pc.subtract(table.column("t_s"), figures.t_zero_s))
