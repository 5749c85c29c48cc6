"""Which columns a GPU run's rows left null, per kind of row (issue "Architecture, round three").

    python3 -m bench typed-rows results/typed results/typed_serving

Every row is built by its actor from typed parts (``sweeper.core.results``); on a GPU each ok
row should carry its energy, per-GPU lists, idle baseline and the environment of the GPUs it
held. This lists, per results directory and kind of row (backend, mode), the expected columns
that came out null in any ok row, and each row's fidelity source, so one look tells whether
the parts reached the table whole.
"""

from __future__ import annotations

import argparse

from sweeper.core.status import Status

# What every ok GPU row carries, whatever its kind.
EXPECTED = (
    "energy_j", "energy_per_token_j", "avg_power_w", "peak_power_w", "idle_power_w", "energy_method",
    "gpu_energy_j", "gpu_avg_power_w", "gpu_peak_power_w", "gpu_peak_memory_bytes", "gpu_uuids", "gpu_names",
    "gpu_power_limit_w", "driver_version", "cuda_version", "device", "device_name", "load_s", "hostname",
    "ray_node_id", "ray_gpu_ids", "torch_version", "sweeper_version", "throughput_tok_s", "duration_s",
    "energy_exclusive",
)
# What an offline row adds, and a serving row.
OFFLINE = ("n_iterations", "peak_memory_bytes", "weight_memory_bytes", "prefill_energy_j", "decode_energy_j",
           "throughput_rel_ci95", "mfu", "mbu")
SERVING = ("energy_per_request_j", "run_energy_j", "achieved_rate_req_s", "ttft_p50_s", "tpot_p50_s",
           "send_lateness_p99_s", "request_energy_method", "peak_memory_bytes")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("roots", nargs="+", help="results directories (each holding trials.parquet)")


def run(args: argparse.Namespace) -> None:
    import pyarrow.parquet as pq

    for root in args.roots:
        rows = pq.read_table(f"{root}/trials.parquet").to_pylist()
        print(f"{root}: {len(rows)} row(s), {sum(r['status'] == Status.OK for r in rows)} ok")
        for r in rows:
            kind = f"{r['backend']}/{r['precision']} {r['mode']} batch={r['batch_size']} rate={r['request_rate']}"
            if r["status"] != Status.OK:
                print(f"  {kind}: {r['status']} ({r['reason']}): {(r['error'] or '')[:200]}")
                continue
            expected = EXPECTED + (SERVING if r["mode"] == "serving" else OFFLINE)
            null = [c for c in expected if r.get(c) is None]
            print(f"  {kind}: {len(expected) - len(null)}/{len(expected)} expected columns set"
                  + (f"; null: {', '.join(null)}" if null else "")
                  + f"; energy {r['energy_j']} J, {r['gpu_names']}, unmetered: {r['energy_unmetered_reason']}"
                  + (f"; fidelity {r['fidelity_status']} ({r['fidelity_reference_source']})"
                     if r.get("fidelity_status") else ""))
