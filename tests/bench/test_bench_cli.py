"""``python -m bench``: one entry point for every benchmark, each with its own --help, and
the one record format every bench writes (no GPU needed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import SUBCOMMANDS
from tests.conftest import ROOT


def _bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_help_lists_every_subcommand():
    r = _bench("--help")
    assert r.returncode == 0, r.stderr
    for name in SUBCOMMANDS:
        assert f"\n    {name}" in r.stdout, name
    assert "cannot be imported" not in r.stdout
    assert set(SUBCOMMANDS) >= {"energy", "overhead", "layers", "backends", "compile-check", "quant-check",
                                "roofline", "scheduling", "vllm-compare", "trials-table", "readme-plot"}


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_its_help(name):
    r = _bench(name, "--help")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: python3 -m bench {name}")


def test_unknown_subcommand_fails():
    r = _bench("no-such-bench")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_record_says_what_produced_it(tmp_path, monkeypatch):
    from bench import benchkit

    for name in ("_command", "_started", "_header"):  # restored after the test
        monkeypatch.setattr(benchkit, name, None)
    benchkit.start_command(["energy", "--out", "x.json"])
    path = tmp_path / "sub" / "x.json"
    benchkit.write_record(path, "energy", {"batches": {"1": {}}})
    record = json.loads(path.read_text())
    assert list(record) == ["bench", "command", "commit", "dirty", "date", "device", "versions", "results"]
    assert record["bench"] == "energy" and record["command"][1:] == ["-m", "bench", "energy", "--out", "x.json"]
    assert record["commit"] is None or len(record["commit"]) == 40
    assert record["date"].endswith("+00:00")
    assert set(record["device"]) == {"gpus", "cpu"}
    assert {"python", "torch", "transformers", "vllm", "ray", "driver", "cuda"} <= set(record["versions"])
    assert benchkit.read_results(path) == {"batches": {"1": {}}}
    old = tmp_path / "old.json"  # written before the record format: read whole
    old.write_text(json.dumps({"batches": {}}))
    assert benchkit.read_results(old) == {"batches": {}}


def test_warmup_bench_times_first_steady_and_new_shape_calls_of_a_real_trial(tmp_path):
    """``bench warmup`` on a tiny real model (CPU): a real trial per batch size, then the
    calls it times, written as one record."""
    out = tmp_path / "warmup.json"
    done = subprocess.run([sys.executable, "-m", "bench", "warmup", "--model", "tiny-llama", "--precisions", "fp32",
                           "--batches", "1,2", "--input-len", "8", "--output-len", "4", "--calls", "3",
                           "--idle-s", "0", "--window-s", "0.2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(out.read_text())["results"]["results"]
    assert [(r["precision"], r["batch"], r["newshape_batch"]) for r in results] == [("fp32", 1, 2), ("fp32", 2, 3)]
    for r in results:
        assert r["trial"]["status"] == "ok" and r["trial"]["stages_s"]["warmup"] > 0
        assert len(r["calls_s"]) == 3 and all(s > 0 for s in r["calls_s"])
        assert min(r["idle_s"], r["emptied_s"], r["newshape_s"], r["newshape_again_s"]) > 0


def test_typed_rows_names_the_gpu_columns_a_row_left_null(tmp_path):
    import argparse
    import contextlib
    import io

    import pyarrow.parquet as pq

    from bench import typed_rows
    from sweeper.core.schema import to_table

    full = dict.fromkeys(typed_rows.EXPECTED + typed_rows.OFFLINE, 1.0)
    rows = [{**full, "trial_id": "a", "status": "ok", "backend": "vllm", "precision": "bf16", "mode": "offline",
             "batch_size": 8, "gpu_names": "H200", "gpu_uuids": "GPU-1", "energy_method": "counter",
             "device": "cuda", "device_name": "H200", "hostname": "h", "ray_node_id": "n", "ray_gpu_ids": "0",
             "driver_version": "580", "cuda_version": "13.0", "torch_version": "2.11", "sweeper_version": "0",
             "energy_exclusive": True, "n_iterations": 3, "peak_memory_bytes": 1, "weight_memory_bytes": 1,
             "gpu_energy_j": [1.0], "gpu_avg_power_w": [1.0], "gpu_peak_power_w": [1.0],
             "gpu_peak_memory_bytes": [1]},
            {"trial_id": "b", "status": "failed", "reason": "oom", "error": "CUDA out of memory", "backend": "vllm",
             "precision": "fp8", "mode": "offline", "batch_size": 8}]
    rows.append({**rows[0], "trial_id": "c", "batch_size": 16, "energy_j": None, "gpu_uuids": None})
    pq.write_table(to_table("trials", rows), tmp_path / "trials.parquet")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        typed_rows.run(argparse.Namespace(roots=[str(tmp_path)]))
    lines = out.getvalue().splitlines()
    assert lines[0].endswith("3 row(s), 2 ok")
    expected = len(typed_rows.EXPECTED + typed_rows.OFFLINE)
    assert f"batch=8 rate=None: {expected}/{expected} expected columns set;" in lines[1]
    assert "fp8 offline batch=8 rate=None: failed (oom): CUDA out of memory" in lines[2]
    assert f"{expected - 2}/{expected} expected columns set; null: energy_j, gpu_uuids;" in lines[3]
