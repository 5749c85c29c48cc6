"""Figures every window reports the same way, offline and serving alike: a mean and its
percentiles, named as the trials table's columns are (``{name}_s``, ``{name}_p{q}_s``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if len(values) else None


def percentiles(name: str, values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float | None]:
    """``{name}_s`` (the mean) and ``{name}_p{q}_s`` for each q: one naming for every latency column."""
    out = {f"{name}_s": mean(values)}
    out.update({f"{name}_p{q}_s": percentile(values, q) for q in qs})
    return out
