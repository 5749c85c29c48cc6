"""Judging by accuracy: the best-configuration table's criterion and accuracy floor, the report's
accuracy figure, and the search's ``min_accuracy``.

The trials are a real H100 run's (BENCHMARKS §32: the bundled model on the arithmetic task, vLLM
bf16 and fp8 in-process and through ``vllm serve``, at 16 req/s and a burst), where fp8 has the
lowest J/token but bf16 the fewest joules per correct answer.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

GPU_TRIALS = ROOT / "docs" / "data" / "accuracy_smollm2-135m_h100_2026-12-07_trials.parquet"


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("accuracy") / "h100"
    root.mkdir()
    shutil.copy(GPU_TRIALS, root / "trials.parquet")
    return root


def _best(trials, **judged):
    from sweeper.analysis.tables import best_configs

    return best_configs(trials, **judged).set_index("model").loc["smollm2-135m"]


def test_the_criterion_picks_by_joules_per_correct_answer_where_asked(scored):
    import pandas as pd

    trials = pd.read_parquet(scored / "trials.parquet")
    by_token = _best(trials)
    assert (by_token["backend"], by_token["precision"], by_token["criterion"]) == ("vllm", "fp8", "lowest J/token")
    by_answer = _best(trials, criterion="energy_per_correct_j")
    assert (by_answer["backend"], by_answer["precision"]) == ("vllm", "bf16")
    assert by_answer["criterion"] == "fewest J per correct answer"
    stable = trials[(trials["status"] == "ok") & ~trials["unstable"]]
    assert by_answer["energy_per_correct_j"] == pytest.approx(stable["energy_per_correct_j"].min())
    assert by_answer["accuracy"] == pytest.approx(0.205)


def test_an_accuracy_floor_leaves_out_what_answers_less(scored):
    import pandas as pd

    trials = pd.read_parquet(scored / "trials.parquet")
    floored = _best(trials, min_accuracy=0.19)  # fp8 (0.175) is no candidate: bf16 is the cheapest per token left
    assert floored["precision"] == "bf16" and floored["criterion"] == "lowest J/token"
    nothing = _best(trials, min_accuracy=0.5)
    assert nothing["criterion"] == "no ok trial within the bounds and at accuracy ≥ 0.5"
    unscored = trials.assign(accuracy=float("nan"), energy_per_correct_j=float("nan"))
    assert _best(unscored, min_accuracy=0.1)["criterion"].startswith("no ok trial")
    fallback = _best(unscored, criterion="energy_per_correct_j")
    assert fallback["criterion"] == "highest tok/s (no J per correct answer)"


def test_the_report_judges_by_the_command_line_and_draws_accuracy_against_energy(scored):
    from sweeper.analysis.report import build_report

    report = build_report(scored, plots_wanted=["accuracy"], criterion="energy_per_correct_j", min_accuracy=0.19)
    best = report.tables[0]
    assert "accuracy" in best.headers and "J/correct" in best.headers
    row = dict(zip(best.headers, best.rows[0], strict=True))
    assert row["precision"] == "bf16" and row["criterion"].startswith("fewest J per correct answer")
    assert row["accuracy"] == "0.205"
    assert "accuracy at least 0.19 (--min-accuracy)" in best.caption
    [plot] = report.plots
    assert plot.filename == "accuracy.png" and (scored / "report" / "accuracy.png").is_file()
    left, right = plot.data["panels"]
    assert left["xlabel"].startswith("J / request") and left["ylabel"].startswith("accuracy")
    assert right["xlabel"].startswith("J / correct answer")


def test_the_frontier_holds_the_most_accurate_for_the_fewest_joules(scored):
    import pandas as pd

    from sweeper.analysis.accuracy_plots import accuracy_frontier

    front = accuracy_frontier(pd.read_parquet(scored / "trials.parquet"))
    on = front[front["on_frontier"]].sort_values("energy_per_request_j")
    # Along the front, more energy buys more accuracy, never less.
    assert on["accuracy"].is_monotonic_increasing and len(on) >= 1
    off = front[~front["on_frontier"]]
    for _, r in off.iterrows():
        assert ((on["energy_per_request_j"] <= r["energy_per_request_j"]) & (on["accuracy"] >= r["accuracy"])).any()


def test_unscored_trials_draw_no_accuracy_figure_and_cpu_runs_say_why(scored):
    import pandas as pd

    from sweeper.analysis.accuracy_plots import plot_accuracy
    from sweeper.analysis.plots import PlotNotApplicable, PlotUnavailable

    trials = pd.read_parquet(scored / "trials.parquet")
    with pytest.raises(PlotNotApplicable, match="no scored trials"):
        plot_accuracy(trials.assign(accuracy=float("nan")))
    with pytest.raises(PlotUnavailable, match="no GPU energy per request"):
        plot_accuracy(trials.assign(energy_per_request_j=float("nan")))


@pytest.mark.parametrize("flags, expected", [
    (["--criterion", "joules"], "--criterion: Input should be 'energy_per_token_j' or 'energy_per_correct_j'"),
    (["--min-accuracy", "1.5"], "--min-accuracy: Input should be less than or equal to 1"),
])
def test_bad_judging_flags_exit_2_naming_the_flag(scored, flags, expected):
    r = run_cli("report", str(scored), "--plots", "pareto", *flags)
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr


UNSCORED = """
name: judged
models: [tiny-llama]
backends: [transformers]
precisions: [fp32]
batch_sizes: [1]
workload: {dataset: arithmetic, output_len: natural, max_output_len: 16}
"""


@pytest.mark.parametrize("extra, expected", [
    ("report: {criterion: energy_per_correct_j}", "report.criterion: judges by accuracy, and the sweep scores no replies"),
    ("report: {min_accuracy: 0.3}", "report.min_accuracy: judges by accuracy"),
    ("search: {objective: {minimize: energy_per_correct_j}, budget: {trials: 2}}",
     "search.objective[0]: judges by accuracy, and the sweep scores no replies"),
    ("search: {objective: {minimize: energy_per_token_j}, constraints: {min_accuracy: 0.3}, budget: {trials: 2}}",
     "search.constraints.min_accuracy: judges by accuracy"),
])
def test_judging_by_accuracy_without_scoring_exits_2_naming_the_field(write_sweep, extra, expected):
    r = run_cli("plan", str(write_sweep(UNSCORED + extra + "\n")))
    assert r.returncode == 2 and expected in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_min_accuracy_is_a_constraint_on_each_point_s_accuracy():
    import yaml

    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep
    from sweeper.run.search import SearchRun

    sweep = parse_sweep({**yaml.safe_load(UNSCORED), "scoring": "numeric", "search": {
        "objective": {"minimize": "energy_per_correct_j"}, "constraints": {"min_accuracy": 0.5},
        "budget": {"trials": 2}}})
    search = SearchRun(make_plan(sweep, "cpu"), sweep.search, "cpu")
    assert search._violations({"accuracy": 0.4}) == ["accuracy 0.4 < 0.5"]
    assert search._violations({"accuracy": 0.5}) == []
    assert search._violations({"accuracy": None}) == ["accuracy None < 0.5"]  # unscored: cannot count
