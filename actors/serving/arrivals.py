"""When serving mode's requests arrive: a seeded arrival process.

Gaps between arrivals are drawn from a gamma distribution of shape
``burstiness`` and mean ``1 / request_rate`` (shape 1 is a Poisson process; below
1 burstier, above 1 more regular), as vLLM's ``bench serve`` draws them;
``constant`` spaces them exactly; an infinite rate sends every request at time 0.
"""

from __future__ import annotations

import math

import numpy as np

from sweeper.core.settings import ServingSettings

# The arrivals' stream of the seed: distinct from the prompts' streams.
_ARRIVAL_STREAM = 7_919


def arrival_offsets(n: int, request_rate: float, arrival: str, burstiness: float, seed: int) -> np.ndarray:
    """Seconds from the run's start at which each of ``n`` requests arrives (non-decreasing).

    The first request arrives after one gap, not at 0, so that a rate's first
    arrival is as random as the rest (vLLM does the same).
    """
    if n <= 0:
        return np.zeros(0)
    if math.isinf(request_rate):
        return np.zeros(n)
    mean_gap_s = 1.0 / request_rate
    if arrival == "constant":
        gaps = np.full(n, mean_gap_s)
    else:
        shape = 1.0 if arrival == "poisson" else burstiness
        rng = np.random.default_rng([seed, _ARRIVAL_STREAM])
        gaps = rng.gamma(shape=shape, scale=mean_gap_s / shape, size=n)
    return np.cumsum(gaps)


def run_offsets(settings: ServingSettings, *, request_rate: float, seed: int, stream: int = 0) -> np.ndarray:
    """When the run's requests (or conversations: their first turns) arrive, in seconds from its
    start: ``num_prompts`` of them, or as many as arrive within ``duration_s``."""
    rate = request_rate
    if settings.num_prompts is not None:
        n = settings.num_prompts
    else:
        # duration_s alone: enough arrivals to fill it (the checks below cut the rest).
        assert settings.duration_s is not None  # the sweep file's validation guarantees one of the two
        n = max(1, math.ceil(settings.duration_s * rate * 1.5 + 10))
    offsets = arrival_offsets(n, rate, settings.arrival, settings.burstiness, seed + stream * 1_000_003)
    if settings.duration_s is not None and not math.isinf(rate):
        offsets = offsets[offsets <= settings.duration_s]
        if offsets.size == 0:
            offsets = np.zeros(1)
    return offsets
