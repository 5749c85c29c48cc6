"""How far the window's figures can be trusted: their intervals, the iterations' spread, the verdict."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.results.part import Part, column


@dataclass(frozen=True)
class Intervals(Part):
    """The headline figures' 95 % intervals over the window's blocks of >= 1 s, and a precision target's outcome."""

    throughput_rel_ci95: float | None = column(
        "half-width of the 95 % confidence interval of the window's throughput over blocks of >= 1 s "
        "(Student's t, blocks as independent samples), as a share of the mean; null with fewer than 3 "
        "blocks or in serving mode")
    energy_per_token_rel_ci95: float | None = column("the same for J/token over the same blocks (GPUs only)")
    ci_blocks: int | None = column("blocks of >= 1 s the intervals were computed over")
    target_met: bool | None = column(
        "with target_rel_ci: every headline interval over the whole window is within it (false: "
        "max_duration_s came first, or the last blocks widened an interval the stop judged on settled "
        "blocks; the trial is then flagged unstable); null: no target")


@dataclass(frozen=True)
class IterationNoise(Part):
    """How much the window's iterations varied: information about the host, not an interval."""

    iteration_energy_cv: float | None = column(
        "coefficient of variation of energy per iteration over blocks of >= 1 s of iterations (null with "
        "fewer than two blocks)")
    iteration_throughput_cv: float | None = column(
        "coefficient of variation of output tokens/s across the window's generate calls (null with fewer "
        "than 3); CPU runs too")


@dataclass(frozen=True)
class Stability(Part):
    """The verdict on the window's figures: whether they can be trusted, and notes on the host."""

    unstable: bool | None = column(
        "the reported figures are imprecise or biased (see unstable_reason): a headline 95 % interval "
        "wider than max_rel_ci (or a missed target_rel_ci), a window too short to judge, no energy window "
        "on GPUs, an idle baseline taken before the power settled; serving: no or a short steady window, "
        "saturation, failed requests, a client behind its schedule (client_behind)")
    unstable_reason: str | None = column("why the trial is flagged unstable, every reason with its numbers")
    noisy_host: bool | None = column(
        "the host's per-iteration noise was above max_iteration_cv although the estimate may be tight: "
        "information about the machine, not a verdict on the figures (repeats judge run-to-run noise); "
        "null: not judged (serving, varied prompts or replies)")
    noisy_host_reason: str | None = column("which per-iteration CV exceeded max_iteration_cv, with its value")
