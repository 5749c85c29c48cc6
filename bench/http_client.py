"""The server backend's HTTP client: what it costs, against a trivial local server.

A trivial OpenAI-compatible server (``tests/fault_server.py`` with no faults: each reply
``--output-len`` one-token chunks, no model) is launched on this machine; the client
(``actors.backends.server.client.run_http``) then sends ``--rate`` requests per second
for ``--duration-s`` at once-per-arrival Poisson times, and the bench reads off:

  lateness   submit time - scheduled arrival, per request (p50, p99, max): how far the
             client falls behind its own schedule;
  cpu        the client process's CPU seconds (user + system) over the run, per request
             and per streamed chunk: what the client itself burns;
  wall       run time against the schedule's length;
  itl        with ``--token-s`` the server spaces its chunks by that much: the client's ITL
             p50 / p99 against it is how much its stamps drift when busy (the server's own
             timer jitter included).

The server shares the machine (and its cores) with the client, so these are upper bounds.

    python3 -m bench http-client --rate 1000 --duration-s 5 --out bench_http_client.json
    python3 -m bench http-client --rate 150 --output-len 64 --token-s 0.02 --out itl.json
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.benchkit import write_record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second (Poisson)")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--output-len", type=int, default=16, help="chunks (one token each) per reply")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--token-s", type=float, default=0.0, help="the server's gap between chunks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", required=True)


def _cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def _round(endpoint: Any, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    from actors.backends.server.client import run_http
    from actors.serving.arrivals import arrival_offsets
    from actors.serving.records import ServingRequest

    n = int(args.rate * args.duration_s)
    offsets = arrival_offsets(n, args.rate, "poisson", 1.0, seed)
    prompt = np.arange(8, 40)
    requests = [ServingRequest(i, prompt, args.output_len, float(offsets[i])) for i in range(n)]
    cpu0, t0 = _cpu_s(), time.monotonic()
    run = run_http(endpoint, requests, max_concurrency=args.max_concurrency, deadline_s=t0 + 10 * args.duration_s + 60)
    wall_s, cpu_s = time.monotonic() - t0, _cpu_s() - cpu0
    late = sorted(r.submit_s - r.arrival_s for r in run.requests if r.submit_s is not None)
    chunks = sum(r.output_tokens for r in run.completed)
    itl = sorted(g for r in run.completed for g in r.itl_s)
    ttft = sorted(r.ttft_s for r in run.completed if r.ttft_s is not None)
    return {
        "itl_p50_ms": 1000 * itl[len(itl) // 2] if itl else None,
        "itl_p99_ms": 1000 * itl[int(len(itl) * 0.99)] if itl else None,
        "ttft_p50_ms": 1000 * ttft[len(ttft) // 2] if ttft else None,
        "chunks_per_s": chunks / wall_s,
        "requests": n, "completed": len(run.completed), "failed": len(run.failed),
        "schedule_s": float(offsets[-1]), "wall_s": wall_s,
        "lateness_p50_ms": 1000 * late[len(late) // 2], "lateness_p99_ms": 1000 * late[int(len(late) * 0.99)],
        "lateness_max_ms": 1000 * late[-1],
        "client_cpu_s": cpu_s, "client_cpu_per_request_us": 1e6 * cpu_s / n,
        "client_cpu_per_chunk_us": 1e6 * cpu_s / max(chunks, 1),
        "client_cpu_share_of_a_core": cpu_s / wall_s,
    }


def run(args: argparse.Namespace) -> int:
    from actors.backends.server.client import Endpoint
    from actors.backends.server.process import ServerProcess
    from sweeper.core.servers import DIALECTS

    server_py = Path(__file__).resolve().parents[1] / "tests" / "fault_server.py"
    log = Path(tempfile.mkdtemp()) / "server.log"
    server = ServerProcess.launch(["python", str(server_py), "--port", "{port}", "--model", "trivial",
                                   "--token-s", str(args.token_s)], log_path=log)
    dialect = DIALECTS["vllm"]
    try:
        server.wait_ready(60.0)
        endpoint = Endpoint(
            url=server.base_url + "/completions", continuous_usage=dialect.continuous_usage,
            body=lambda r: {"model": "trivial", "stream": True, "stream_options": dialect.stream_options(),
                            "prompt": [int(t) for t in r.prompt_ids],
                            **dialect.length_fields(r.output_len, exact=True, eos_token_id=None)})
        rounds = []
        for k in range(args.rounds):
            rounds.append(_round(endpoint, args, seed=k))
            print(rounds[-1], flush=True)
        summary = {key: statistics.median(r[key] for r in rounds)
                   for key in ("lateness_p50_ms", "lateness_p99_ms", "client_cpu_per_request_us",
                               "client_cpu_per_chunk_us", "client_cpu_share_of_a_core", "wall_s", "chunks_per_s",
                               "itl_p50_ms", "itl_p99_ms", "ttft_p50_ms")}
        write_record(args.out, "http-client", {"rate": args.rate, "duration_s": args.duration_s,
                                               "output_len": args.output_len, "token_s": args.token_s,
                                               "rounds": rounds,
                                               "median": summary})
    finally:
        server.stop(5.0)
    return 0
