"""The measured window of each workload mode, by name (``Trial.mode``): offline, generate calls
until the window is long and precise enough (``actors.measure``); serving, a schedule of requests
(``actors.serving_measure``). Both run through one skeleton (``actors.method``); the actor looks
its trial's mode up here, and a new mode is one entry, not a branch in the actor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from actors.measure import measure_trial
from actors.serving_measure import measure_serving_trial

if TYPE_CHECKING:
    from actors.backends.base import Backend, LoadInfo
    from actors.method import Measurement
    from actors.telemetry import TelemetryBase
    from actors.workload import PromptSource
    from sweeper.core.trial import Trial


class MeasureTrial(Protocol):
    def __call__(self, backend: Backend, trial: Trial, load: LoadInfo, telemetry: TelemetryBase, *,
                 source: PromptSource | None = None) -> Measurement: ...


WINDOWS: dict[str, MeasureTrial] = {"offline": measure_trial, "serving": measure_serving_trial}


def measure_for(trial: Trial) -> MeasureTrial:
    """How ``trial``'s measured window runs."""
    return WINDOWS[trial.mode]
