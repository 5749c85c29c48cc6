"""Repeats are summarised, never picked apart; comparisons say when a difference is inside the noise."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.analysis.test_report import build_gpu_results


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory) -> Path:
    return build_gpu_results(tmp_path_factory.mktemp("h200-repeats") / "quantization")


def _with_repeats(trials, factors: list[float]):
    """The trials repeated, repeat k's J/token and throughput scaled by ``factors[k]`` (a noisy host)."""
    import pandas as pd

    copies = []
    for k, factor in enumerate(factors):
        c = trials.copy()
        c["repeat"] = k
        c["trial_id"] = c["trial_id"] + f"-r{k}"
        c["energy_per_token_j"] = c["energy_per_token_j"] / factor
        c["throughput_tok_s"] = c["throughput_tok_s"] * factor
        copies.append(c)
    return pd.concat(copies, ignore_index=True)


def test_median_interval_is_a_seeded_bootstrap_of_the_median():
    from sweeper.analysis.tables import median_interval

    assert median_interval([5.0]) == (5.0, pytest.approx(float("nan"), nan_ok=True),
                                      pytest.approx(float("nan"), nan_ok=True))
    median, lo, hi = median_interval([1.0, 3.0])
    assert (median, lo, hi) == (2.0, 1.0, 3.0)  # two repeats: the range they span
    values = [10.0 + 0.1 * i for i in range(21)]
    median, lo, hi = median_interval(values)
    assert median == pytest.approx(11.0) and lo < median < hi and hi - lo < 1.0
    assert median_interval(values) == (median, lo, hi)  # reproducible


def test_the_best_configuration_is_judged_on_medians_not_the_lucky_repeat(gpu_results):
    import pandas as pd

    from sweeper.analysis.tables import best_configs

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    ok = trials[trials["status"] == "ok"]
    # A 65x lucky repeat on one configuration that is otherwise mediocre: llama-3.1-8b bf16 bs=8.
    lucky = ok[(ok["model"] == "llama-3.1-8b") & (ok["precision"] == "bf16") & (ok["batch_size"] == 8)]
    repeated = _with_repeats(trials, [1.0, 1.0, 1.0])
    repeated.loc[repeated["trial_id"] == lucky["trial_id"].iloc[0] + "-r2", "energy_per_token_j"] /= 65
    best = best_configs(repeated).set_index("model")
    row = best.loc["llama-3.1-8b"]
    plain = best_configs(trials).set_index("model").loc["llama-3.1-8b"]
    assert (row["precision"], row["batch_size"]) == (plain["precision"], plain["batch_size"]) == ("bf16", 64)
    assert row["n_repeats"] == 3
    assert row["energy_per_token_j"] == pytest.approx(plain["energy_per_token_j"])


def test_repeats_that_disagree_are_marked_with_their_interval(gpu_results):
    import pandas as pd

    from sweeper.analysis.report import build_report
    from sweeper.analysis.tables import repeat_summary

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    noisy = _with_repeats(trials, [1.0, 1.3, 0.8])
    summary = repeat_summary(noisy)
    assert len(summary) == (trials["status"] == "ok").sum()  # one row per configuration
    assert (summary["n_repeats"] == 3).all() and summary["repeats_disagree"].all()
    row = summary.iloc[0]
    assert row["throughput_tok_s_lo"] < row["throughput_tok_s"] < row["throughput_tok_s_hi"]
    steady = repeat_summary(_with_repeats(trials, [1.0, 1.01, 0.99]))
    assert not steady["repeats_disagree"].any()

    root = gpu_results.parent / "noisy"
    root.mkdir(exist_ok=True)
    noisy.to_parquet(root / "trials.parquet")
    best = build_report(root).tables[0]
    cells = dict(zip(best.headers, best.rows[0], strict=True))
    assert cells["repeats"] == "3" and "[" in cells["tok/s"] and "–" in cells["J/token"]
    assert "repeats disagree" in cells["criterion"]


def test_a_difference_inside_both_trials_noise_is_called_so(gpu_results, tmp_path):
    import pandas as pd

    from sweeper.analysis.tables import compare_sweeps

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    ok = trials["status"] == "ok"
    # The columns the actor now writes: 2 % per-iteration throughput CV over the window's iterations.
    trials.loc[ok, "iteration_throughput_cv"] = 0.02
    trials.loc[ok, "iteration_energy_cv"] = 0.01
    trials.loc[ok, "energy_per_token_uncertainty_j"] = trials.loc[ok, "energy_per_token_j"] * 0.001
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
    trials.to_parquet(a / "trials.parquet")
    shifted = trials.copy()
    small = shifted["batch_size"] == 1  # 1 % faster: inside the noise of the ~20-iteration windows
    shifted.loc[small, "throughput_tok_s"] *= 1.01
    shifted.loc[~small, "throughput_tok_s"] *= 1.5  # 50 % faster: far outside it
    shifted.to_parquet(b / "trials.parquet")
    cmp = compare_sweeps(a, b)
    assert len(cmp) == ok.sum()
    # The interval's half-width: 1.96 x the two sides' standard errors (CV / sqrt(iterations)) combined.
    pick = (trials["model"] == "llama-3.1-8b") & (trials["precision"] == "bf16") & (trials["batch_size"] == 1)
    n = trials.loc[pick, "n_iterations"].iloc[0]
    row = cmp[(cmp["model"] == "llama-3.1-8b") & (cmp["precision"] == "bf16") & (cmp["batch_size"] == 1)].iloc[0]
    assert row["throughput_noise"] / row["throughput_ratio"] == pytest.approx(1.96 * (2 * 0.02**2 / n) ** 0.5)
    assert cmp.loc[cmp["batch_size"] == 1, "throughput_within_noise"].all()
    assert not cmp.loc[cmp["batch_size"] != 1, "throughput_within_noise"].any()
    assert cmp["energy_within_noise"].all()  # J/token unchanged

    # Results from before these columns: no claim either way.
    old = tmp_path / "old"
    shutil.copytree(gpu_results, old)
    assert compare_sweeps(old, b)["throughput_within_noise"].isna().all()


def test_the_best_configuration_is_chosen_among_precise_trials(gpu_results):
    """An unstable trial (its estimate missed its bound) is not crowned while the model has a
    precise one, however good its numbers look; where every trial is unstable the row says so."""
    import pandas as pd

    from sweeper.analysis.report import _best_table
    from sweeper.analysis.results import load_results
    from sweeper.analysis.tables import best_configs

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    plain = best_configs(trials).set_index("model").loc["llama-3.1-8b"]
    flaky = trials.copy()
    winner = (flaky["model"] == "llama-3.1-8b") & (flaky["trial_id"] == plain["trial_id"])
    flaky.loc[winner, "unstable"] = True
    best = best_configs(flaky).set_index("model").loc["llama-3.1-8b"]
    assert best["trial_id"] != plain["trial_id"] and not best["unstable"] and best["set_aside"] == 1
    assert best["criterion"] == "lowest J/token"
    everyone = trials.copy()
    everyone.loc[everyone["model"] == "llama-3.1-8b", "unstable"] = True
    only = best_configs(everyone).set_index("model").loc["llama-3.1-8b"]
    assert only["trial_id"] == plain["trial_id"] and only["unstable"] and only["only_unstable"]
    assert only["criterion"] == "lowest J/token" and not best["only_unstable"]
    # The table's caption counts what was set aside.
    results = load_results(gpu_results)
    results.trials.loc[results.trials["trial_id"] == plain["trial_id"], "unstable"] = True
    assert "1 unstable configuration set aside" in _best_table(results, []).caption
