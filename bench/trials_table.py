"""Print a results directory's headline trial columns as a Markdown table (for docs/BENCHMARKS.md).

    python3 -m bench trials-table results/quantization
"""

from __future__ import annotations

import argparse

from sweeper.core.status import Status

COLUMNS = """model, precision, batch_size AS batch, status,
  round(throughput_tok_s, 1) AS "tok/s", round(ttft_s * 1e3, 1) AS "TTFT ms",
  round(tpot_s * 1e3, 2) AS "TPOT ms", round(energy_per_token_j, 4) AS "J/tok",
  round(avg_power_w) AS "avg W", round(idle_power_w) AS "idle W",
  round(peak_memory_bytes / 2^30, 2) AS "peak GiB", round(duration_s, 1) AS "window s",
  round(load_s, 1) AS "load s", energy_method, unstable"""


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("root", help="a sweep's results directory (the one holding trials.parquet)")


def run(args: argparse.Namespace) -> None:
    import duckdb

    root = args.root
    cur = duckdb.connect().execute(
        f"SELECT {COLUMNS} FROM '{root}/trials.parquet' ORDER BY model, precision, batch_size")
    names = [d[0] for d in cur.description]
    print("| " + " | ".join(names) + " |")
    print("|" + " --- |" * len(names))
    for row in cur.fetchall():
        print("| " + " | ".join("" if v is None else str(v) for v in row) + " |")
    env = duckdb.connect().execute(
        f"SELECT DISTINCT device_name, driver_version, cuda_version, torch_version, transformers_version, "
        f"ray_version FROM '{root}/trials.parquet' WHERE status = '{Status.OK}'").fetchall()
    print("\nenvironment:", env)
