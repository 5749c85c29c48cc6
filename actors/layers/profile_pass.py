"""The layer-profiling pass: after a trial's headline measurement, never inside it.

Hooks perturb timing, so the headline numbers are measured without them; then
the same workload runs again, hooked, inside its own telemetry window, and the
pass reports its own slowdown (``layer_profile_overhead``). Its measured energy
is shared out over the modules by ``actors.layers.attribute``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from actors.backends.base import Backend, LoadInfo
from actors.layers import LayerProfileError
from actors.layers.attribute import LayerProfile, attribute_energy
from actors.measure import offline_batch_size
from actors.records import Generation
from actors.workload import RandomPrompts
from sweeper.core.backends import BACKENDS
from sweeper.core.results import LayerPass
from sweeper.core.trial import Trial

if TYPE_CHECKING:
    from actors.telemetry.telemetry import TelemetryBase

log = logging.getLogger(__name__)


def failed_pass(error: str) -> LayerPass:
    """The trials-table columns of a pass that raised: the trial keeps its headline."""
    return LayerPass(layer_profile_status=f"failed: {error}")


def pass_iterations(trial: Trial) -> int:
    """Generate calls in the pass: a few, like the headline's minimum (its duration floor is not repeated)."""
    return max(2, trial.measure.min_iters)


def profile_layers(backend: Backend, trial: Trial, load: LoadInfo, telemetry: TelemetryBase, *,
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
        return LayerProfile.not_applicable(f"backend {trial.backend} has no layer hooks")
    model = getattr(backend, "model", None)
    if model is None or not hasattr(model, "register_forward_pre_hook"):
        return LayerProfile.not_applicable(f"backend {trial.backend} exposes no torch module")

    # torch is imported only when a pass runs, not wherever the actor module is.
    from actors.layers.profiler import LayerProfiler
    from actors.layers.select import select_units

    try:
        units = select_units(model, granularity)
    except LayerProfileError as exc:
        return LayerProfile.not_applicable(str(exc))

    assert trial.input_len is not None  # profiling needs random prompts (the sweep file's check)
    prompts = RandomPrompts(load.vocab_size, trial.input_len, offline_batch_size(trial), trial.seed)
    iterations = pass_iterations(trial)
    profiler = LayerProfiler(model, units)
    # Timers whose marks cost host time to make prepare them for every forward (prefill +
    # output_len - 1 decodes) now, outside the window: making them in the hooks would time it.
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
    times = profiler.results()  # the readout (a synchronize, or the trace's attribution), outside the window

    overhead = ((t1 - t0) / iterations) / headline_s_per_iter - 1 if headline_s_per_iter else None
    window = getattr(handle, "window", None)
    pass_energy_j = window.energy_j if window is not None else None
    phase_energy_j = None
    if pass_energy_j is not None:
        from actors.telemetry import TelemetryError

        marks = [m for g in generations for m in g.marks]
        try:
            phase_energy_j = telemetry.phase_energy(marks)
        except TelemetryError as exc:
            log.warning("layer profile: phase energy unavailable, attributing over the window: %s", exc)
    status = "ok"
    if telemetry.active and pass_energy_j is None:
        status = f"ok; no pass energy: {getattr(handle, 'error', None) or 'window not measured'}"
    rows = attribute_energy(times, trial_id=trial.trial_id, pass_energy_j=pass_energy_j,
                            phase_energy_j=phase_energy_j)
    return LayerProfile(LayerPass(layer_profile_status=status, layer_profile_overhead=overhead,
                                  layer_profile_energy_j=pass_energy_j), rows)
