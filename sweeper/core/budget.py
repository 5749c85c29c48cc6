"""Energy in what users budget in: grams of CO2-equivalent and money per tokens.

Both are straight conversions of a trial's measured GPU energy per output token
(``energy_per_token_j``: every GPU the trial held, over its measured window); the
host, the network and the data centre's cooling are not in it, so these are lower
bounds of what a deployment spends (multiply by the facility's PUE for cooling).
"""

from __future__ import annotations

J_PER_KWH = 3.6e6

# The derived columns: name -> (the setting that prices it, tokens per unit)
BUDGET_COLUMNS: dict[str, tuple[str, int]] = {
    "co2e_g_per_1k_tokens": ("grid_intensity_g_per_kwh", 1_000),
    "cost_per_1m_tokens": ("price_per_kwh", 1_000_000),
}
BUDGET_DOCS = {
    "co2e_g_per_1k_tokens": "grams CO2e per 1,000 output tokens: energy_per_token_j x 1,000 / 3.6e6 x "
                            "report.grid_intensity_g_per_kwh (GPU energy only); null without it",
    "cost_per_1m_tokens": "price of 1,000,000 output tokens' energy: energy_per_token_j x 1e6 / 3.6e6 x "
                          "report.price_per_kwh (GPU energy only); null without it",
}


def per_tokens(energy_per_token_j: float | None, per_kwh: float | None, tokens: int) -> float | None:
    """``per_kwh`` (grams or money per kWh) spent on ``tokens`` output tokens; None if either is unknown."""
    if energy_per_token_j is None or per_kwh is None or energy_per_token_j != energy_per_token_j:
        return None
    return energy_per_token_j * tokens / J_PER_KWH * per_kwh
