"""Per-GPU energy of tensor-parallel trials, checked two ways, as a Markdown table.

    python3 -m bench tp-energy results/fleet-tp [more results directories] --out tp.json

For every ok trial: its row's energy beside the sum of its per-GPU energies (the
``gpu_energy_j`` list, which must add up to ``energy_j``), and, for offline trials, an
independent reading of each GPU's raw NVML counter from the trial's timeline
(``energy_mj``, interpolated in time at the window's two boundaries, t = 0 and
t = duration_s on the window's clock), summed over the GPUs. The second check does not
use the meter's curve or its boundary corrections: it differs from the row by the
counter's ~100 ms update granularity at each end, not by anything the per-GPU split did.
Serving rows add the sum of their requests' attributed energies against the run's.
"""

from __future__ import annotations

import argparse
import bisect
from pathlib import Path
from typing import Any


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("roots", nargs="+", help="results directories (each holding trials.parquet)")
    ap.add_argument("--out", help="write the checks as a bench record (JSON) here")


def counter_at(samples: list[tuple[float, int]], t_s: float) -> float | None:
    """The raw counter (mJ) at ``t_s``, linearly between the reads around it; None outside them."""
    times = [t for t, _ in samples]
    k = bisect.bisect_left(times, t_s)
    if k == 0 or k == len(samples):
        return float(samples[k][1]) if k < len(samples) and times[k] == t_s else None
    (t0, e0), (t1, e1) = samples[k - 1], samples[k]
    return e0 + (e1 - e0) * (t_s - t0) / (t1 - t0) if t1 > t0 else float(e1)


def independent_energy_j(timeline: list[dict[str, Any]], uuid: str, t0_s: float, t1_s: float) -> float | None:
    """One GPU's counter delta over [t0, t1], read off the timeline alone."""
    samples = sorted((r["t_s"], r["energy_mj"]) for r in timeline
                     if r["gpu_uuid"] == uuid and r["energy_mj"] is not None)
    a, b = counter_at(samples, t0_s), counter_at(samples, t1_s)
    return None if a is None or b is None else (b - a) / 1000.0


def check_trial(row: dict[str, Any], timeline: list[dict[str, Any]], requests: list[dict[str, Any]]) -> dict[str, Any]:
    uuids = (row["gpu_uuids"] or "").split(",")
    per_gpu = row.get("gpu_energy_j") or []
    out: dict[str, Any] = {
        "trial_id": row.get("trial_id"), "model": row.get("model"), "precision": row.get("precision"),
        "tensor_parallel": row.get("tensor_parallel"), "mode": row.get("mode") or "offline",
        "batch_size": row.get("batch_size"), "request_rate": row.get("request_rate"),
        "throughput_tok_s": row["throughput_tok_s"], "ttft_p50_s": row.get("ttft_p50_s"),
        "tpot_p50_s": row.get("tpot_p50_s"), "energy_per_token_j": row["energy_per_token_j"],
        "energy_per_request_j": row.get("energy_per_request_j"), "energy_j": row["energy_j"],
        "gpu_energy_j": per_gpu, "gpu_sum_rel_diff": None, "independent_gpu_energy_j": None,
        "independent_rel_diff": None, "gpu_peak_memory_bytes": row.get("gpu_peak_memory_bytes"),
        "gpu_idle_power_w": row.get("gpu_idle_power_w"), "gpu_avg_power_w": row.get("gpu_avg_power_w"),
        "energy_exclusive": row.get("energy_exclusive"), "gpu_processes": row.get("gpu_processes"),
        "mfu": row.get("mfu"), "mbu": row.get("mbu"), "goodput_req_s": row.get("goodput_req_s"),
        "requests_sum_rel_diff": None,
    }
    if row["energy_j"] and per_gpu:
        out["gpu_sum_rel_diff"] = sum(per_gpu) / row["energy_j"] - 1
    if out["mode"] == "offline" and row["energy_j"]:
        mine = [r for r in timeline if r["trial_id"] == row.get("trial_id", r["trial_id"])]
        parts = [independent_energy_j(mine, u, 0.0, row["duration_s"]) for u in uuids]
        if parts and all(p is not None for p in parts):
            out["independent_gpu_energy_j"] = parts
            out["independent_rel_diff"] = sum(p for p in parts if p is not None) / row["energy_j"] - 1
    if out["mode"] == "serving" and row.get("run_energy_j"):
        energies = [r["energy_j"] for r in requests
                    if r["trial_id"] == row.get("trial_id", r["trial_id"]) and r["energy_j"] is not None]
        if energies:
            out["requests_sum_rel_diff"] = sum(energies) / row["run_energy_j"] - 1
    return out


def _table(rows: list[dict[str, Any]]) -> str:
    def pct(x: float | None) -> str:
        return "" if x is None else f"{100 * x:+.3f} %"

    def num(x: float | None, fmt: str) -> str:
        return "" if x is None else format(x, fmt)

    head = ("| model | TP | mode | batch / rate | tok/s | TTFT p50 ms | TPOT p50 ms | J/token | J/request | "
            "per-GPU J | Σ GPUs − row | counters Σ − row | peak GiB per GPU | idle W per GPU | exclusive |")
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for r in rows:
        load = r["batch_size"] if r["mode"] == "offline" else r["request_rate"]
        gib = ", ".join(num(b / 2**30, ".1f") if b is not None else "-" for b in r["gpu_peak_memory_bytes"] or [])
        idle = ", ".join(num(w, ".0f") if w is not None else "-" for w in r["gpu_idle_power_w"] or [])
        lines.append(
            f"| {r['model']} {r['precision']} | {r['tensor_parallel']} | {r['mode']} | {load} | "
            f"{num(r['throughput_tok_s'], ',.0f')} | {num(r['ttft_p50_s'] and r['ttft_p50_s'] * 1e3, '.1f')} | "
            f"{num(r['tpot_p50_s'] and r['tpot_p50_s'] * 1e3, '.2f')} | {num(r['energy_per_token_j'], '.4f')} | "
            f"{num(r['energy_per_request_j'], '.1f')} | {', '.join(f'{e:,.0f}' for e in r['gpu_energy_j'])} | "
            f"{pct(r['gpu_sum_rel_diff'])} | {pct(r['independent_rel_diff'])} | {gib} | {idle} | "
            f"{r['energy_exclusive']} |")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> None:
    import pyarrow.parquet as pq

    from bench.benchkit import write_record
    from sweeper.core.status import Status

    checked: list[dict[str, Any]] = []
    for root in map(Path, args.roots):
        trials = pq.read_table(root / "trials.parquet").to_pylist()
        timeline = pq.read_table(root / "timeline.parquet").to_pylist() if (root / "timeline.parquet").exists() else []
        requests = pq.read_table(root / "requests.parquet").to_pylist() if (root / "requests.parquet").exists() else []
        for row in trials:
            if row["status"] == Status.OK and row.get("energy_j") is not None:
                checked.append(check_trial(row, timeline, requests))
    checked.sort(key=lambda r: (r["model"], r["precision"], r["mode"], r["tensor_parallel"],
                                r["batch_size"] or 0, r["request_rate"] or 0))
    print(_table(checked))
    worst = max((abs(r["gpu_sum_rel_diff"]) for r in checked if r["gpu_sum_rel_diff"] is not None), default=None)
    print(f"\n{len(checked)} trials; largest |Σ per-GPU − energy_j| / energy_j: "
          f"{'-' if worst is None else f'{100 * worst:.2e} %'}")
    if args.out:
        write_record(args.out, "tp-energy", checked)
