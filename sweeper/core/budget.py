"""Energy in what users budget in: grams of CO2-equivalent and money per tokens.

Both are straight conversions of a trial's measured GPU energy per output token
(``energy_per_token_j``: every GPU the trial held, over its measured window); the
host, the network and the data centre's cooling are not in it, so these are lower
bounds of what a deployment spends (multiply by the facility's PUE for cooling).
One registry, ``BUDGET_COLUMNS``, feeds the analysis tables, ``sweeper query``'s
view, the report's best-configuration table and the schema document.
"""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.settings import ReportSettings

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class BudgetColumn:
    name: str
    setting: str  # the ReportSettings field that prices a kWh
    tokens: int  # output tokens the figure is for
    header: str  # the report's column header
    doc: str

    def factor(self, report: ReportSettings) -> float | None:
        """What one J/token is worth in this column; None when the setting is not given."""
        per_kwh = getattr(report, self.setting)
        return None if per_kwh is None else self.tokens / J_PER_KWH * per_kwh

    def of(self, energy_per_token_j: float | None, report: ReportSettings) -> float | None:
        factor = self.factor(report)
        if factor is None or energy_per_token_j is None or energy_per_token_j != energy_per_token_j:
            return None
        return energy_per_token_j * factor


BUDGET_COLUMNS: tuple[BudgetColumn, ...] = (
    BudgetColumn("co2e_g_per_1k_tokens", "grid_intensity_g_per_kwh", 1_000, "gCO2e/1k tok",
                 "grams CO2e per 1,000 output tokens: energy_per_token_j x 1,000 / 3.6e6 x "
                 "report.grid_intensity_g_per_kwh (GPU energy only); null without it"),
    BudgetColumn("cost_per_1m_tokens", "price_per_kwh", 1_000_000, "cost/1M tok",
                 "price of 1,000,000 output tokens' energy: energy_per_token_j x 1e6 / 3.6e6 x "
                 "report.price_per_kwh (GPU energy only); null without it"),
)
