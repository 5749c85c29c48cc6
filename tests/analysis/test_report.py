"""``sweeper report`` against a real quickstart run and a real H200 trials table.

The GPU results directory is docs/data/sweep_quantization_h200_2026-11-21_core-trials.parquet
(a real H200 run of sweeps/quantization.yaml) plus a timeline and a layer profile laid
out from each trial's own measured numbers (idle, prefill and decode power,
TTFT, end-to-end time), written through the schema, for the plots a CPU
machine cannot produce.
"""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, run_cli

H200_TRIALS = ROOT / "docs" / "data" / "sweep_quantization_h200_2026-11-21_core-trials.parquet"

# layers.parquet's columns (the per-module layer profile), for a checkout whose sweeper.core.schema
# does not declare the table yet.
LAYERS_SCHEMA = pa.schema([
    ("trial_id", pa.string()), ("module", pa.string()), ("module_type", pa.string()),
    ("layer_index", pa.int64()), ("phase", pa.string()), ("calls", pa.int64()),
    ("gpu_time_s", pa.float64()), ("time_share", pa.float64()), ("energy_j", pa.float64()),
    ("method", pa.string()),
])


def _layers_table(rows: list[dict]) -> pa.Table:
    from sweeper.core.schema import TABLES, to_table

    return to_table("layers", rows) if "layers" in TABLES else pa.Table.from_pylist(rows, schema=LAYERS_SCHEMA)


def _timeline_rows(trial: dict) -> list[dict]:
    """Samples at the trial's interval: idle power before the window, then its iterations'
    prefill and decode at the power its measured phase energies imply."""
    dt, n = trial["sample_interval_s"], trial["n_iterations"]
    prefill_s = trial["ttft_s"] * n
    prefill_w = trial["prefill_energy_j"] / prefill_s
    decode_w = trial["decode_energy_j"] / (trial["duration_s"] - prefill_s)
    rows, energy_mj = [], 9.0e9
    t = -trial["idle_s"]
    while t <= trial["duration_s"] + 1e-9:
        if t < 0:
            phase, power = None, trial["idle_power_w"]
        else:
            in_call = t % trial["e2e_s"]
            phase, power = ("prefill", prefill_w) if in_call < trial["ttft_s"] else ("decode", decode_w)
        energy_mj += power * dt * 1e3
        rows.append({"trial_id": trial["trial_id"], "t_s": round(t, 6), "gpu_index": 0,
                     "gpu_uuid": trial["gpu_uuids"], "power_w": power, "energy_mj": energy_mj,
                     "util_gpu_pct": 0.0 if phase is None else 100.0, "memory_used_bytes": trial["peak_memory_bytes"],
                     "sm_clock_mhz": 1980.0, "temperature_c": 40.0, "phase": phase})
        t += dt
    return rows


def _layer_rows(trial: dict, n_layers: int) -> list[dict]:
    """A submodule-granularity profile: each phase's measured energy shared out by GPU time."""
    in_block = {"self_attn": ("attention", 0.35), "mlp": ("mlp", 0.55),
                "input_layernorm": ("norm", 0.05), "post_attention_layernorm": ("norm", 0.05)}
    outside = {"model.embed_tokens": ("embedding", 0.01), "model.norm": ("final_norm", 0.01),
               "lm_head": ("lm_head", 0.04)}
    block_share = 1.0 - sum(w for _, w in outside.values())
    modules = [(name, role, None, w) for name, (role, w) in outside.items()]
    modules += [(f"model.layers.{i}.{sub}", role, i, block_share * w / n_layers)
                for i in range(n_layers) for sub, (role, w) in in_block.items()]
    prefill_s = trial["ttft_s"] * trial["n_iterations"]
    rows = []
    for phase, energy_j, time_s, calls in (
            ("prefill", trial["prefill_energy_j"], prefill_s, trial["n_iterations"]),
            ("decode", trial["decode_energy_j"], trial["duration_s"] - prefill_s,
             trial["n_iterations"] * (trial["output_len"] - 1))):
        rows += [{"trial_id": trial["trial_id"], "module": name, "module_type": role, "layer_index": idx,
                  "phase": phase, "calls": calls, "gpu_time_s": time_s * share, "time_share": share,
                  "energy_j": energy_j * share, "method": "gpu_time_share_of_phase_energy"}
                 for name, role, idx, share in modules]
    return rows


def build_gpu_results(directory: Path) -> Path:
    """A results directory from the real H200 trials table (see the module docstring)."""
    from sweeper.core.schema import to_table

    directory.mkdir(parents=True, exist_ok=True)
    trials = pq.read_table(H200_TRIALS)
    pq.write_table(to_table("trials", trials), directory / "trials.parquet")
    rows = trials.to_pylist()
    timeline = [s for t in rows if t["status"] == "ok" for s in _timeline_rows(t)]
    pq.write_table(to_table("timeline", timeline), directory / "timeline.parquet")
    biggest = max(rows, key=lambda t: t["energy_j"] or 0)
    n_layers = 32 if "8b" in biggest["model"] else 16  # llama-3.1-8b / llama-3.2-1b
    pq.write_table(_layers_table(_layer_rows(biggest, n_layers)), directory / "layers.parquet")
    return directory


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory) -> Path:
    return build_gpu_results(tmp_path_factory.mktemp("h200") / "quantization")


@pytest.fixture
def quickstart_copy(quickstart_results, tmp_path) -> Path:
    """A private copy: a report writes into the results directory."""
    return Path(shutil.copytree(quickstart_results, tmp_path / "quickstart"))


def _embedded_pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)]


# -- the real quickstart (CPU: no energy, no timeline, no layers) ----------------------


def test_report_on_quickstart_leaves_out_energy_plots_with_notes(quickstart_copy):
    import pandas as pd

    r = run_cli("report", str(quickstart_copy))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    page_path = quickstart_copy / "report" / "index.html"
    page = page_path.read_text()
    assert str(page_path) in r.stdout.replace("\n", "")

    # The plots a CPU run can have, embedded and also written beside the page.
    pngs = _embedded_pngs(page)
    assert len(pngs) == 4 and all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    assert (quickstart_copy / "report" / "throughput.png").read_bytes() == pngs[0]
    assert (quickstart_copy / "report" / "latency.png").read_bytes() == pngs[1]
    assert (quickstart_copy / "report" / "weight_memory.png").is_file()
    assert (quickstart_copy / "report" / "stages.png").read_bytes() == pngs[3]  # where the time went
    assert "Where the time went" in page
    for missing in ("energy_per_token.png", "pareto.png", "power_timeline.png", "layer_shares.png",
                    "fidelity.png"):
        assert not (quickstart_copy / "report" / missing).exists()
    # Every plot left out says so on one line.
    for note in ("Energy per token vs batch size left out", "Pareto frontier: latency vs J/token left out",
                 "Power timeline left out", "Layer energy shares left out", "Fidelity vs J/token left out"):
        assert note in page
        assert note in r.stdout
    assert "Power timeline left out: no timeline samples (a CPU-only run has no GPU telemetry)" in page

    trials = pd.read_parquet(quickstart_copy / "trials.parquet")
    ok = trials[trials["status"] == "ok"]
    # No energy on CPU: the best configuration falls back to throughput.
    best = ok.loc[ok["throughput_tok_s"].idxmax()]
    assert "highest tok/s (no energy)" in page
    assert best["trial_id"] in page.split("<h2>Plots</h2>")[0]
    # Unstable trials (the fixture's windows are far below min_window_s) are listed with their reason.
    unstable = ok[ok["unstable"].fillna(False)]
    assert len(unstable) == len(ok) > 0
    section = page.split("Unstable trials")[1].split("<h2>")[0]
    for row in unstable.itertuples():
        assert row.trial_id in section
        assert html.escape(row.unstable_reason) in section
    # Failed and skipped trials are listed with their reasons (fp16 is skipped on CPU).
    bad = trials[trials["status"] != "ok"]
    if (trials["device"].dropna() == "cpu").all():
        assert len(bad) > 0
    section = page.split("Failed and skipped trials")[1]
    for row in bad.itertuples():
        assert row.trial_id in section and html.escape(row.reason) in section


def test_markdown_report_keeps_images_beside_it(quickstart_copy):
    r = run_cli("report", str(quickstart_copy), "--format", "md")
    assert r.returncode == 0, r.stderr
    md = (quickstart_copy / "report" / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert images == ["throughput.png", "latency.png", "weight_memory.png", "stages.png"]
    assert all((quickstart_copy / "report" / name).stat().st_size > 5000 for name in images)
    assert "> Power timeline left out" in md
    assert "| model | backend | precision |" in md


def test_plots_draws_only_the_plots_named_and_leaves_no_other_beside_the_page(quickstart_copy):
    assert run_cli("report", str(quickstart_copy), "--format", "md").returncode == 0  # every plot, first
    r = run_cli("report", str(quickstart_copy), "--format", "md", "--plots", "latency, energy_per_token")
    assert r.returncode == 0, r.stderr
    assert "(1 plots" in r.stdout
    # The one named that applies is drawn; the one whose data is missing says so, as always.
    assert "Energy per token vs batch size left out" in r.stdout and "Power timeline left out" not in r.stdout
    md = (quickstart_copy / "report" / "report.md").read_text()
    assert re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md) == ["latency.png"]
    assert sorted(p.name for p in (quickstart_copy / "report").glob("*.png")) == ["latency.png"]
    assert "| model | backend | precision |" in md  # the tables are always there


def test_latency_bound_that_nothing_meets(quickstart_copy):
    r = run_cli("report", str(quickstart_copy), "--max-tpot-ms", "0.000001", "--plots", "throughput")
    assert r.returncode == 0, r.stderr
    page = (quickstart_copy / "report" / "index.html").read_text()
    assert "no ok trial within the bounds" in page
    assert "TPOT ≤ 1e-06 ms" in page


@pytest.mark.parametrize("args, expected", [
    (["--trial", "nosuchtrial"], "no trial 'nosuchtrial'"),
    (["--plots", "pareto,piechart"], "--plots: unknown plot 'piechart' (choose from throughput, latency,"),
    (["--plots", ","], "--plots: name at least one plot"),
    (["--max-tpot-ms", "-1"], "Invalid value"),
    (["--format", "pdf"], "Invalid value"),
])
def test_bad_report_options_exit_2(quickstart_copy, args, expected):
    r = run_cli("report", str(quickstart_copy), *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert expected in r.stderr and "Traceback" not in r.stderr
    assert not (quickstart_copy / "report" / "index.html").exists()


def test_missing_or_unaggregated_directory_exit_2(tmp_path, quickstart_results):
    r = run_cli("report", str(tmp_path / "nope"))
    assert r.returncode == 2 and "no such results directory" in r.stderr and "Traceback" not in r.stderr
    shards_only = tmp_path / "shards_only"
    shutil.copytree(quickstart_results / "shards", shards_only / "shards")
    r = run_cli("report", str(shards_only))
    assert r.returncode == 2 and f"run `sweeper aggregate {shards_only}` first" in " ".join(r.stderr.split())


@pytest.mark.slow
def test_layer_profile_of_a_real_cpu_run_is_shown_as_time_shares(tmp_path):
    """A real profiled sweep on CPU: layers.parquet has host-clock times and no energy."""
    import pandas as pd

    from sweeper.analysis.plots import layer_shares
    from sweeper.analysis.report import build_report

    sweep = tmp_path / "profiled.yaml"
    sweep.write_text("name: profiled\nmodels: [tiny-llama]\nprecisions: [fp32]\nbatch_sizes: [2]\n"
                     "workload: {input_len: 8, output_len: 4}\n"
                     "measure: {warmup_iters: 1, min_iters: 2, min_duration_s: 0.2, idle_s: 0}\n"
                     "profile: {layers: submodule}\n")
    root = tmp_path / "results"
    r = run_cli("run", str(sweep), "--output", str(root), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    layers = pd.read_parquet(root / "layers.parquet")
    assert len(layers) > 0 and layers["energy_j"].isna().all()

    report = build_report(root, "md", plots_wanted=["layer_shares"])
    (trial_id,) = layers["trial_id"].unique()
    assert "layer_shares.png" in [p.filename for p in report.plots]
    md = report.path.read_text()
    assert f"*Layer energy shares*: layer profile of trial {trial_id}" in md
    shares, value = layer_shares(layers)
    assert value == "gpu_time_s" and shares.to_numpy().sum() == pytest.approx(1.0)
    assert {"attention", "mlp"} <= set(shares.index)


# -- the H200 results (energy, timeline, layers) ----------------------------------------------


def test_report_on_gpu_results_has_every_plot(gpu_results):
    from sweeper.analysis.report import build_report

    report = build_report(gpu_results, max_tpot_ms=15.0)
    names = [p.filename for p in report.plots]
    assert names == ["throughput.png", "latency.png", "energy_per_token.png", "pareto.png", "weight_memory.png",
                     "power_timeline.png", "layer_shares.png"]
    # No fidelity was measured in that run, and it predates stage timing: those plots are left out.
    assert report.notes == ["Fidelity vs J/token left out: no fidelity_kl values in trials.parquet "
                            "(no fidelity measured)",
                            "Stage timeline left out: no stage spans recorded (results from a version before "
                            "stage timing)"]
    page = report.path.read_text()
    assert len(_embedded_pngs(page)) == 7
    assert "NVIDIA H200" in page
    # The power timeline defaults to the ok trial with the most energy (llama-3.1-8b fp16 bs=64, 4503 J).
    assert "trial d58a02976863a6f0: llama-3.1-8b transformers/fp16 bs=64 (the ok trial with the most energy" in page


def test_best_configuration_under_latency_bounds(gpu_results):
    import pandas as pd

    from sweeper.analysis.tables import best_configs

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    free = best_configs(trials).set_index("model")
    # Unbounded: the largest batch has the fewest joules per token for both models.
    assert free.loc["llama-3.2-1b", "batch_size"] == 64 and free.loc["llama-3.1-8b", "batch_size"] == 64
    assert (free["criterion"] == "lowest J/token").all()
    expected = trials[trials.model == "llama-3.2-1b"]["energy_per_token_j"].min()
    assert free.loc["llama-3.2-1b", "energy_per_token_j"] == expected

    bounded = best_configs(trials, max_ttft_ms=50.0, max_tpot_ms=15.0).set_index("model")
    # TTFT <= 50 ms rules out the 8b's batches of 32 and 64 (111-231 ms) and TPOT <= 15 ms its
    # fp16 batch 32 and bf16 batch 8 and 32.
    eight = trials[(trials.model == "llama-3.1-8b") & (trials.ttft_s <= 0.050) & (trials.tpot_s <= 0.015)]
    assert bounded.loc["llama-3.1-8b", "trial_id"] == eight.loc[eight.energy_per_token_j.idxmin(), "trial_id"]
    assert bounded.loc["llama-3.1-8b", "ttft_ms"] <= 50.0 and bounded.loc["llama-3.1-8b", "tpot_ms"] <= 15.0
    assert bounded.loc["llama-3.2-1b", "batch_size"] == 64  # 41 ms TTFT, 8 ms TPOT: within both


def test_pareto_frontier_is_the_non_dominated_set(gpu_results):
    import pandas as pd

    from sweeper.analysis.plots import pareto_frontier, pareto_mask

    assert list(pareto_mask([1, 2, 3, 2, 1], [3, 2, 1, 3, 3])) == [True, True, True, False, True]
    trials = pd.read_parquet(gpu_results / "trials.parquet")
    front = pareto_frontier(trials, "tpot_s")
    for _, g in front.groupby("model"):
        for _, p in g.iterrows():
            dominated = ((g.energy_per_token_j <= p.energy_per_token_j) & (g.tpot_s <= p.tpot_s)
                         & ((g.energy_per_token_j < p.energy_per_token_j) | (g.tpot_s < p.tpot_s))).any()
            assert p.on_frontier == (not dominated)
        assert g.on_frontier.any()


def test_unstable_trials_are_marked_not_hidden(gpu_results, tmp_path):
    import pandas as pd

    from sweeper.analysis.report import build_report

    # The H200 run had no unstable trial; flag two the way the actor would (short window).
    trials = pd.read_parquet(gpu_results / "trials.parquet")
    flagged = trials["batch_size"] == 1
    trials.loc[flagged, "unstable"] = True
    trials.loc[flagged, "unstable_reason"] = "window 9.9 s < min_window_s 10 s"
    root = tmp_path / "unstable"
    root.mkdir()
    trials.to_parquet(root / "trials.parquet")
    report = build_report(root)
    page = report.path.read_text()
    section = page.split("Unstable trials (4)")[1].split("<h2>")[0]
    for tid in trials.loc[flagged, "trial_id"]:
        assert tid in section
    assert "hollow hatched markers: the 4 unstable trial(s) listed below" in page  # the plots' captions
    assert len(report.plots) == 5  # every plot still drawn: throughput, latency, J/token, Pareto, memory


def test_fidelity_plot_when_the_column_exists(gpu_results, tmp_path):
    import pandas as pd

    from sweeper.analysis.report import build_report

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    # A fidelity_kl column as the fidelity pass writes it (KL to the bf16 reference).
    trials["fidelity_kl"] = trials["precision"].map({"bf16": 0.0, "fp16": 2.1e-4})
    root = tmp_path / "fidelity"
    root.mkdir()
    trials.to_parquet(root / "trials.parquet")
    report = build_report(root, plots_wanted=["fidelity"])
    assert "fidelity.png" in [p.filename for p in report.plots]
    assert not any(n.startswith("Fidelity") for n in report.notes)


def test_quality_plot_draws_each_measure_against_each_energy(gpu_results, tmp_path):
    import pandas as pd

    from sweeper.analysis.figure_data import figure_data
    from sweeper.analysis.quality_plots import plot_quality
    from sweeper.analysis.report import build_report

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    # Quality columns as the fidelity pass writes them: the reference has no KL of its own.
    trials["fidelity_kl"] = trials["precision"].map({"bf16": None, "fp16": 2.1e-4})
    trials["fidelity_top1"] = trials["precision"].map({"bf16": None, "fp16": 0.98})
    trials["perplexity"] = trials["precision"].map({"bf16": 9.1, "fp16": 9.2})
    fig = plot_quality(trials)
    assert [ax.get_ylabel().split(" ")[0].rstrip(",") for ax in fig.axes] == ["KL", "KL", "top-1", "top-1", "perplexity",
                                                                  "perplexity"]
    assert [ax.get_xlabel() for ax in fig.axes[:2]] == ["J / output token", "J / response"]
    data = figure_data(fig)
    first = data["panels"][0]["series"]
    assert {s["kind"] for s in first} == {"markers"} and any("fp16" in s["label"] for s in first)
    # The reference has a perplexity but no KL: it is a point in the perplexity panels only.
    assert len(data["panels"][4]["series"]) == len(first) + len([s for s in first if "fp16" in s["label"]])
    root = tmp_path / "quality"
    root.mkdir()
    trials.to_parquet(root / "trials.parquet")
    assert "quality.png" in [p.filename for p in build_report(root, plots_wanted=["quality"]).plots]


def test_quality_without_energy_is_said_and_without_quality_is_silent(quickstart_copy):
    import pandas as pd

    from sweeper.analysis.plots import PlotNotApplicable, PlotUnavailable
    from sweeper.analysis.quality_plots import plot_quality

    trials = pd.read_parquet(quickstart_copy / "trials.parquet")
    with pytest.raises(PlotNotApplicable):
        plot_quality(trials)
    trials["perplexity"] = 12.0
    with pytest.raises(PlotUnavailable, match="no GPU energy"):
        plot_quality(trials)


def test_timeline_phases_are_shaded_from_the_phase_column(gpu_results):
    import pandas as pd

    from sweeper.analysis.plots import phase_spans, plot_power_timeline

    timeline = pd.read_parquet(gpu_results / "timeline.parquet", filters=[("trial_id", "==", "d58a02976863a6f0")])
    spans = phase_spans(timeline)
    assert {s[0] for s in spans} == {"prefill", "decode"}
    assert spans[0][1] == 0.0  # nothing shaded over the idle baseline (phase null)
    assert all(a[2] <= b[1] for a, b in zip(spans, spans[1:], strict=False))  # ordered, not overlapping
    fig = plot_power_timeline(timeline, {"trial_id": "d58a02976863a6f0", "duration_s": 10.76})
    ax = fig.axes[0]
    assert len(ax.patches) == len(spans)
    assert {t.get_text() for t in ax.get_legend().get_texts()} >= {"prefill", "decode"}


@pytest.mark.slow
def test_chosen_trial_and_layers(gpu_results):
    r = run_cli("report", str(gpu_results), "--trial", "e76f4689a845c045", "--format", "md",
                "--plots", "power_timeline,layer_shares")
    assert r.returncode == 0, r.stderr
    md = (gpu_results / "report" / "report.md").read_text()
    assert "![Power timeline](power_timeline.png)" in md
    # That trial has no layer profile: the profiled one is shown instead.
    assert "![Layer energy shares](layer_shares.png)" in md


def test_layer_shares_sum_to_one_and_blocks_are_equal(gpu_results):
    import pandas as pd

    from sweeper.analysis.plots import layer_shares, plot_layer_shares

    layers = pd.read_parquet(gpu_results / "layers.parquet")
    shares, value = layer_shares(layers)
    assert value == "energy_j"
    assert shares.to_numpy().sum() == pytest.approx(1.0)
    assert shares.sum(axis=1).idxmax() == "mlp"
    fig = plot_layer_shares(layers)
    bars = [p.get_height() for p in fig.axes[1].patches]
    assert len(bars) == 32 and max(bars) == pytest.approx(min(bars))


def test_compare_two_sweeps(gpu_results, tmp_path):
    import pandas as pd

    from sweeper.analysis.tables import compare_sweeps

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    other = tmp_path / "other"
    other.mkdir()
    faster = trials.copy()
    faster["throughput_tok_s"] *= 2
    faster.to_parquet(other / "trials.parquet")
    joined = compare_sweeps(gpu_results, other)
    assert len(joined) == 16
    assert joined["throughput_ratio"].tolist() == pytest.approx([2.0] * 16)
    assert joined["energy_per_token_ratio"].tolist() == pytest.approx([1.0] * 16)
    assert set(joined["variant"]) == {""}

    # The same configuration run compiled is a different variant: it never meets eager.
    compiled = trials.copy()
    compiled["backend_options"] = '{"attn_implementation":"sdpa","compile":true}'
    compiled.to_parquet(other / "trials.parquet")
    assert compare_sweeps(gpu_results, other).empty
    both = pd.concat([trials, compiled])
    both.to_parquet(other / "trials.parquet")
    joined = compare_sweeps(other, other)
    assert len(joined) == 32 and set(joined["variant"]) == {"", "compile=True"}


def test_report_does_not_import_plotting_at_cli_import():
    import sys

    code = ("import sys, sweeper.cli, sweeper.analysis.report, sweeper.analysis.plots, "
            "sweeper.analysis.results, sweeper.analysis.tables, sweeper.analysis.render;"
            "heavy = [m for m in ('matplotlib', 'duckdb', 'pandas', 'torch') if m in sys.modules];"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# -- the page in a real browser -------------------------------------------------------------


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True, text=True, timeout=120)


class _Figures(HTMLParser):
    """The report's figures as a browser left them: attributes (set by the page's script) and data."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[dict] = []
        self._in_data = False
        self.loaded = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        if tag == "body":
            self.loaded = a.get("data-loaded") == "1"
        if tag == "figure" and "plot" in (a.get("class") or ""):
            self.figures.append({"attrs": a, "data": ""})
        self._in_data = tag == "script" and a.get("class") == "plot-data"

    def handle_endtag(self, tag: str) -> None:
        self._in_data = False

    def handle_data(self, data: str) -> None:
        if self._in_data:
            self.figures[-1]["data"] += data


def rendered_figures(page: Path, tmp_path: Path) -> dict[str, dict]:
    """Load the page in headless Chromium and read back its DOM: per plot file, what it shows."""
    r = _chromium(["--virtual-time-budget=10000", "--dump-dom", page.as_uri()], tmp_path)
    parser = _Figures()
    parser.feed(r.stdout)
    assert parser.loaded, f"the page's load handler did not run: {r.stderr[-2000:]}"
    figures = {}
    for f in parser.figures:
        # The page's own script recorded the size each embedded image decoded to.
        assert int(f["attrs"]["data-rendered-width"]) > 300, f["attrs"]
        figures[f["attrs"]["data-file"]] = json.loads(f["data"])
    return figures


def _overlapping(labels: list[dict]) -> list[tuple[str, str]]:
    def cross(a: list[float], b: list[float]) -> bool:
        return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]

    return [(x["text"], y["text"]) for i, x in enumerate(labels) for y in labels[i + 1:] if cross(x["box"], y["box"])]


def check_figures(figures: dict[str, dict], page_text: str) -> None:
    """What every report must satisfy, read from the figures' data."""
    for name, fig in figures.items():
        for panel in fig["panels"]:
            for axis in ("x", "y"):
                if panel[f"{axis}scale"] == "log":  # readable: several plain-number labels
                    ticks = panel[f"{axis}ticks"]
                    assert len(ticks) >= 2, (name, panel["title"], axis, ticks)
                    assert all(re.fullmatch(r"[0-9.]+", t) for t in ticks), (name, ticks)
            assert not _overlapping(panel["labels"]), (name, _overlapping(panel["labels"]))
    for name in ("throughput.png", "latency.png", "energy_per_token.png"):
        if name not in figures:
            continue
        by_metric: dict[str, set[str]] = {}
        for panel in figures[name]["panels"]:
            by_metric.setdefault(panel["ylabel"], set()).add(panel["yscale"])
            batches = [x for x, _ in next(s for s in panel["series"] if s["kind"] == "line")["points"]]
            for series in panel["series"]:  # one point per batch size, repeats or not
                xs = [x for x, _ in series["points"]]
                assert len(xs) == len(set(xs)), (name, series["label"], xs)
            assert batches
        # every panel of one metric on the same scale
        assert all(len(scales) == 1 for scales in by_metric.values()), (name, by_metric)
    if "weight_memory.png" in figures:
        unit = re.search(r"\((GB|MB)\)", figures["weight_memory.png"]["panels"][0]["ylabel"]).group(1)
        assert f"weights {unit}" in page_text or "Precisions against the reference" not in page_text
        for series in figures["weight_memory.png"]["panels"][0]["series"]:
            assert all(height >= 0 for _, height in series["points"])
        assert figures["weight_memory.png"]["panels"][0]["ylim"][0] == 0


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (CI installs it)")
@pytest.mark.slow
def test_html_report_renders_in_headless_chromium(gpu_results, tmp_path):
    import numpy as np
    import pandas as pd
    from PIL import Image

    from sweeper.analysis.report import build_report

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    # The fidelity pass's column: one KL per precision, repeated on each batch size's row.
    trials["fidelity_kl"] = trials["precision"].map({"bf16": 0.0, "fp16": 2.1e-4})
    root = Path(shutil.copytree(gpu_results, tmp_path / "gpu"))
    trials.to_parquet(root / "trials.parquet")
    report = build_report(root)
    page = report.path.read_text()
    figures = rendered_figures(report.path, tmp_path)
    assert set(figures) == {p.filename for p in report.plots}
    check_figures(figures, page)
    # Weight memory in GB in the plot and the table alike (16 GB of llama-3.1-8b at bf16).
    memory = figures["weight_memory.png"]["panels"][0]
    assert memory["ylabel"] == "weight memory (GB)" and "<th>weights GB</th>" in page
    assert max(h for s in memory["series"] for _, h in s["points"]) == pytest.approx(16.06, abs=0.1)
    # Fidelity: one point per model and precision, not one per batch size.
    fidelity = figures["fidelity.png"]["panels"][0]
    assert sorted(s["label"] for s in fidelity["series"]) == [
        "llama-3.1-8b bf16", "llama-3.1-8b fp16", "llama-3.2-1b bf16", "llama-3.2-1b fp16"]
    assert all(len(s["points"]) == 1 for s in fidelity["series"])
    # Throughput: a log axis on both models' panels, each labelled more than once.
    throughput = figures["throughput.png"]["panels"]
    assert [p["yscale"] for p in throughput] == ["log", "log"]
    # The layer panel states a measured verdict (the profile's blocks are equal by construction).
    layer = figures["layer_shares.png"]["panels"][1]["title"]
    assert re.search(r"equal within CV \d+\.\d% \(max/min 1\.00\)", layer), layer

    shot = tmp_path / "page.png"
    r = _chromium([f"--screenshot={shot}", "--window-size=1280,2000", report.path.as_uri()], tmp_path)
    assert shot.is_file(), r.stderr
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert pixels.shape[:2] == (2000, 1280)
    # Saturated pixels come only from the plots (the text is grey): the embedded images rendered.
    colourful = (pixels.max(axis=2) - pixels.min(axis=2) > 80).sum()
    assert colourful > 5000, f"{colourful} coloured pixels: the plots did not render"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed (CI installs it)")
@pytest.mark.slow
def test_cpu_report_has_latency_and_readable_figures_in_chromium(quickstart_copy, tmp_path):
    from sweeper.analysis.report import build_report

    report = build_report(quickstart_copy)
    page = report.path.read_text()
    figures = rendered_figures(report.path, tmp_path)
    check_figures(figures, page)
    latency = figures["latency.png"]["panels"]
    assert [p["ylabel"] for p in latency] == ["TTFT (ms)", "TPOT (ms)"]
    for panel in latency:
        assert {x for s in panel["series"] for x, _ in s["points"]} == {1.0, 2.0}
        assert all(y > 0 for s in panel["series"] for _, y in s["points"])
    # Tiny synthetic models: megabytes, in the plot and the table alike.
    assert figures["weight_memory.png"]["panels"][0]["ylabel"] == "weight memory (MB)"


def test_a_weightless_backend_leaves_weight_memory_out_with_a_note(quickstart_copy):
    import pandas as pd

    from sweeper.analysis.report import build_report

    trials = pd.read_parquet(quickstart_copy / "trials.parquet")
    trials["backend"], trials["weight_memory_bytes"] = "noop", 0  # what noop rows hold
    trials.to_parquet(quickstart_copy / "trials.parquet")
    report = build_report(quickstart_copy, plots_wanted=["weight_memory"])
    assert "weight_memory.png" not in [p.filename for p in report.plots]
    assert any(n.startswith("Weight memory per precision left out: every weight_memory_bytes is 0")
               for n in report.notes)


def test_repeats_are_one_median_point_with_their_range(gpu_results):
    import pandas as pd

    from sweeper.analysis import plots
    from sweeper.analysis.figure_data import figure_data

    trials = pd.read_parquet(gpu_results / "trials.parquet")
    again = trials.copy()
    again["throughput_tok_s"] *= 1.2
    data = figure_data(plots.plot_throughput(pd.concat([trials, again], ignore_index=True)))
    assert "points: median of repeats, whiskers: their range" in data["title"]
    for panel in data["panels"]:
        for series in panel["series"]:
            xs = [x for x, _ in series["points"]]
            assert len(xs) == len(set(xs)) == 4


def test_precisions_against_the_reference_on_the_h200_quantization_study(tmp_path):
    """The table that answers the study's question, from the real H200 run of the quantization
    study (docs/BENCHMARKS.md, "Quantization study")."""
    import pyarrow.parquet as pq

    from sweeper.analysis.tables import precision_summary
    from sweeper.core.schema import to_table

    study = ROOT / "docs/data/sweep_quantization_h200_2026-11-21_study-trials.parquet"
    trials = to_table("trials", pq.read_table(study)).to_pandas()
    summary = precision_summary(trials).set_index(["model", "precision"])
    assert list(summary.loc["llama-3.1-8b"].index) == ["bf16", "fp16", "int8", "nf4"]  # reference first
    ref = summary.loc[("llama-3.1-8b", "bf16")]
    assert (ref.weight_vs_ref, ref.energy_per_token_vs_ref, ref.throughput_vs_ref) == (1.0, 1.0, 1.0)
    int8 = summary.loc[("llama-3.1-8b", "int8")]
    assert int8.shapes_compared == 4 and int8.reference == "bf16"
    assert 0.55 < int8.weight_vs_ref < 0.6  # 9.09 of 16.06 GB
    # LLM.int8 spends 2.3-3x the joules per token at every batch: the geometric mean sits between
    assert 2.2 < int8.energy_per_token_vs_ref < 3.0 and int8.throughput_vs_ref < 0.3
    assert int8.fidelity_kl > summary.loc[("llama-3.1-8b", "fp16")].fidelity_kl
    # one precision per model: no comparison to make
    assert precision_summary(trials[trials["precision"] == "bf16"]).empty


def test_option_variants_are_lines_of_their_own():
    """Eager and compiled trials of one backend and precision must not be averaged together."""
    from sweeper.analysis.plots import plot_throughput
    from sweeper.core.schema import to_table
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    trials, _ = expand(parse_sweep({
        "name": "v", "models": "tiny-llama", "precisions": "bf16", "batch_sizes": [1, 4],
        "workload": {"input_len": 8, "output_len": 4},
        "backend_options": {"transformers": [{}, {"compile": True}]}}))
    rows = [{**t.columns(), "status": "ok", "throughput_tok_s": 100.0 * t.batch_size
             * (3 if '"compile":true' in t.backend_options else 1)} for t in trials]
    fig = plot_throughput(to_table("trials", rows).to_pandas())
    labels = sorted(line.get_label() for line in fig.axes[0].get_lines())
    assert labels == ["bf16", "bf16 compile=True"]


def test_precision_ratios_take_each_shape_once_however_many_repeats(tmp_path):
    """Repeats of a shape are one point (their median): ``shapes_compared`` counts shapes, and the
    table's cost does not grow as repeats squared."""
    import pandas as pd
    import pyarrow.parquet as pq

    from sweeper.analysis.tables import precision_summary
    from sweeper.core.schema import to_table

    study = ROOT / "docs/data/sweep_quantization_h200_2026-11-21_study-trials.parquet"
    trials = to_table("trials", pq.read_table(study)).to_pandas()
    once = precision_summary(trials).set_index(["model", "precision"])
    # Fifty repeats of every trial, each 10 % slower or faster than the median one.
    copies = []
    for k in range(50):
        c = trials.copy()
        c["throughput_tok_s"] *= (1.1, 1.0, 0.9)[k % 3] if k else 1.0
        copies.append(c)
    many = precision_summary(pd.concat(copies, ignore_index=True)).set_index(["model", "precision"])
    int8 = many.loc[("llama-3.1-8b", "int8")]
    assert int8.shapes_compared == once.loc[("llama-3.1-8b", "int8")].shapes_compared == 4
    assert int8.throughput_vs_ref == pytest.approx(once.loc[("llama-3.1-8b", "int8")].throughput_vs_ref)


# -- serving trials on the Pareto plot, the best table on a narrow terminal ------------------

SERVING_TRIALS = ROOT / "docs" / "data" / "sweep_serving-gpu_h100_2026-11-24_trials.parquet"
QUALITY_TRIALS = ROOT / "docs" / "data" / "quality_smollm2-135m_h100_2026-11-24_trials.parquet"


def _results_dir(trials_file: Path, directory: Path) -> Path:
    from sweeper.core.schema import to_table

    directory.mkdir(parents=True)
    pq.write_table(to_table("trials", pq.read_table(trials_file)), directory / "trials.parquet")
    return directory


def test_pareto_labels_serving_trials_by_rate_at_the_slo_percentile(tmp_path):
    """A real H100 serving sweep (with one offline trial beside it): frontier points are
    labelled by request rate (and concurrency where capped), never ``bs=nan``, and latency is
    read at the percentile the report's SLO bounds use."""
    import numpy as np
    import pandas as pd

    from sweeper.analysis.plots import pareto_frontier, plot_pareto
    from sweeper.analysis.report import build_report

    trials = pq.read_table(SERVING_TRIALS).to_pandas()
    assert set(trials["mode"]) == {"serving", "offline"}
    for percentile in (90, 99):
        fig = plot_pareto(trials, percentile=percentile)
        for ax, metric in zip(fig.axes, ("tpot", "ttft"), strict=True):
            labels = [t.get_text() for t in ax.texts]
            assert labels and not any("nan" in label for label in labels), labels
            assert ax.get_ylabel().startswith(f"p{percentile} {metric.upper()} ms")
            # Every label names the load of the trial at its point, on the percentile's frontier.
            front = pareto_frontier(trials, f"{metric}_p{percentile}_s")
            on = front[front["on_frontier"]]
            assert len(labels) == len(on)
            for text in ax.texts:
                x, y = text.xy
                (row,) = [r for _, r in on.iterrows() if np.isclose(r["energy_per_token_j"], x)
                          and np.isclose(r[f"{metric}_p{percentile}_s"] * 1e3, y)]
                rate = row["request_rate"]
                load = (f"bs={int(row['batch_size'])}" if row["mode"] == "offline"
                        else "rate=inf" if rate == np.inf else f"rate={rate:g}/s")
                assert text.get_text().endswith(f" {load}"), (text.get_text(), load)
        assert any(t.get_text().endswith(" rate=inf") for t in fig.axes[0].texts)
        assert f"latency at p{percentile}" in fig.get_suptitle()
    # The offline trial, on p99's frontier, keeps its batch size.
    assert any(t.get_text().endswith(" bs=128") for t in fig.axes[0].texts)

    capped = trials.copy()
    capped["max_concurrency"] = pd.array([64 if r == 96 else None for r in capped["request_rate"]], dtype="Int64")
    texts = [t.get_text() for t in plot_pareto(capped).axes[0].texts]
    assert any(t.endswith(" rate=96/s conc=64") for t in texts), texts
    assert not any("conc=" in t and "rate=96/s" not in t for t in texts), texts

    report = build_report(_results_dir(SERVING_TRIALS, tmp_path / "serving"), "md", slo_percentile=90,
                          plots_wanted=["pareto"])
    (pareto,) = [p for p in report.plots if p.filename == "pareto.png"]
    assert "latency at p90" in pareto.caption


def _rendered(table, width: int) -> list[str]:
    import io

    from rich.console import Console

    from sweeper.analysis.render import console_table

    console = Console(file=io.StringIO(), width=width, force_terminal=False, color_system=None)
    console.print(console_table(table, width, f"{table.title} (sweeper report draws the plots)"))
    return console.file.getvalue().splitlines()


def _with_repeats(trials_file: Path, directory: Path) -> Path:
    """Three repeats of every trial, 10 % apart in tok/s and J/token: cells with [intervals]."""
    import pandas as pd

    from sweeper.core.schema import to_table

    trials = pq.read_table(trials_file).to_pandas()
    copies = []
    for k, factor in enumerate((1.1, 1.0, 0.9)):
        c = trials.copy()
        c["repeat"] = k
        c["trial_id"] = c["trial_id"].str[:-1] + str(k)
        c["throughput_tok_s"] *= factor
        c["energy_per_token_j"] /= factor
        copies.append(c)
    directory.mkdir(parents=True)
    table = pa.Table.from_pandas(pd.concat(copies, ignore_index=True), preserve_index=False)
    pq.write_table(to_table("trials", table), directory / "trials.parquet")
    return directory


@pytest.mark.parametrize("width", [80, 120, 200])
def test_the_best_table_keeps_every_trial_id_whole_on_a_terminal(gpu_results, tmp_path, width):
    """What ``sweeper run`` prints at its end, at a fixed console width (never the real
    terminal's): every trial id whole on one line, to copy into ``sweeper query``; nothing
    wider than the console; what a narrow one leaves out is named."""
    from sweeper.analysis.report import best_table

    for root in (gpu_results, _results_dir(SERVING_TRIALS, tmp_path / "serving"),
                 _results_dir(QUALITY_TRIALS, tmp_path / "quality"),
                 _with_repeats(H200_TRIALS, tmp_path / "repeats")):
        table = best_table(root)
        ids = [row[table.headers.index("trial")] for row in table.rows]
        assert ids and all(len(i) == 16 for i in ids)
        lines = _rendered(table, width)
        text = "\n".join(lines)
        assert all(len(line) <= width for line in lines), text
        for trial_id in ids:
            assert any(trial_id in line for line in lines), text
        for row in table.rows:  # the load and the median J/token stay
            assert row[table.headers.index("batch / rate")] in text
            assert row[table.headers.index("J/token")].split()[0] in text
        if "unstable" in " ".join(row[table.headers.index("criterion")] for row in table.rows):
            assert "unstable" in text
        if width >= 200:  # room for everything: the ruled table as before
            assert "┃ trial" in text and "left out" not in text
            assert all(f"│ {trial_id} │" in text for trial_id in ids)
        if width == 80:
            assert "left out at 80 columns: " in text and "TTFT ms" not in text.split("left out")[0]
