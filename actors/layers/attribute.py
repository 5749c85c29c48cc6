"""Energy attribution: the profiling pass's measured energy shared out over the modules.

The pass's energy E is measured over its window. Each phase p gets the share of
E that the power timeline puts in p's intervals (the generate calls' prefill
and decode spans, via ``meter.phase_energy``); the little that falls between
calls is spread in the same proportions. Within a phase, a module gets the
phase's energy in proportion to its share of the phase's GPU time
(``gpu_time_share_of_phase_energy``). If the timeline cannot split the phases,
E is shared by GPU time over the whole pass (``gpu_time_share_of_window_energy``).
Either way the modules' energies sum to E. The rows include each container's
``_rest`` (work outside the profiled children), so a phase's rows cover its
whole forward. GPU time is each row's ``gpu_time_method``: on CUDA the busy time
of the kernels the module launched. A phase's energy also holds the power drawn
while the GPU waits for the host (launch gaps, and the profiler's own host
work); it is spread over the modules in proportion to their kernel time, that
is, power within a phase is taken as uniform over the kernel time: that is the
method's assumption, and why it is named in every row.

Nothing here touches torch: it works on the profiler's records alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sweeper.core.results import LayerPass
from sweeper.core.results.tables import LayerRecord

if TYPE_CHECKING:
    from actors.layers.profiler import ModuleTime

METHOD_PHASE = "gpu_time_share_of_phase_energy"
METHOD_WINDOW = "gpu_time_share_of_window_energy"


@dataclass
class LayerProfile:
    """What the pass adds to a trial: trials-table columns and layers-table rows."""

    columns: LayerPass
    rows: list[LayerRecord] = field(default_factory=list)

    @classmethod
    def not_applicable(cls, why: str) -> LayerProfile:
        return cls(LayerPass(layer_profile_status=f"not applicable: {why}"))


def attribute_energy(times: Sequence[ModuleTime], *, trial_id: str, pass_energy_j: float | None,
                     phase_energy_j: dict[str, float] | None) -> list[LayerRecord]:
    """``trial_id``'s layers-table rows from per-module, per-phase GPU times.

    ``times`` holds the profiler's records (module, module_type, layer_index,
    phase, calls, gpu_time_s). ``time_share`` sums to 1 within each phase; with
    ``pass_energy_j``, ``energy_j`` sums to it over all rows.
    """
    phase_time_s: dict[str, float] = {}
    phase_rows: dict[str, int] = {}
    for t in times:
        phase_time_s[t.phase] = phase_time_s.get(t.phase, 0.0) + t.gpu_time_s
        phase_rows[t.phase] = phase_rows.get(t.phase, 0) + 1

    def share(t: ModuleTime) -> float:
        total = phase_time_s[t.phase]
        # Zero measured time in a whole phase cannot be split by time: split evenly.
        return t.gpu_time_s / total if total > 0 else 1.0 / phase_rows[t.phase]

    phase_j: dict[str, float] | None = None
    method: str | None = None
    if pass_energy_j is not None and times:
        measured = phase_energy_j or {}
        usable = {p: w for p in phase_time_s if (w := measured.get(p)) is not None and w >= 0}
        weights: dict[str, float]
        if len(usable) == len(phase_time_s) and sum(usable.values()) > 0:
            weights = usable
            method = METHOD_PHASE
        else:
            # No usable phase split: weigh phases by their GPU time (evenly if there is none).
            timed = sum(phase_time_s.values()) > 0
            weights = {p: t if timed else 1.0 for p, t in phase_time_s.items()}
            method = METHOD_WINDOW
        total_w = sum(weights.values())
        phase_j = {p: pass_energy_j * w / total_w for p, w in weights.items()}

    return [LayerRecord(
        trial_id=trial_id, module=t.module, module_type=t.module_type, layer_index=t.layer_index, phase=t.phase,
        calls=t.calls, gpu_time_s=t.gpu_time_s, gpu_time_method=t.gpu_time_method, time_share=share(t),
        energy_j=phase_j[t.phase] * share(t) if phase_j is not None else None, method=method,
    ) for t in times]
