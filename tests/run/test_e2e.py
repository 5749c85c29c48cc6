"""End to end through a real local Ray, real tiny transformers models, real Parquet and DuckDB."""

from __future__ import annotations

import json

import duckdb
import pytest

from sweeper.plan.expand import make_plan
from sweeper.plan.spec import load_sweep
from sweeper.run.assembly import run_plan
from sweeper.run.storage import ResultStore
from sweeper.run.sweep_run import RunOptions
from tests.conftest import run_cli

REQUIRED = ["trial_id", "sweep", "model", "backend", "precision", "batch_size", "input_len",
            "output_len", "repeat", "status", "error", "n_iterations", "duration_s", "output_tokens",
            "throughput_tok_s", "requests_per_s", "ttft_s", "tpot_s", "e2e_s", "load_s",
            "peak_memory_bytes", "device", "device_name", "started_at",
            "energy_j", "energy_per_token_j", "avg_power_w"]
def query(con, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=False)) for row in cur.fetchall()]


MEASURED = [c for c in REQUIRED if c not in ("error", "energy_j", "energy_per_token_j", "avg_power_w")]

SWEEP = """
name: e2e
models: [tiny-llama]
precisions: [fp32, bf16]
batch_sizes: [1, 3]
workload: {input_len: 8, output_len: 5}
measure: {warmup_iters: 1, min_iters: 2, min_duration_s: 0.2, idle_s: 0}
"""


@pytest.mark.slow
def test_sweep_runs_records_and_resumes(write_sweep, tmp_path):
    out = tmp_path / "out"
    r = run_cli("run", str(write_sweep(SWEEP)), "-o", str(out), "-q")
    assert r.returncode == 0, r.stderr
    con = duckdb.connect()
    trials = query(con, f"SELECT * FROM '{out}/trials.parquet'")
    assert len(trials) == 4
    for t in trials:
        assert t["status"] == "ok", t["error"]
        for col in REQUIRED:
            assert col in t
        for col in MEASURED:
            assert t[col] is not None, col
        assert t["energy_j"] is None and t["avg_power_w"] is None  # CPU: null, not zero
        assert t["device"] == "cpu" and t["sweep"] == "e2e"
        assert t["n_iterations"] >= 2 and t["duration_s"] >= 0.2
        assert t["output_tokens"] == t["n_iterations"] * t["batch_size"] * 5
        assert t["throughput_tok_s"] == pytest.approx(t["output_tokens"] / t["duration_s"])
        assert 0 < t["ttft_s"] < t["e2e_s"]
        assert t["tpot_s"] == pytest.approx((t["e2e_s"] - t["ttft_s"]) / 4, rel=1e-6)
    # one model load per precision, shared by both batch sizes
    loads = con.execute(f"SELECT precision, count(DISTINCT load_s) FROM '{out}/trials.parquet' GROUP BY 1").fetchall()
    assert all(n == 1 for _, n in loads)
    # every request produced exactly output_len tokens, and they add up to the trials' counts
    n_req, bad, tok = con.execute(
        f"SELECT count(*), count(*) FILTER (WHERE output_tokens <> 5), sum(output_tokens) FROM '{out}/requests.parquet'"
    ).fetchone()
    assert bad == 0 and tok == sum(t["output_tokens"] for t in trials)
    assert n_req == sum(t["n_requests"] for t in trials)

    shard_times = {p.name: p.stat().st_mtime_ns for p in (out / "shards" / "trials").iterdir()}
    again = run_cli("run", str(write_sweep(SWEEP)), "-o", str(out), "-q")
    assert again.returncode == 0, again.stderr
    assert "4 trial(s) already ok; 0 to run" in again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (out / "shards" / "trials").iterdir()} == shard_times

    # adding an axis value runs only the new trials
    more = run_cli("run", str(write_sweep(SWEEP.replace("[1, 3]", "[1, 3, 2]"))), "-o", str(out), "-q")
    assert more.returncode == 0, more.stderr
    assert "4 trial(s) already ok; 2 to run" in more.stderr
    assert con.execute(f"SELECT count(*) FROM '{out}/trials.parquet'").fetchone()[0] == 6


@pytest.mark.slow
def test_failures_are_rows_and_the_sweep_goes_on(ray_local, write_sweep, tmp_path, tiny_gpt2_dir):
    broken = tmp_path / "broken"
    broken.mkdir()
    # 130 is not divisible by 4 heads: transformers refuses this config at load time.
    (broken / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 130, "num_attention_heads": 4, "num_hidden_layers": 1,
        "intermediate_size": 64, "vocab_size": 256}))
    sweep_path = write_sweep(f"""
name: faults
models: ["{tiny_gpt2_dir}", "{broken}", tiny-llama]
precisions: fp32
batch_sizes: 1
workload: {{input_len: [16, 80], output_len: 4}}
measure: {{warmup_iters: 0, min_iters: 1, min_duration_s: 0, idle_s: 0}}
""")
    sweep = load_sweep(sweep_path)
    plan = make_plan(sweep, ray_local.device, sweep_path=str(sweep_path))
    store = ResultStore(str(tmp_path / "out"))
    summary = run_plan(plan, store, ray_local)
    assert (summary.ok, summary.failed, summary.skipped) == (3, 2, 1)
    store.aggregate()
    rows = {(r["model"], r["input_len"]): r for r in query(
        duckdb.connect(), f"SELECT model, input_len, status, reason, error FROM '{tmp_path}/out/trials.parquet'")}
    gpt2 = str(tiny_gpt2_dir)
    assert rows[(gpt2, 16)]["status"] == "ok"
    # 80 + 4 tokens overflow GPT-2's 64 learned positions: skipped at plan time with the reason
    # (a rotary model would silently extrapolate), the sweep goes on
    assert rows[(gpt2, 80)]["status"] == "skipped" and rows[(gpt2, 80)]["reason"] == "unsupported"
    assert "exceeds the model's 64 positions" in rows[(gpt2, 80)]["error"]
    for n in (16, 80):
        assert rows[(str(broken), n)]["reason"] == "load_failed"
        assert "model load failed" in rows[(str(broken), n)]["error"]
        assert rows[("tiny-llama", n)]["status"] == "ok"

    # failed trials are kept on resume unless asked to retry them
    summary2 = run_plan(plan, store, ray_local)
    assert summary2.ran == 0 and summary2.resumed == 5
    summary3 = run_plan(plan, store, ray_local, RunOptions(retry_failed=True))
    assert summary3.ran == 0 and summary3.failed == 2  # the 2 load failures re-tried, failing again
