"""How precise a measured window's headline figures are, and when it has measured enough.

The window's generate calls are merged into consecutive blocks of at least a
second (``iteration_blocks``: NVML's energy counter moves about every 100 ms,
so a shorter block's energy is resolved only to tens of per cent). Each block
gives one throughput (tokens / seconds) and, on GPUs, one J/token; the 95 %
confidence interval of their mean (Student's t, blocks taken as independent)
is the figure's precision. ``measure.target_rel_ci`` ends a window once every
headline figure's half-width is within that share of its mean, bounded below
by ``min_duration_s`` / ``min_iters`` and above by ``max_duration_s``.

Blocks are treated as independent samples. A drift slower than the window
(a GPU warming for minutes) is not independent noise: the interval then
understates the uncertainty. The per-iteration CVs still show it (``noisy_host``,
which is not a verdict), and ``repeats:`` measure it; nothing here flags it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from actors.records import Generation
from actors.telemetry import TelemetryBase, TelemetryError
from actors.telemetry.telemetry import MIN_STABILITY_BLOCK_S, iteration_blocks
from sweeper.core.intervals import MeanInterval, mean_interval
from sweeper.core.results import Intervals

log = logging.getLogger(__name__)

# Fewer blocks give a t quantile so wide (12.7 at two) that no target is met by luck alone.
MIN_CI_BLOCKS = 3
# Mid-window, a block's energy is read only once it ended this long ago: the counter
# curve near "now" has no update after it yet and would be extrapolated.
ENERGY_SETTLE_S = 0.5


@dataclass(frozen=True)
class WindowPrecision:
    """The 95 % intervals of the window's headline figures over its blocks (None: too few)."""

    throughput: MeanInterval | None
    energy_per_token: MeanInterval | None
    blocks: int

    def worst_relative(self) -> float | None:
        """The widest relative half-width among the figures measured; None when none is."""
        rels = [i.relative for i in (self.throughput, self.energy_per_token) if i is not None]
        return max(rels) if rels else None

    def meets(self, target_rel: float, *, energy_expected: bool) -> bool:
        """Every headline figure measured, from enough blocks, within ``target_rel``."""
        if self.throughput is None or (energy_expected and self.energy_per_token is None):
            return False
        worst = self.worst_relative()
        return worst is not None and worst <= target_rel

    def part(self, target_rel: float | None, energy_expected: bool) -> Intervals:
        return Intervals(
            throughput_rel_ci95=self.throughput.relative if self.throughput is not None else None,
            energy_per_token_rel_ci95=self.energy_per_token.relative if self.energy_per_token is not None else None,
            ci_blocks=self.blocks,
            target_met=None if target_rel is None else self.meets(target_rel, energy_expected=energy_expected),
        )


def window_precision(generations: list[Generation], telemetry: TelemetryBase,
                     energy_before_s: float | None = None) -> WindowPrecision:
    """The intervals over the calls so far; energy only from blocks that ended before
    ``energy_before_s`` (None: every block, the window being closed)."""
    bounds = [(g.t_start_s, g.t_end_s) for g in generations]
    if not bounds:
        return WindowPrecision(None, None, 0)
    blocks = iteration_blocks(bounds, MIN_STABILITY_BLOCK_S)
    tokens, start = [], 0
    for _, _, count in blocks:
        tokens.append(sum(g.output_tokens for g in generations[start:start + count]))
        start += count
    rates = [n / (t1 - t0) for n, (t0, t1, _) in zip(tokens, blocks, strict=True) if t1 > t0]
    throughput = mean_interval(rates) if len(rates) >= MIN_CI_BLOCKS else None
    energy = None
    if telemetry.active:
        settled = [(b, n) for b, n in zip(blocks, tokens, strict=True)
                   if n > 0 and (energy_before_s is None or b[1] <= energy_before_s)]
        if len(settled) >= MIN_CI_BLOCKS:
            try:
                joules = telemetry.energies_between([(t0, t1) for (t0, t1, _), _ in settled])
                energy = mean_interval([j / n for j, (_, n) in zip(joules, settled, strict=True)])
            except TelemetryError as exc:
                log.warning("block energies unavailable: %s", exc)
    return WindowPrecision(throughput, energy, len(blocks))
