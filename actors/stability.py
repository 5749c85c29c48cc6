"""Whether a trial's figures can be trusted: one verdict, every reason in one place.

A trial is ``unstable`` when what it *reports* is imprecise or biased, not when
the process it measured was noisy. A host whose generate calls jitter by 10 %
still gives a mean known to ±2 % over enough of them; flagging it would make
the flag mean nothing (on an H100 VM the per-iteration CV rule flagged 10 of 10
trials whose intervals were ±4 %). So:

- **unstable** (offline): a headline figure's 95 % interval (throughput and, on
  GPUs, J/token, over blocks of at least a second: ``actors.convergence``) is
  wider than ``measure.max_rel_ci`` of its mean, or than ``target_rel_ci`` when
  the window measured until precise; the window is too short to judge (fewer
  than ``MIN_CI_BLOCKS`` blocks, or shorter than ``min_window_s``); GPUs were
  metered but no energy window could be computed; the idle baseline was taken
  while the power was still falling. Serving adds its own: no steady window, a
  short one, saturation, failed requests, a client that fell behind its own
  schedule (``actors.serving.lateness``: its latencies would hold its delay).
- **noisy_host**, a milder note: a per-iteration CV (throughput, energy) above
  ``max_iteration_cv``. It says something about the machine; ``repeats:`` is how
  to judge whether the noise moves the figures from run to run.

Every reason states its numbers, so a reader can tell a real imprecision from a
threshold set too tight.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from actors.convergence import MIN_CI_BLOCKS, WindowPrecision
from actors.telemetry.telemetry import MIN_STABILITY_BLOCK_S
from sweeper.core.results import Stability

if TYPE_CHECKING:
    from actors.telemetry import IdleBaseline

VERDICT_COLUMNS: tuple[str, ...] = ("unstable", "unstable_reason", "noisy_host", "noisy_host_reason")


@dataclass
class Verdict:
    """The reasons gathered while a trial's row is built; ``columns`` is the row's verdict."""

    unstable: list[str] = field(default_factory=list)
    noisy: list[str] = field(default_factory=list)
    # Whether process noise was judged at all (not for serving, nor for varied workloads,
    # whose calls differ in work by design).
    noise_judged: bool = False

    def flag(self, reason: str | None) -> None:
        if reason:
            self.unstable.append(reason)

    def part(self) -> Stability:
        return Stability(unstable=bool(self.unstable), unstable_reason="; ".join(self.unstable) or None,
                         noisy_host=bool(self.noisy) if self.noise_judged else None,
                         noisy_host_reason="; ".join(self.noisy) or None)

    # -- the checks, one per kind of reason -------------------------------------------

    def window_length(self, duration_s: float | None, floor_s: float, what: str = "window") -> None:
        if duration_s is not None and duration_s < floor_s:
            self.flag(f"{what} {duration_s:.2f} s < min_window_s {floor_s:g} s")

    def precision(self, precision: WindowPrecision, bound: float, *, bound_name: str, duration_s: float,
                  energy_expected: bool) -> None:
        """The estimate's own precision: an interval for every headline figure, within ``bound``."""
        if precision.throughput is None:
            self.flag(f"window {duration_s:.2f} s holds {precision.blocks} block(s) of >= {MIN_STABILITY_BLOCK_S:g} s, "
                      f"too few (< {MIN_CI_BLOCKS}) for a 95 % interval of its mean: lengthen the window "
                      "(min_duration_s, or max_duration_s with a target)")
            return
        figures = {"throughput": precision.throughput}
        if energy_expected:
            if precision.energy_per_token is None:
                self.flag(f"no 95 % interval of J/token: fewer than {MIN_CI_BLOCKS} blocks with energy")
            else:
                figures["J/token"] = precision.energy_per_token
        wide = [f"{name} ±{interval.relative:.1%}" for name, interval in figures.items()
                if interval.relative > bound]
        if wide:
            self.flag(f"95 % interval {', '.join(wide)} over {precision.blocks} blocks > {bound_name} {bound:.1%}")

    def no_energy_window(self, error: str | None) -> None:
        self.flag(f"no energy window ({error or 'not measured'})")

    def baseline(self, baseline: IdleBaseline | None) -> None:
        if baseline is not None and not baseline.settled:
            self.flag(f"idle power still falling after {baseline.settle_s:g} s: idle_power_w "
                      "(and active_energy_j) include the warm-up's tail")

    def process_noise(self, max_cv: float, *, throughput_cv: float | None, iterations: int,
                      energy_cv: float | None) -> None:
        self.noise_judged = True
        if throughput_cv is not None and throughput_cv > max_cv:
            self.noisy.append(f"per-iteration throughput CV {throughput_cv:.3f} (over {iterations} iterations) "
                              f"> max_iteration_cv {max_cv:g}")
        if energy_cv is not None and energy_cv > max_cv:
            self.noisy.append(f"per-iteration energy CV {energy_cv:.3f} (over blocks of >= "
                              f"{MIN_STABILITY_BLOCK_S:g} s) > max_iteration_cv {max_cv:g}")
