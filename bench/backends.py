"""Backends side by side from one sweep: transformers eager, compiled, and vLLM.

Runs ``sweeps/backends.yaml`` through the real command line (``sweeper run``:
local Ray, actors, telemetry, shards, aggregation), then reads the aggregated
``trials.parquet`` and prints, per model and batch size, each variant's
throughput, J/token, MBU (the ``mbu`` column; n/a where the roofline has none),
TPOT and compile_s, and its speedup over transformers eager.

The whole sweep runs about 15 minutes on an H200: run it one model at a time
into the same results directory (finished trials are kept and skipped), then
once more with --skip-run for the table of everything:

    PYTHONPATH=$PWD:/tmp/site python3 -m bench backends --models llama-3.2-1b -o $OUT/backends --out $OUT/backends_1b.json
    PYTHONPATH=$PWD:/tmp/site python3 -m bench backends --models llama-3.1-8b -o $OUT/backends --out $OUT/backends_8b.json
    PYTHONPATH=$PWD:/tmp/site python3 -m bench backends --skip-run -o $OUT/backends --out $OUT/backends.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from bench.benchkit import environment, write_record
from sweeper.core.status import Status

COLUMNS = ("model", "backend", "backend_options", "batch_size", "repeat", "status", "reason", "error",
           "throughput_tok_s", "energy_per_token_j", "mbu", "tpot_s", "ttft_s", "compile_s",
           "compile_status", "peak_memory_bytes")


def variant(backend: str, options_json: str | None) -> str:
    """A short label: the backend, and eager/compiled where its options say."""
    options = json.loads(options_json or "{}")
    if "compile" in options:
        return f"{backend} {'compiled' if options['compile'] else 'eager'}"
    return backend


def filtered_sweep(sweep: Path, models: str | None, min_duration_s: float | None, into: Path) -> Path:
    """The sweep file itself, or a copy with fewer models / a shorter window (same name: same trial ids)."""
    if not models and min_duration_s is None:
        return sweep
    import yaml

    data = yaml.safe_load(sweep.read_text())
    if models:
        data["models"] = models.split(",")
    if min_duration_s is not None:
        data.setdefault("measure", {})["min_duration_s"] = min_duration_s
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"{sweep.stem}.filtered.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def read_rows(results: Path) -> list[dict]:
    import pyarrow.parquet as pq

    table = pq.read_table(results / "trials.parquet")
    present = [c for c in COLUMNS if c in table.column_names]
    rows = table.select(present).to_pylist()
    for r in rows:
        r.setdefault("mbu", None)  # the roofline columns may be absent from an older dataset
        r["variant"] = variant(r["backend"], r.get("backend_options"))
    return rows


def summarize(rows: list[dict]) -> list[dict]:
    """One line per (model, batch, variant): means over ok repeats, speedup over transformers eager."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["batch_size"], r["variant"]), []).append(r)
    out = []
    for (model, batch, var), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        ok = [r for r in rs if r["status"] == Status.OK]

        def mean(col: str, ok=ok) -> float | None:
            vals = [r[col] for r in ok if r.get(col) is not None]
            return sum(vals) / len(vals) if vals else None

        out.append({
            "model": model, "batch_size": batch, "variant": var, "ok": len(ok), "trials": len(rs),
            "status": Status.OK if ok else rs[0]["status"],
            "reason": None if ok else (rs[0].get("reason") or "") + ": " + (rs[0].get("error") or "")[:200],
            "throughput_tok_s": mean("throughput_tok_s"), "energy_per_token_j": mean("energy_per_token_j"),
            "mbu": mean("mbu"), "tpot_s": mean("tpot_s"), "ttft_s": mean("ttft_s"),
            "compile_s": mean("compile_s"),
            "compile_status": sorted({r["compile_status"] for r in ok if r.get("compile_status")}),
        })
    base = {(s["model"], s["batch_size"]): s["throughput_tok_s"] for s in out
            if s["variant"] == "transformers eager" and s["throughput_tok_s"]}
    for s in out:
        b = base.get((s["model"], s["batch_size"]))
        s["speedup_vs_transformers_eager"] = s["throughput_tok_s"] / b if b and s["throughput_tok_s"] else None
    return out


def fmt(value: float | None, spec: str) -> str:
    if value is not None:
        return format(value, spec)
    width = spec.split(".")[0]
    return "n/a".rjust(int(width) if width.isdigit() else 0)


def print_table(summary: list[dict]) -> None:
    print(f"\n{'model':14s} {'bs':>3s} {'variant':24s} {'tok/s':>9s} {'x eager':>7s} {'J/token':>8s} "
          f"{'MBU':>6s} {'tpot ms':>8s} {'compile_s':>9s}  status")
    for s in summary:
        status = s["status"] if s["status"] != Status.OK else "; ".join(s["compile_status"]) or "ok"
        if s["reason"]:
            status += f" ({s['reason']})"
        tpot_ms = s["tpot_s"] * 1e3 if s["tpot_s"] is not None else None
        print(f"{s['model']:14s} {s['batch_size']:3d} {s['variant']:24s} {fmt(s['throughput_tok_s'], '9.1f')} "
              f"{fmt(s['speedup_vs_transformers_eager'], '7.2f')} {fmt(s['energy_per_token_j'], '8.4f')} "
              f"{fmt(s['mbu'], '6.1%')} {fmt(tpot_ms, '8.3f')} {fmt(s['compile_s'], '9.1f')}  {status}")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--sweep", default="sweeps/backends.yaml")
    ap.add_argument("-o", "--output", default="results/backends", help="sweep results directory")
    ap.add_argument("--models", default=None, help="comma-separated subset of the sweep's models")
    ap.add_argument("--min-duration-s", type=float, default=None, help="override the measured window")
    ap.add_argument("--skip-run", action="store_true", help="only read the results directory")
    ap.add_argument("--out", default="backends.json")


def run(args: argparse.Namespace) -> None:

    results = Path(args.output)
    report: dict = {"args": vars(args), "environment": environment()}
    t0 = time.monotonic()
    if not args.skip_run:
        sweep = filtered_sweep(Path(args.sweep), args.models, args.min_duration_s, results / "_bench")
        report["sweep_file"] = sweep.read_text()
        cmd = [sys.executable, "-m", "sweeper", "run", str(sweep), "--output", str(results), "--quiet"]
        print(" ".join(cmd), flush=True)
        rc = subprocess.call(cmd)
        report["sweeper_rc"] = rc
        if rc != 0:
            print(f"sweeper run exited {rc}; reading what it stored", flush=True)
    report["run_s"] = time.monotonic() - t0
    rows = read_rows(results)
    report["trials"] = rows
    report["summary"] = summary = summarize(rows)
    print_table(summary)
    print(f"\ncompiled-path goals: transformers compiled >= 3x eager at bs1 on llama-3.2-1b; MBU >= 50% at "
          f"bs1 on llama-3.1-8b.  run {report['run_s']:.0f} s")
    write_record(args.out, "backends", report)
