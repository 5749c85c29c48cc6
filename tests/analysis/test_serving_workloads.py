"""``sweeper report``'s plots of the workloads people serve now: energy per conversation turn
(from requests.parquet's ``turn``) and energy per request with prefix caching.

The results directories are the real H100 serving sweep's trials table
(docs/data/sweep_serving-gpu_h100_2026-11-24_trials.parquet), with a requests.parquet
of replayed conversations written beside it, or with caching variants of its trials.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.testing import assert_allclose

from tests.analysis.test_report import SERVING_TRIALS, _results_dir, check_figures
from tests.conftest import ROOT

# Trials of the serving sweep at 24 requests/s, one per engine configuration (max_num_seqs
# 128, 256 and 32; the last saturated and unstable), and its one offline trial.
AT_24 = {"014d9ce860b23de1": "bf16 max_num_seqs=256 rate=24/s",
         "6c5e5a0e6f01a009": "bf16 max_num_seqs=128 rate=24/s",
         "aa8f9e45e1e1018d": "bf16 max_num_seqs=32 rate=24/s"}
REPEAT_ID = "6c5e5a0e6f01a00r"  # a second repeat of the max_num_seqs=128 trial
OFFLINE_ID = "4ff99b1dddcc67e4"
REAL_REQUESTS = ROOT / "docs" / "data" / "sweep_serving-gpu_h100_2026-11-24_requests.parquet"


def _requests_table(rows: list[dict]) -> pa.Table:
    """requests.parquet as the schema has it, with the conversation columns added where this
    checkout's sweeper.core.schema does not declare them yet."""
    from sweeper.core.schema import arrow_schema

    schema = arrow_schema("requests")
    for name in ("conversation_id", "turn"):
        if name not in schema.names:
            schema = schema.append(pa.field(name, pa.int64()))
    return pa.Table.from_pylist(rows, schema=schema)


def _trials_with_repeat(directory: Path) -> Path:
    """The serving sweep's trials plus a second repeat of the max_num_seqs=128 trial at 24/s."""
    import pandas as pd

    from sweeper.core.schema import to_table

    trials = to_table("trials", pq.read_table(SERVING_TRIALS)).to_pandas()
    repeat = trials[trials["trial_id"] == "6c5e5a0e6f01a009"].copy()
    repeat["trial_id"], repeat["repeat"] = REPEAT_ID, 1
    directory.mkdir(parents=True)
    table = pa.Table.from_pandas(pd.concat([trials, repeat], ignore_index=True), preserve_index=False)
    pq.write_table(to_table("trials", table), directory / "trials.parquet")
    return directory


def _conversation_rows() -> list[dict]:
    """Each trial at 24/s replays 12 conversations of 1 to 4 turns (conversation k has 1 + k % 4),
    each turn costing more than the last. Around them, requests the plot must not count (failed,
    finished outside the steady window, no attributed energy), requests that are no turn of any
    conversation, and the offline trial's requests (no turn)."""
    rows: list[dict] = []

    def add(trial_id: str, **values) -> None:
        rows.append({"trial_id": trial_id, "request_index": len(rows), "input_len": 256, "output_tokens": 128,
                     "in_window": True, "error": None, **values})

    for trial_id, first_j in zip([*AT_24, REPEAT_ID], (10.0, 20.0, 30.0, 22.0), strict=True):
        for k in range(12):
            for turn in range(1 + k % 4):
                add(trial_id, conversation_id=k, turn=turn, energy_j=first_j + 3.0 * turn + 0.25 * k)
        add(trial_id, conversation_id=0, turn=1, energy_j=999.0, in_window=False)  # in the drain
        add(trial_id, conversation_id=1, turn=0, energy_j=999.0, error="timeout")
        add(trial_id, conversation_id=2, turn=2, energy_j=None)
        add(trial_id, conversation_id=None, turn=None, energy_j=500.0)  # a plain request
    add(OFFLINE_ID, iteration=0, conversation_id=None, turn=None, energy_j=7.0, in_window=None)
    return rows


def _expected_means(rows: list[dict]) -> dict[tuple[str, int], tuple[float, int]]:
    """(series, turn) -> (mean energy, requests), straight from the rows written."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df = df[df["turn"].notna() & df["error"].isna() & (df["in_window"] == True) & df["energy_j"].notna()]  # noqa: E712
    df["series"] = df["trial_id"].map({**AT_24, REPEAT_ID: AT_24["6c5e5a0e6f01a009"]})
    grouped = df.groupby(["series", "turn"])["energy_j"].agg(["mean", "size"])
    return {(s, int(t)): (float(r["mean"]), int(r["size"])) for (s, t), r in grouped.iterrows()}


@pytest.fixture
def conversations(tmp_path) -> tuple[Path, list[dict]]:
    root = _trials_with_repeat(tmp_path / "conversations")
    rows = _conversation_rows()
    pq.write_table(_requests_table(rows), root / "requests.parquet")
    return root, rows


def _plot(report, filename: str):
    found = [p for p in report.plots if p.filename == filename]
    return found[0] if found else None


# -- energy per turn --------------------------------------------------------------------------


def test_energy_per_turn_is_each_configurations_mean_over_its_measured_requests(conversations):
    from sweeper.analysis.results import load_results
    from sweeper.analysis.serving_plots import turn_energy

    root, rows = conversations
    results = load_results(root)
    data = turn_energy(results.trials, results.turn_energy())
    expected = _expected_means(rows)
    got = {(r.series, int(r.turn)): (r.energy_per_request_j, int(r.n_requests)) for r in data.itertuples()}
    assert got.keys() == expected.keys()
    for key, (mean, n) in expected.items():
        assert got[key][0] == pytest.approx(mean) and got[key][1] == n, key
    # The repeat's requests are pooled into its configuration's means: twice the conversations.
    assert got[(AT_24["6c5e5a0e6f01a009"], 0)][1] == 2 * got[(AT_24["014d9ce860b23de1"], 0)][1] == 24
    assert got[(AT_24["014d9ce860b23de1"], 3)][1] == 3  # conversations 3, 7 and 11 reach a fourth turn
    assert set(data["model"]) == {"llama-3.1-8b"}
    flagged = data.groupby("series")[["saturated", "unstable"]].first()
    assert flagged.loc[AT_24["aa8f9e45e1e1018d"]].tolist() == [True, True]
    assert flagged.loc[AT_24["014d9ce860b23de1"]].tolist() == [False, False]


def test_report_draws_energy_per_turn_with_the_requests_behind_each_point(conversations):
    from sweeper.analysis.report import PLOT_FILES, build_report

    root, rows = conversations
    report = build_report(root, "html", plots_wanted=["energy_per_turn"])
    plot = _plot(report, "energy_per_turn.png")
    assert plot is not None and "energy_per_turn.png" in PLOT_FILES
    assert (root / "report" / "energy_per_turn.png").read_bytes() == plot.png
    page = report.path.read_text()
    assert 'data-file="energy_per_turn.png"' in page and "steady window" in plot.caption
    assert not any("turn" in note for note in report.notes)
    check_figures({"energy_per_turn.png": plot.data}, page)  # readable log ticks, no overlapping labels

    energy, counts = plot.data["panels"]
    assert energy["ylabel"] == "J / request (mean)" and counts["ylabel"] == "requests measured"
    assert energy["xlabel"].startswith("turn") and energy["xticks"] == ["0", "1", "2", "3"]
    expected = _expected_means(rows)
    lines = {s["label"]: s["points"] for s in energy["series"] if s["kind"] == "line"}
    ns = {s["label"]: s["points"] for s in counts["series"] if s["kind"] == "line"}
    assert set(lines) == set(ns) == set(AT_24.values())
    for series in AT_24.values():
        turns = sorted(t for s, t in expected if s == series)
        assert_allclose(lines[series], [[t, expected[(series, t)][0]] for t in turns])
        assert ns[series] == [[float(t), float(expected[(series, t)][1])] for t in turns]
    # Each configuration's energy grows with the turn, as the rows were written.
    assert all(b[1] > a[1] for points in lines.values() for a, b in zip(points, points[1:], strict=False))


@pytest.mark.slow
def test_energy_per_turn_is_left_out_without_conversations(tmp_path):
    """No requests.parquet, one without a turn column (the real sweep's), and one whose turns are
    all null: no plot, and no note (the sweep replayed no conversations)."""
    from sweeper.analysis.report import build_report
    from sweeper.analysis.results import load_results
    from sweeper.analysis.serving_plots import PlotNotApplicable, plot_energy_per_turn

    bare = _results_dir(SERVING_TRIALS, tmp_path / "bare")
    report = build_report(bare, "md", plots_wanted=["energy_per_turn"])
    assert _plot(report, "energy_per_turn.png") is None and not (bare / "report" / "energy_per_turn.png").exists()
    assert not any("turn" in note for note in report.notes)

    real = _results_dir(SERVING_TRIALS, tmp_path / "real")
    pq.write_table(pq.read_table(REAL_REQUESTS), real / "requests.parquet")
    assert "turn" not in pq.read_schema(real / "requests.parquet").names
    assert load_results(real).turn_energy() is None

    no_turns = _results_dir(SERVING_TRIALS, tmp_path / "no_turns")
    pq.write_table(_requests_table([{"trial_id": t, "request_index": 0, "energy_j": 5.0, "in_window": True}
                                    for t in AT_24]), no_turns / "requests.parquet")
    assert load_results(no_turns).turn_energy().empty

    for root in (real, no_turns):
        results = load_results(root)
        with pytest.raises(PlotNotApplicable):
            plot_energy_per_turn(results.trials, results.turn_energy())
        assert _plot(build_report(root, "md", plots_wanted=["energy_per_turn"]), "energy_per_turn.png") is None


def test_energy_per_turn_without_energy_says_so(tmp_path):
    """Conversations replayed where no GPU energy was measured: a note, not a silent gap."""
    from sweeper.analysis.report import build_report

    root = _trials_with_repeat(tmp_path / "cpu")
    rows = [{**r, "energy_j": None} for r in _conversation_rows()]
    pq.write_table(_requests_table(rows), root / "requests.parquet")
    report = build_report(root, "md", plots_wanted=["energy_per_turn"])
    assert _plot(report, "energy_per_turn.png") is None
    assert any(n.startswith("Energy per conversation turn (serving) left out: ") and "CPU-only" in n
               for n in report.notes), report.notes


def test_requests_are_read_only_when_a_plot_needs_them(tmp_path):
    """requests.parquet is not read by load_results, nor by the report of an offline sweep;
    a serving sweep's report says it could not read it instead of failing."""
    from sweeper.analysis.report import build_report
    from sweeper.analysis.results import load_results
    from tests.analysis.test_report import H200_TRIALS

    offline = _results_dir(H200_TRIALS, tmp_path / "offline")
    serving = _results_dir(SERVING_TRIALS, tmp_path / "serving")
    for root in (offline, serving):
        (root / "requests.parquet").write_bytes(b"not parquet")
        assert load_results(root).requests_path == root / "requests.parquet"
    assert not any("requests.parquet" in n or "turn" in n for n in build_report(offline, "md").notes)
    notes = build_report(serving, "md", plots_wanted=["energy_per_turn"]).notes
    assert any(n.startswith("Energy per conversation turn (serving) left out: ") and "not a readable" in n
               for n in notes), notes


# -- prefix caching ---------------------------------------------------------------------------


def _caching_trials(directory: Path, hit_rate_off: float | None = 0.0, with_on: bool = True) -> Path:
    """The max_num_seqs=128 configuration as measured, its engine reporting a 0 hit rate
    (``hit_rate_off``), and the same configuration with prefix caching on: 60 % of the
    energy per request, a hit rate from 50 % at 1/s to 95 % at inf. The other configurations
    report no hit rate."""
    import json

    import numpy as np
    import pandas as pd

    from sweeper.core.schema import to_table

    trials = to_table("trials", pq.read_table(SERVING_TRIALS)).to_pandas()
    off = (trials["mode"] == "serving") & trials["backend_options"].str.contains('"max_num_seqs":128')
    trials.loc[off, "prefix_cache_hit_rate"] = hit_rate_off
    parts = [trials]
    if with_on:
        on = trials[off].copy()
        on["trial_id"] = on["trial_id"].str[:-1] + "c"
        on["backend_options"] = [json.dumps({**json.loads(o), "enable_prefix_caching": True}, separators=(",", ":"))
                                 for o in on["backend_options"]]
        on["energy_per_request_j"] *= 0.6
        on["prefix_cache_hit_rate"] = np.linspace(0.5, 0.95, len(on))[on["request_rate"].rank(method="first")
                                                                      .to_numpy(dtype=int) - 1]
        parts.append(on)
    directory.mkdir(parents=True)
    table = pa.Table.from_pandas(pd.concat(parts, ignore_index=True), preserve_index=False)
    pq.write_table(to_table("trials", table), directory / "trials.parquet")
    return directory


def test_report_draws_the_caching_comparison(tmp_path):
    import math

    from sweeper.analysis.report import PLOT_FILES, build_report
    from sweeper.analysis.results import load_results

    root = _caching_trials(tmp_path / "caching")
    report = build_report(root, "html", plots_wanted=["prefix_caching"])
    plot = _plot(report, "prefix_caching.png")
    assert plot is not None and "prefix_caching.png" in PLOT_FILES
    assert (root / "report" / "prefix_caching.png").read_bytes() == plot.png
    page = report.path.read_text()
    assert 'data-file="prefix_caching.png"' in page
    check_figures({"prefix_caching.png": plot.data}, page)

    trials = load_results(root).trials
    serving = trials[(trials["mode"] == "serving") & trials["prefix_cache_hit_rate"].notna()]
    energy, hits = plot.data["panels"]
    assert energy["ylabel"] == "J / request" and hits["ylabel"] == "prefix-cache hit rate (%)"
    assert energy["title"] == hits["title"] == "llama-3.1-8b"
    lines = {s["label"]: s["points"] for s in energy["series"] if s["kind"] == "line"}
    rates = {s["label"]: s["points"] for s in hits["series"] if s["kind"] == "line"}
    assert len(lines) == 2 and set(lines) == set(rates)
    (on_label,) = [label for label in lines if "enable_prefix_caching=True" in label]
    (off_label,) = set(lines) - {on_label}
    assert "max_num_seqs=128" in on_label and "max_num_seqs=128" in off_label
    for label, cached in ((on_label, True), (off_label, False)):
        rows = serving[serving["trial_id"].str.endswith("c") == cached].sort_values("request_rate")
        assert len(rows) == 10
        assert_allclose(lines[label], rows[["achieved_rate_req_s", "energy_per_request_j"]].to_numpy(dtype=float))
        assert_allclose(rates[label], rows[["achieved_rate_req_s", "prefix_cache_hit_rate"]].to_numpy(dtype=float)
                        * [1.0, 100.0])
    assert [p[1] for p in rates[off_label]] == [0.0] * 10
    assert rates[on_label][0][1] == pytest.approx(50.0) and rates[on_label][-1][1] == pytest.approx(95.0)
    assert all(math.isfinite(y) for _, y in lines[on_label])


@pytest.mark.parametrize(("hit_rate_off", "with_on"), [
    (None, True),   # only the caching configuration reports a hit rate: nothing to compare it with
    (0.0, False),   # two configurations would report one, but nothing hit the cache
])
def test_the_caching_comparison_needs_two_configurations_and_a_hit(tmp_path, hit_rate_off, with_on):
    from sweeper.analysis.report import build_report
    from sweeper.analysis.results import load_results
    from sweeper.analysis.serving_plots import PlotNotApplicable, plot_prefix_caching

    root = _caching_trials(tmp_path / "caching", hit_rate_off, with_on)
    with pytest.raises(PlotNotApplicable):
        plot_prefix_caching(load_results(root).trials)
    report = build_report(root, "md", plots_wanted=["prefix_caching"])
    assert _plot(report, "prefix_caching.png") is None and not (root / "report" / "prefix_caching.png").exists()
    assert not any("caching" in note for note in report.notes)


def test_the_caching_comparison_is_absent_from_a_sweep_without_hit_rates(tmp_path):
    from sweeper.analysis.results import load_results
    from sweeper.analysis.serving_plots import PlotNotApplicable, plot_prefix_caching

    trials = load_results(_results_dir(SERVING_TRIALS, tmp_path / "plain")).trials
    assert trials["prefix_cache_hit_rate"].isna().all()
    with pytest.raises(PlotNotApplicable):
        plot_prefix_caching(trials)
