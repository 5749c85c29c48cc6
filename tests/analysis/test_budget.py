"""Energy priced: the sweep file's report block, plan.json, and the derived columns everywhere the trials are read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.analysis.test_report import build_gpu_results
from tests.conftest import run_cli

SWEEP = """
name: priced
models: tiny-llama
backends: noop
precisions: fp32
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
"""


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory) -> Path:
    return build_gpu_results(tmp_path_factory.mktemp("h200-priced") / "quantization")


def test_the_report_block_is_validated_and_leaves_trial_ids_alone(write_sweep):
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import load_sweep

    plain = load_sweep(write_sweep(SWEEP, "plain.yaml"))
    priced = load_sweep(write_sweep(SWEEP + "report: {grid_intensity_g_per_kwh: 380, price_per_kwh: 0.15}\n",
                                    "priced.yaml"))
    assert priced.report.grid_intensity_g_per_kwh == 380 and priced.report.price_per_kwh == 0.15
    ids = [t.trial_id for t in expand(plain, check_hub=False)[0]]
    assert ids == [t.trial_id for t in expand(priced, check_hub=False)[0]]


@pytest.mark.parametrize(("block", "field"), [
    ("{grid_intensity_g_per_kwh: -1}", "report.grid_intensity_g_per_kwh"),
    ("{price_per_kwh: .nan}", "report.price_per_kwh"),
    ("{price_per_kwh_usd: 1}", "report.price_per_kwh_usd"),
])
def test_a_bad_report_block_is_one_line_naming_the_field(write_sweep, block, field):
    r = run_cli("plan", str(write_sweep(SWEEP + f"report: {block}\n")))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert field in r.stderr


def _record_pricing(root: Path, **report: float) -> None:
    import pandas as pd

    from sweeper.core.settings import ReportSettings
    from sweeper.run.storage import ResultStore

    ids = pd.read_parquet(root / "trials.parquet", columns=["trial_id"])["trial_id"]
    ResultStore(str(root)).write_plan("quantization", ids, ReportSettings(**report))


def test_columns_follow_the_recorded_block_and_are_null_without_it(gpu_results, tmp_path):
    from sweeper.analysis.results import load_results

    root = Path(shutil.copytree(gpu_results, tmp_path / "q"))
    trials = load_results(root).trials
    assert trials["co2e_g_per_1k_tokens"].isna().all() and trials["cost_per_1m_tokens"].isna().all()

    _record_pricing(root, grid_intensity_g_per_kwh=400.0, price_per_kwh=0.20)
    trials = load_results(root).trials
    ok = trials[trials["energy_per_token_j"].notna()]
    row = ok.iloc[0]
    # 1 kWh = 3.6 MJ: grams per 1,000 tokens and money per 1,000,000 tokens
    assert row["co2e_g_per_1k_tokens"] == pytest.approx(row["energy_per_token_j"] * 1000 / 3.6e6 * 400)
    assert row["cost_per_1m_tokens"] == pytest.approx(row["energy_per_token_j"] * 1e6 / 3.6e6 * 0.20)
    # No energy measured (a failed or skipped row): null, never zero.
    assert trials.loc[trials["energy_per_token_j"].isna(), "cost_per_1m_tokens"].isna().all()


def test_query_and_report_carry_them_and_the_flags_take_the_blocks_place(gpu_results, tmp_path):
    from sweeper.analysis.query import run_query
    from sweeper.analysis.report import build_report

    root = Path(shutil.copytree(gpu_results, tmp_path / "q"))
    _record_pricing(root, price_per_kwh=0.10)
    result = run_query(root, "SELECT energy_per_token_j, cost_per_1m_tokens, co2e_g_per_1k_tokens FROM trials "
                             "WHERE energy_per_token_j IS NOT NULL ORDER BY 1 LIMIT 1")
    energy, cost, co2 = result.rows[0]
    assert cost == pytest.approx(energy * 1e6 / 3.6e6 * 0.10) and co2 is None

    report = build_report(root, grid_intensity_g_per_kwh=50.0)  # the flag adds; the recorded price stays
    page = report.path.read_text()
    assert "grid intensity: 50 gCO2e/kWh" in page and "energy price: 0.1 per kWh" in page
    best = report.tables[0]
    assert "gCO2e/1k tok" in best.headers and "cost/1M tok" in best.headers
    j_col, cost_col = best.headers.index("J/token"), best.headers.index("cost/1M tok")
    for row in best.rows:
        assert float(row[cost_col]) == pytest.approx(float(row[j_col]) * 1e6 / 3.6e6 * 0.10, rel=1e-3)


def test_a_bad_pricing_flag_is_exit_2(gpu_results, tmp_path):
    root = Path(shutil.copytree(gpu_results, tmp_path / "q"))
    r = run_cli("report", str(root), "--price-per-kwh", "-1")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "price-per-kwh" in r.stderr
