"""The server backend's HTTP client: what it costs and how true its stamps are, against a local
server whose timing is known.

``tests/truth_server.py`` is launched on this machine: each reply's first chunk is sent
``--first-chunk-s`` after the request reaches it, then one one-token chunk every
``--token-s``, and every receipt and send is logged on the clock the client stamps with.
The client (``actors.backends.server.fanout.run_http``) then sends ``--rate`` requests per
second for ``--duration-s`` (Poisson or constant arrivals), and the bench reads off:

  lateness   submit time - scheduled arrival, per request (p50, p99, max over the whole
             run; p50 and max over its first 0.2 s, where a start-up burst shows, and the
             max after it): how far the client falls behind its own schedule;
  ttft       the client's TTFT p50 / p99 against the server's own (first send - receipt),
             and the per-request difference: how much of a TTFT is the client's;
  itl        the client's ITL p50 / p99 against the gaps the server sent;
  cpu        the client's CPU seconds (user + system, its client processes' included) over
             the run, per request and per streamed chunk: what the client itself burns.

``--processes 1,2,4`` runs each round with each number of client processes in turn (the
requests shared among them: ``actors.backends.server.fanout``), and ``--server-workers`` serves
with that many server processes, so that the server is not what runs out first: the client's
capacity curve (chunks per second against lateness, 1 to N processes).

The server shares the machine (and its cores) with the client, so these are upper bounds.
``--client-tree DIR`` imports the client from another checkout's ``actors`` package (e.g.
``git archive HEAD actors sweeper | tar -x -C DIR``): a change measured side by side, in
one session, against the same server.

    python3 -m bench http-client --rate 1000 --duration-s 5 --out bench_http_client.json
    python3 -m bench http-client --rate 470 --arrival constant --output-len 64 --prompt-len 16 \\
        --first-chunk-s 0.01 --token-s 0.005 --out burst.json
    python3 -m bench http-client --rate 1000 --arrival constant --output-len 64 --prompt-len 16 \\
        --first-chunk-s 0.01 --token-s 0.005 --processes 1,2,4,8 --server-workers 4 --out curve.json
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.benchkit import write_record

# The start-up burst shows in the requests due this early in the run.
START_S = 0.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    parser.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    parser.add_argument("--duration-s", type=float, default=5.0)
    parser.add_argument("--output-len", type=int, default=16, help="chunks (one token each) per reply")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--max-concurrency", type=int, default=None)
    parser.add_argument("--first-chunk-s", type=float, default=0.0, help="the server's delay to the first chunk")
    parser.add_argument("--token-s", type=float, default=0.0, help="the server's gap between chunks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", default="1", help="client processes, comma-separated: each in turn per round")
    parser.add_argument("--server-workers", type=int, default=1, help="processes of the truth server")
    parser.add_argument("--client-tree", default=None,
                        help="import the client from this directory's actors package (a 'before' checkout)")
    parser.add_argument("--out", required=True)


def _cpu_s() -> float:
    """This process's CPU seconds and those of its children that have ended (client processes)."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _pct_ms(values: list[float], q: float) -> float | None:
    return 1000 * float(np.percentile(values, q)) if values else None


def _due_s(request: Any) -> float:
    due = getattr(request, "due_s", None)
    return float(due if due is not None else request.arrival_s)


def _verdict(run: Any) -> dict[str, Any]:
    """What a trial of this run would say of the client (where the client's tree can judge it)."""
    try:
        from actors.serving import lateness
    except ImportError:  # a tree from before the verdict
        return {"client_behind": None, "client_behind_reason": None}
    ttft_p50 = lateness.ttft_p50_s(run.requests)
    late = lateness.send_lateness(run.requests, None, lateness.lateness_bound_s(ttft_p50), ttft_p50, 0.0)
    return {"client_behind": late.behind, "client_behind_reason": late.reason}


def _use_client_tree(tree: str) -> None:
    """Import ``actors`` from ``tree`` from now on (the bench's own modules keep theirs)."""
    for name in [m for m in sys.modules if m == "actors" or m.startswith("actors.")]:
        del sys.modules[name]
    sys.path.insert(0, str(Path(tree).resolve()))


def _round(endpoint: Any, args: argparse.Namespace, seed: int, send_log: Path, processes: int) -> dict[str, Any]:
    from actors.backends.server.fanout import run_http
    from actors.serving.arrivals import arrival_offsets
    from actors.serving.records import ServingRequest
    from tests.truth_server import read_send_log

    n = int(args.rate * args.duration_s)
    offsets = arrival_offsets(n, args.rate, args.arrival, 1.0, seed)
    # Each prompt unique (its first token the round and index), so the server's log matches it.
    tail = np.arange(8, 8 + args.prompt_len - 1)
    requests = [ServingRequest(i, np.concatenate([[seed * 1_000_000 + i], tail]), args.output_len, float(offsets[i]))
                for i in range(n)]
    cpu0, t0 = _cpu_s(), time.monotonic()
    extra: dict[str, Any] = {"processes": processes} if processes > 1 else {}  # a "before" tree has one process only
    run = run_http(endpoint, requests, max_concurrency=args.max_concurrency, deadline_s=t0 + 10 * args.duration_s + 60,
                   **extra)
    wall_s, cpu_s = time.monotonic() - t0, _cpu_s() - cpu0
    sent = [(r, r.submit_s) for r in run.requests if r.submit_s is not None]
    # Without a cap every request is due at its arrival (and a 'before' tree has no due_s).
    late = [submit_s - _due_s(r) for r, submit_s in sent]
    early = [lateness for (r, _), lateness in zip(sent, late, strict=True) if r.arrival_s - run.t_start_s <= START_S]
    rest = [lateness for (r, _), lateness in zip(sent, late, strict=True) if r.arrival_s - run.t_start_s > START_S]
    server = {s.prompt[0]: s for s in read_send_log(send_log) if isinstance(s.prompt, tuple)}
    pairs = [(r, server[seed * 1_000_000 + r.index]) for r in run.completed if seed * 1_000_000 + r.index in server]
    ttft = [float(r.ttft_s) for r, _ in pairs if r.ttft_s is not None]
    truth_ttft = [s.ttft_s for _, s in pairs]
    itl = [g for r, _ in pairs for g in r.itl_s]
    truth_itl = [g for _, s in pairs for g in s.itl_s]
    chunks = sum(r.output_tokens for r in run.completed)
    return {**_verdict(run), "processes": processes,
        "requests": n, "completed": len(run.completed), "failed": len(run.failed), "matched": len(pairs),
        "schedule_s": float(offsets[-1]), "wall_s": wall_s, "run_s": run.t_end_s - run.t_start_s,
        # Over the run itself (its zero to its last reply): the client processes' start is not in it.
        "chunks_per_s": chunks / (run.t_end_s - run.t_start_s),
        "lateness_p50_ms": _pct_ms(late, 50), "lateness_p99_ms": _pct_ms(late, 99),
        "lateness_max_ms": 1000 * max(late), "lateness_first_0.2s_max_ms": 1000 * max(early) if early else None,
        "lateness_first_0.2s_p50_ms": _pct_ms(early, 50), "lateness_after_0.2s_max_ms": 1000 * max(rest) if rest else None,
        "ttft_p50_ms": _pct_ms(ttft, 50), "ttft_p99_ms": _pct_ms(ttft, 99),
        "server_ttft_p50_ms": _pct_ms(truth_ttft, 50), "server_ttft_p99_ms": _pct_ms(truth_ttft, 99),
        "ttft_minus_server_p50_ms": _pct_ms([a - b for a, b in zip(ttft, truth_ttft, strict=True)], 50),
        "ttft_minus_server_p99_ms": _pct_ms([a - b for a, b in zip(ttft, truth_ttft, strict=True)], 99),
        "itl_p50_ms": _pct_ms(itl, 50), "itl_p99_ms": _pct_ms(itl, 99),
        "server_itl_p50_ms": _pct_ms(truth_itl, 50), "server_itl_p99_ms": _pct_ms(truth_itl, 99),
        "client_cpu_s": cpu_s, "client_cpu_per_request_us": 1e6 * cpu_s / n,
        "client_cpu_per_chunk_us": 1e6 * cpu_s / max(chunks, 1),
        "client_cpu_share_of_a_core": cpu_s / wall_s,
    }


def run(args: argparse.Namespace) -> int:
    from actors.backends.server.process import ServerProcess
    from sweeper.core.servers import DIALECTS
    from tests.truth_server import TRUTH_SERVER

    if args.client_tree:
        _use_client_tree(args.client_tree)
    from actors.backends.server.client import Endpoint

    workdir = Path(tempfile.mkdtemp())
    send_log = workdir / "sends.jsonl"
    server = ServerProcess.launch(["python", str(TRUTH_SERVER), "--port", "{port}", "--model", "truth",
                                   "--first-chunk-s", str(args.first_chunk_s), "--chunk-s", str(args.token_s),
                                   "--send-log", str(send_log), "--workers", str(args.server_workers)], log_path=workdir / "server.log")
    dialect = DIALECTS["vllm"]
    try:
        server.wait_ready(60.0)
        fields: dict[str, Any] = dict(
            url=server.base_url + "/completions", continuous_usage=dialect.continuous_usage,
            body=lambda r: {"model": "truth", "stream": True, "stream_options": dialect.stream_options(),
                            "prompt": [int(t) for t in r.prompt_ids],
                            **dialect.length_fields(r.output_len, exact=True, eos_token_id=None)})
        if "warm_url" in {f.name for f in dataclasses.fields(Endpoint)}:
            fields["warm_url"] = server.base_url + "/models"
        endpoint = Endpoint(**fields)
        counts = [int(p) for p in args.processes.split(",")]
        rounds = []
        for k in range(args.rounds):
            for p in counts:  # interleaved: each count once per round
                rounds.append(_round(endpoint, args, seed=k * len(counts) + counts.index(p), send_log=send_log,
                                     processes=p))
                print(rounds[-1], flush=True)
        keys = [k for k, v in rounds[0].items() if isinstance(v, float)]
        summary = {str(p): {key: statistics.median(r[key] for r in mine) for key in keys
                            if all(r[key] is not None for r in mine)}
                   for p in counts for mine in [[r for r in rounds if r["processes"] == p]]}
        write_record(args.out, "http-client", {
            "rate": args.rate, "arrival": args.arrival, "duration_s": args.duration_s,
            "output_len": args.output_len, "prompt_len": args.prompt_len, "first_chunk_s": args.first_chunk_s,
            "token_s": args.token_s, "max_concurrency": args.max_concurrency, "client_tree": args.client_tree,
            "server_workers": args.server_workers,
            "rounds": rounds, "median": summary})
    finally:
        server.stop(5.0)
    return 0
