"""One idle baseline per loaded model, taken afresh only when the GPU's idle power has moved.

A trial's active energy subtracts the idle power of its GPUs with the model
loaded, measured after the warm-up once the power has stopped falling: about
3 s per trial on an H100 (0.6-0.9 s settling, then a 2 s window on the energy
counter), 5-13 % of a small model's sweep. Within a group that power moves by a
few watts, and not in step with anything cheap to read: on an H100 warming up
from a cold start, the settled baseline of a 1B group rose 124.0 -> 126.5 W
between two trials at the same reported GPU temperature (36 C), so a rule on
temperature would have subtracted 2.5 W too little from the second trial
(12 % of its active energy).

So a later trial of the group re-checks instead of trusting: it settles as for
a fresh baseline, then reads the sampled power for ``RECHECK_S``. If that
reading is within ``idle_reuse_tolerance_w`` per GPU of the held baseline's
(the same samples' mean over its window, so that one instrument is compared
with itself; and
the baseline is younger than ``idle_reuse_max_age_s``), the held baseline
stands and the 2 s window is skipped; otherwise the window follows at once and
becomes the group's new baseline. Either way the row records the re-check's
reading (``idle_recheck_power_w``) beside the baseline it used. A new model
load, or an actor handed on to another group, starts afresh: the telemetry,
and its baseline, belong to one load.

This module holds the rule (``BaselineReuse``), which the telemetry applies; a trial asks for its
baseline and states it through ``actors.telemetry.idle``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sweeper.core.settings import MeasureSettings

# Seconds of sampled power the re-check reads: five samples at the default 0.1 s interval,
# whose mean an H100's idle readings (+-0.3 W each) pin to about 0.15 W.
RECHECK_S = 0.5


@dataclass(frozen=True)
class BaselineReuse:
    """When a baseline taken for an earlier trial of the group stands for this one."""

    tolerance_w: float  # per GPU
    max_age_s: float
    recheck_s: float = RECHECK_S

    @classmethod
    def from_settings(cls, m: MeasureSettings) -> BaselineReuse | None:
        if m.idle_reuse_tolerance_w is None:
            return None
        return cls(tolerance_w=m.idle_reuse_tolerance_w, max_age_s=m.idle_reuse_max_age_s)

    def agrees(self, held_w: float, reading_w: float, gpus: int) -> bool:
        return abs(reading_w - held_w) <= self.tolerance_w * max(gpus, 1)
