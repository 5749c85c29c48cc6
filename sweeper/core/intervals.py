"""Confidence intervals of a mean, from a handful of samples (Student's t).

The measured window's headline figures are judged over blocks of at least a
second (see ``actors.convergence``): a few to a few dozen samples, where the
normal approximation's 1.96 would understate the interval by up to half.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# The 97.5th percentile of Student's t for 1..30 degrees of freedom (two-sided 95 %).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
_Z975 = 1.959964


def t975(df: int) -> float:
    """The two-sided 95 % quantile of Student's t with ``df`` degrees of freedom.

    Tabled up to 30; beyond, the Cornish-Fisher expansion around the normal
    quantile, within 1e-4 of the exact value there and closer as ``df`` grows.
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class MeanInterval:
    """The mean of ``n`` samples and the half-width of its 95 % confidence interval."""

    mean: float
    half_width: float
    n: int

    @property
    def relative(self) -> float:
        """The half-width as a share of the mean (inf for a zero mean)."""
        return self.half_width / abs(self.mean) if self.mean else math.inf


def mean_interval(samples: Sequence[float]) -> MeanInterval | None:
    """The 95 % interval of the mean of ``samples`` (treated as independent); None below two."""
    if len(samples) < 2:
        return None
    mean = statistics.fmean(samples)
    half = t975(len(samples) - 1) * statistics.stdev(samples) / math.sqrt(len(samples))
    return MeanInterval(mean, half, len(samples))
