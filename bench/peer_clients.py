"""Helpers of ``bench/peer_clients.sh``: GuideLLM and AIPerf held against the truth server.

    python3 bench/peer_clients.py watch CPU.jsonl -- CMD...    # run CMD, sampling its process tree's CPU
    python3 bench/peer_clients.py summarise --out SUMMARY.json [--sweeper BENCH.json SENDS.jsonl]... RUN_DIR...

``watch`` writes one line per 0.1 s, ``[time.time(), CPU seconds so far]`` (user + system
of CMD and every descendant, ended ones included where their parent reaped them), then
the whole tree's rusage at the end. ``summarise`` reads each RUN_DIR that the shell script
wrote (client result, ``sends.jsonl``, ``cpu.jsonl``) and sweeper's ``python3 -m bench
http-client`` records with their send logs, and writes per run: the client's TTFT p50/p99
against the server's for the same requests (matched by prompt: each prompt's first word
or token id is unique in a run), ITL, rates, arrival lag at the server, CPU, warnings.
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.truth_server import ServerSends, read_send_log  # noqa: E402


def _tree_cpu_s(root: Any) -> float:
    import psutil

    total = 0.0
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def watch(out: str, cmd: list[str]) -> int:
    import psutil

    child = subprocess.Popen(cmd)
    root = psutil.Process(child.pid)
    with open(out, "w") as f:
        while child.poll() is None:
            f.write(json.dumps([time.time(), _tree_cpu_s(root)]) + "\n")
            time.sleep(0.1)
        u = resource.getrusage(resource.RUSAGE_CHILDREN)
        f.write(json.dumps({"end": time.time(), "rusage_cpu_s": u.ru_utime + u.ru_stime}) + "\n")
    return child.returncode


def _pct(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def _cpu_between(cpu_file: Path, t0: float, t1: float) -> dict[str, Any]:
    lines = [json.loads(line) for line in cpu_file.read_text().splitlines()]
    samples = np.array([s for s in lines if isinstance(s, list)])
    at = np.interp([t0, t1], samples[:, 0], samples[:, 1])
    return {"cpu_window_s": round(float(at[1] - at[0]), 2), "cpu_window_share_of_a_core": round(float(at[1] - at[0]) / (t1 - t0), 2),
            "cpu_total_s": round(lines[-1]["rusage_cpu_s"], 2)}


def _server(sends: list[ServerSends], rate: float) -> dict[str, Any]:
    """What the server saw: its TTFT and ITL, its arrival rate and how far arrivals lag a
    constant schedule at ``rate`` (anchored so that the earliest lags by 0)."""
    received = np.sort([s.received_s for s in sends])
    lag = received - np.arange(len(received)) / rate
    lag -= lag.min()
    return {"server_requests": len(sends), "server_arrival_rate": round((len(received) - 1) / (received[-1] - received[0]), 1),
            "server_arrival_lag_p50_ms": _pct(list(1000 * lag), 50), "server_arrival_lag_max_ms": round(1000 * float(lag.max()), 1),
            "truth_ttft_p50_ms": _pct([1000 * s.ttft_s for s in sends], 50),
            "truth_ttft_p99_ms": _pct([1000 * s.ttft_s for s in sends], 99),
            "truth_itl_p50_ms": _pct([1000 * g for s in sends for g in s.itl_s], 50),
            "truth_itl_p99_ms": _pct([1000 * g for s in sends for g in s.itl_s], 99)}


def _compare(client: dict[str, float], sends: list[ServerSends]) -> dict[str, Any]:
    """Client TTFT (ms, by prompt key) against the server's for the matched requests."""
    truth = {(s.prompt.split()[0] if isinstance(s.prompt, str) else s.prompt[0]): 1000 * s.ttft_s for s in sends}
    keys = [k for k in client if k in truth]
    return {"matched": len(keys), "ttft_p50_ms": _pct([client[k] for k in keys], 50),
            "ttft_p99_ms": _pct([client[k] for k in keys], 99),
            "matched_truth_ttft_p50_ms": _pct([truth[k] for k in keys], 50),
            "matched_truth_ttft_p99_ms": _pct([truth[k] for k in keys], 99),
            "ttft_minus_truth_p50_ms": _pct([client[k] - truth[k] for k in keys], 50),
            "ttft_minus_truth_p99_ms": _pct([client[k] - truth[k] for k in keys], 99)}


def _guidellm(run: Path, sends: list[ServerSends]) -> dict[str, Any]:
    bench = json.loads((run / "guidellm.json").read_text())["benchmarks"][0]
    ok = bench["requests"]["successful"]
    ttft = {json.loads(r["request_args"])["body"]["prompt"].split()[0]: r["time_to_first_token_ms"] for r in ok}
    behind = [r["info"]["timings"]["request_start"] - r["info"]["timings"]["targeted_start"] for r in ok]
    log = (run / "client.log").read_text()
    return {**_compare(ttft, sends), "completed": len(ok),
            "errored": len(bench["requests"]["errored"]), "incomplete": len(bench["requests"]["incomplete"]),
            "itl_kind": "per-request mean (no per-gap ITL in GuideLLM's output)",
            "itl_p50_ms": _pct([r["inter_token_latency_ms"] for r in ok if r["inter_token_latency_ms"]], 50),
            "itl_p99_ms": _pct([r["inter_token_latency_ms"] for r in ok if r["inter_token_latency_ms"]], 99),
            "client_rate": round(bench["metrics"]["requests_per_second"]["successful"]["mean"], 1),
            "client_rate_kind": "GuideLLM requests_per_second.successful.mean",
            "start_behind_target_p50_ms": _pct([1000 * b for b in behind], 50),
            "start_behind_target_p99_ms": _pct([1000 * b for b in behind], 99),
            "start_behind_target_max_ms": round(1000 * max(behind), 1),
            "worker_processes": bench["config"]["strategy"]["worker_count"],
            "client_warnings": [w.get("code", str(w)) + ": " + str(w.get("note", w.get("message", ""))) for w in bench["warnings"]]
            + sorted({line.strip()[:200] for line in log.splitlines() if re.search(r"warn", line, re.I)}),
            **_cpu_between(run / "cpu.jsonl", bench["start_time"], bench["end_time"])}


def _aiperf(run: Path, sends: list[ServerSends]) -> dict[str, Any]:
    art = run / "aiperf"
    prompts = {d["session_id"]: d["payloads"][0]["prompt"].split()[0] for d in json.loads((art / "inputs.json").read_text())["data"]}
    records = [json.loads(line) for line in (art / "profile_export.jsonl").read_text().splitlines()]
    ok = [r for r in records if "time_to_first_token" in r["metrics"]]
    ttft = {prompts[r["metadata"]["conversation_id"]]: r["metrics"]["time_to_first_token"]["value"] for r in ok}
    gaps = [g for r in ok for g in r["metrics"].get("inter_chunk_latency", {}).get("value", [])]
    summary = json.loads((art / "profile_export_aiperf.json").read_text())
    log = (run / "client.log").read_text()
    noise = ("GPU Telemetry", "prompt-cache", "Prometheus")
    delay = [(r["metadata"]["request_start_ns"] - r["metadata"]["credit_issued_ns"]) / 1e6 for r in ok]
    return {**_compare(ttft, sends), "completed": len(ok), "errored": len(records) - len(ok),
            "itl_kind": "per gap (AIPerf inter_chunk_latency)", "itl_p50_ms": _pct(gaps, 50), "itl_p99_ms": _pct(gaps, 99),
            "client_rate": round(summary["request_throughput"]["avg"], 1), "client_rate_kind": "AIPerf request_throughput",
            "credit_to_start_p50_ms": _pct(delay, 50), "credit_to_start_p99_ms": _pct(delay, 99),
            "client_warnings": sorted({line.strip()[:200] for line in log.splitlines()
                                       if "WARNING" in line and not any(n in line for n in noise)}),
            **_cpu_between(run / "cpu.jsonl", min(r["metadata"]["request_start_ns"] for r in ok) / 1e9,
                           max(r["metadata"]["request_end_ns"] for r in ok) / 1e9)}


def _sweeper(bench_file: str, send_log: str) -> list[dict[str, Any]]:
    record = json.loads(Path(bench_file).read_text())
    res, all_sends = record["results"], read_send_log(send_log)
    out = []
    for seed, r in enumerate(res["rounds"]):  # one process count: round k has seed k
        # http-client's prompts are token ids, the first naming the request: round * 1e6 + index.
        sends = [s for s in all_sends if isinstance(s.prompt, tuple) and int(s.prompt[0]) // 1_000_000 == seed]
        out.append({"client": "sweeper", "rate": res["rate"], "output_len": res["output_len"], "round": seed,
                    **_server(sends, res["rate"]), "matched": r["matched"], "completed": r["completed"], "errored": r["failed"],
                    "ttft_p50_ms": round(r["ttft_p50_ms"], 2), "ttft_p99_ms": round(r["ttft_p99_ms"], 2),
                    "matched_truth_ttft_p50_ms": round(r["server_ttft_p50_ms"], 2),
                    "matched_truth_ttft_p99_ms": round(r["server_ttft_p99_ms"], 2),
                    "ttft_minus_truth_p50_ms": round(r["ttft_minus_server_p50_ms"], 2),
                    "ttft_minus_truth_p99_ms": round(r["ttft_minus_server_p99_ms"], 2),
                    "itl_kind": "per gap", "itl_p50_ms": round(r["itl_p50_ms"], 2), "itl_p99_ms": round(r["itl_p99_ms"], 2),
                    "lateness_p50_ms": round(r["lateness_p50_ms"], 2), "lateness_p99_ms": round(r["lateness_p99_ms"], 2),
                    "client_warnings": [r["client_behind_reason"]] if r["client_behind"] else [],
                    "cpu_window_s": round(r["client_cpu_s"], 2),
                    "cpu_window_share_of_a_core": round(r["client_cpu_share_of_a_core"], 2)})
    return out


def summarise(args: argparse.Namespace) -> None:
    runs = []
    for bench_file, send_log in args.sweeper or []:
        runs += _sweeper(bench_file, send_log)
    for run in map(Path, args.runs):
        meta = json.loads((run / "run.json").read_text())
        sends = read_send_log(run / "sends.jsonl")
        client = _guidellm(run, sends) if meta["client"] == "guidellm" else _aiperf(run, sends)
        runs.append({**meta, **_server(sends, meta["rate"]), **client})
    Path(args.out).write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    for r in runs:
        print(f"{r['client']:9} {r['rate']:5.0f}/s r{r['round']}: ttft {r['ttft_p50_ms']}/{r['ttft_p99_ms']} "
              f"truth {r['truth_ttft_p50_ms']}/{r['truth_ttft_p99_ms']} arrivals {r['server_arrival_rate']}/s "
              f"lag max {r['server_arrival_lag_max_ms']} ms itl {r['itl_p50_ms']}/{r['itl_p99_ms']} "
              f"cpu {r['cpu_window_s']} s ({r['cpu_window_share_of_a_core']} core) warn {len(r['client_warnings'])}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "watch":
        return watch(sys.argv[2], sys.argv[sys.argv.index("--") + 1:])
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["summarise"])
    p.add_argument("--out", required=True)
    p.add_argument("--sweeper", nargs=2, action="append", metavar=("BENCH_JSON", "SEND_LOG"))
    p.add_argument("runs", nargs="*")
    summarise(p.parse_intermixed_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
