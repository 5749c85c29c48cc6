"""A trial's idle baseline: asked of its telemetry at the end of the warm-up (reused within the
group by ``actors.telemetry.baseline``'s rule), and stated as the trial's result part."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.telemetry.baseline import BaselineReuse
from sweeper.core.results import Baseline

if TYPE_CHECKING:
    from actors.telemetry.meter import IdleBaseline
    from actors.telemetry.telemetry import TelemetryBase
    from sweeper.core.settings import MeasureSettings


def trial_baseline(telemetry: TelemetryBase, m: MeasureSettings) -> tuple[IdleBaseline | None, Baseline]:
    """A trial's idle baseline, asked for at the end of its warm-up, and its result part;
    None (and an empty part) without GPUs or with ``idle_s: 0``."""
    if not telemetry.active or m.idle_s <= 0:
        return None, Baseline()
    baseline = telemetry.idle_baseline(m.idle_s, BaselineReuse.from_settings(m))
    return baseline, baseline_part(baseline)


def baseline_part(baseline: IdleBaseline | None) -> Baseline:
    """The trial's baseline as its result states it."""
    if baseline is None:
        return Baseline()
    return Baseline(idle_power_w=baseline.power_w, idle_settle_s=baseline.settle_s,
                    idle_baseline_reused=baseline.reused, idle_baseline_age_s=baseline.age_s,
                    idle_recheck_power_w=baseline.recheck_power_w,
                    # Each GPU's own, in the order of gpu_uuids: they sum to idle_power_w.
                    gpu_idle_power_w=[g.avg_power_w for g in baseline.window.gpus])
