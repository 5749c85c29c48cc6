"""One idle baseline per loaded model, taken afresh only when the GPU has moved.

A trial's active energy subtracts the idle power of its GPUs with the model
loaded, measured after the warm-up once the power has stopped falling: about
3 s per trial on an H100 (settling, then a 2 s window), 8 % of a small model's
sweep. Within a group that power changes little, and what changes it is heat:
a warmer die leaks more. Over one H100 group of four vLLM trials the settled
baseline rose 122.1 -> 125.8 W as the GPU warmed 35.3 -> 42.0 C (0.5-0.8 W per
degree), while two transformers trials at 34.0 and 34.2 C read 119.9 and
120.7 W. So a later trial reuses the group's baseline while every held GPU is
within ``idle_reuse_delta_c`` of the temperature it had when the baseline was
taken (both read at the same point: the end of a warm-up), and the baseline
is younger than ``idle_reuse_max_age_s`` (a bound on drift that heat does not
explain); otherwise it takes a fresh one, which the next trials then compare
with. A new model load (or a handed-on actor) always starts afresh: the
telemetry, and its baseline, belong to one load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.telemetry.meter import IdleBaseline
    from actors.telemetry.telemetry import TelemetryBase
    from sweeper.core.settings import MeasureSettings


@dataclass(frozen=True)
class BaselineReuse:
    """When a baseline taken for an earlier trial of the group stands for this one."""

    max_delta_c: float
    max_age_s: float

    @classmethod
    def from_settings(cls, m: MeasureSettings) -> BaselineReuse | None:
        if m.idle_reuse_delta_c is None:
            return None
        return cls(max_delta_c=m.idle_reuse_delta_c, max_age_s=m.idle_reuse_max_age_s)

    def allows(self, baseline: IdleBaseline, temperatures_c: tuple[int | None, ...], now_s: float) -> bool:
        """Every GPU read now and then, within ``max_delta_c`` of then; young enough."""
        if now_s - baseline.taken_at_s > self.max_age_s:
            return False
        then = baseline.temperatures_c
        if not then or len(then) != len(temperatures_c):
            return False
        return all(a is not None and b is not None and abs(a - b) <= self.max_delta_c
                   for a, b in zip(then, temperatures_c, strict=True))


def trial_baseline(telemetry: TelemetryBase, m: MeasureSettings) -> tuple[IdleBaseline | None, dict[str, Any]]:
    """A trial's idle baseline, asked for at the end of its warm-up, and its row's columns;
    None without GPUs or with ``idle_s: 0``."""
    temperatures = telemetry.temperatures_c()
    if not telemetry.active or m.idle_s <= 0:
        return None, baseline_columns(None, temperatures)
    baseline = telemetry.idle_baseline(m.idle_s, BaselineReuse.from_settings(m))
    return baseline, baseline_columns(baseline, temperatures)


def baseline_columns(baseline: IdleBaseline | None, temperatures_c: tuple[int | None, ...]) -> dict[str, Any]:
    """The trial row's baseline columns (besides ``idle_power_w``, which the energy columns carry)."""
    read = [t for t in temperatures_c if t is not None]
    return {
        "idle_settle_s": baseline.settle_s if baseline is not None else None,
        "idle_baseline_reused": baseline.reused if baseline is not None else None,
        "idle_baseline_age_s": baseline.age_s if baseline is not None else None,
        "warm_temperature_c": float(max(read)) if read else None,
    }
