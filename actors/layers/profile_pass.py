"""The layer-profiling pass (DESIGN §5): after a trial's headline measurement, never inside it.

Hooks perturb timing, so the headline numbers are measured without them; then
the same workload runs again, hooked, inside its own telemetry window, and the
pass reports its own slowdown (``layer_profile_overhead``).

Energy attribution (``attribute_energy``)
-----------------------------------------
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
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from actors.backends.base import Backend, Generation, LoadInfo
from actors.workload import RandomPrompts
from sweeper.core.backends import BACKENDS
from sweeper.core.trial import Trial

log = logging.getLogger(__name__)

METHOD_PHASE = "gpu_time_share_of_phase_energy"
METHOD_WINDOW = "gpu_time_share_of_window_energy"


@dataclass
class LayerProfile:
    """What the pass adds to a trial: trials-table columns and layers-table rows."""

    columns: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def not_applicable(cls, granularity: str, why: str) -> LayerProfile:
        return cls(_columns(granularity, f"not applicable: {why}"))


def _columns(granularity: str, status: str, overhead: float | None = None,
             energy_j: float | None = None) -> dict[str, Any]:
    return {"layer_profile": granularity, "layer_profile_status": status,
            "layer_profile_overhead": overhead, "layer_profile_energy_j": energy_j}


def failed_columns(granularity: str, error: str) -> dict[str, Any]:
    return _columns(granularity, f"failed: {error}")


def pass_iterations(trial: Trial) -> int:
    """Generate calls in the pass: a few, like the headline's minimum (its duration floor is not repeated)."""
    return max(2, trial.measure.min_iters)


def attribute_energy(times: list, *, pass_energy_j: float | None,
                     phase_energy_j: dict[str, float] | None) -> list[dict[str, Any]]:
    """Layers-table rows (without ``trial_id``) from per-module, per-phase GPU times.

    ``times`` holds ``ModuleTime``-like records (module, module_type,
    layer_index, phase, calls, gpu_time_s). ``time_share`` sums to 1 within
    each phase; with ``pass_energy_j``, ``energy_j`` sums to it over all rows.
    """
    phase_time_s: dict[str, float] = {}
    phase_rows: dict[str, int] = {}
    for t in times:
        phase_time_s[t.phase] = phase_time_s.get(t.phase, 0.0) + t.gpu_time_s
        phase_rows[t.phase] = phase_rows.get(t.phase, 0) + 1

    def share(t) -> float:
        total = phase_time_s[t.phase]
        # Zero measured time in a whole phase cannot be split by time: split evenly.
        return t.gpu_time_s / total if total > 0 else 1.0 / phase_rows[t.phase]

    phase_j: dict[str, float] | None = None
    method = None
    if pass_energy_j is not None and times:
        weights = {p: (phase_energy_j or {}).get(p) for p in phase_time_s}
        if all(w is not None and w >= 0 for w in weights.values()) and sum(weights.values()) > 0:
            method = METHOD_PHASE
        else:
            # No usable phase split: weigh phases by their GPU time (evenly if there is none).
            weights = {p: t if sum(phase_time_s.values()) > 0 else 1.0 for p, t in phase_time_s.items()}
            method = METHOD_WINDOW
        total_w = sum(weights.values())
        phase_j = {p: pass_energy_j * w / total_w for p, w in weights.items()}

    return [{
        "module": t.module, "module_type": t.module_type, "layer_index": t.layer_index,
        "phase": t.phase, "calls": t.calls, "gpu_time_s": t.gpu_time_s, "time_share": share(t),
        "energy_j": phase_j[t.phase] * share(t) if phase_j is not None else None,
        "method": method, "gpu_time_method": getattr(t, "gpu_time_method", None),
    } for t in times]


def profile_layers(backend: Backend, trial: Trial, load: LoadInfo, telemetry: Any, *,
                   headline_s_per_iter: float | None, clock: Callable[[], float] = time.monotonic) -> LayerProfile:
    """Run the hooked pass of ``trial``'s workload and attribute its time and energy to modules.

    Raises only on a failure of the pass itself; where hooks cannot apply
    (the backend says so, or the model has no decoder blocks) it returns a
    ``not applicable`` status and no rows.
    """
    granularity = trial.layer_profile
    if granularity is None:
        raise ValueError(f"trial {trial.trial_id} asks for no layer profile")
    spec = BACKENDS.get(trial.backend)
    if spec is None or not spec.layer_hooks:
        return LayerProfile.not_applicable(granularity, f"backend {trial.backend} has no layer hooks")
    model = getattr(backend, "model", None)
    if model is None or not hasattr(model, "register_forward_pre_hook"):
        return LayerProfile.not_applicable(granularity, f"backend {trial.backend} exposes no torch module")

    from actors.layers.profiler import LayerProfileError, LayerProfiler, select_units

    try:
        units = select_units(model, granularity)
    except LayerProfileError as exc:
        return LayerProfile.not_applicable(granularity, str(exc))

    prompts = RandomPrompts(load.vocab_size, trial.input_len, trial.batch_size, trial.seed)
    iterations = pass_iterations(trial)
    profiler = LayerProfiler(model, units)
    # Event timers: the marks for every forward (prefill + output_len - 1 decodes) are
    # made now, outside the window: making them inside the hooks would time their creation.
    profiler.reserve(iterations * trial.output_len)
    generations: list[Generation] = []
    # Hooks (and, for kernel time, the profiler session) go on before the window opens
    # and come off after it closes: starting and stopping them is host work that must
    # not fall inside the measured energy.
    with profiler, telemetry.measure(f"{trial.trial_id}/layers") as handle:
        backend.sync()
        t0 = clock()
        for i in range(iterations):  # the headline's prompts, in the same order
            profiler.begin_generate()
            generations.append(backend.generate(prompts.batch(i), trial.output_len))
        backend.sync()
        t1 = clock()
    times = profiler.results()  # the readout (events, or the profiler trace's attribution), outside the window

    overhead = ((t1 - t0) / iterations) / headline_s_per_iter - 1 if headline_s_per_iter else None
    window = getattr(handle, "window", None)
    pass_energy_j = window.energy_j if window is not None else None
    phase_energy_j = None
    if pass_energy_j is not None:
        from actors.telemetry import TelemetryError

        marks = [m for g in generations for m in g.marks]
        try:
            phase_energy_j = telemetry.meter.phase_energy(marks)
        except TelemetryError as exc:
            log.warning("layer profile: phase energy unavailable, attributing over the window: %s", exc)
    status = "ok"
    if telemetry.active and pass_energy_j is None:
        status = f"ok; no pass energy: {getattr(handle, 'error', None) or 'window not measured'}"
    rows = [{"trial_id": trial.trial_id, **r}
            for r in attribute_energy(times, pass_energy_j=pass_energy_j, phase_energy_j=phase_energy_j)]
    return LayerProfile(_columns(granularity, status, overhead, pass_energy_j), rows)
