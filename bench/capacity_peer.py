"""A configuration's capacity under an SLO, found by sweeper's search and by vLLM's own sweep.

The peer is ``vllm bench sweep serve_workload`` (vLLM's sweep tool as of 0.26: it runs the
workload at concurrency 1 and at the whole dataset at once, then at ``--workload-iters`` - 2
request rates spaced evenly between the two throughputs, one ``vllm serve`` for all). Its
first run, every request one after another, is most of its time: on an H100 (eager,
llama-3.2-1b's shape) 150 requests of 256 + 128 tokens took 1.2-1.5 s each, about 200 s. Its
capacity is read off its runs as a user would: the highest rate explored whose p99 TTFT and
p99 TPOT keep to the SLO, bracketed by the next rate explored. sweeper's is
``request_rate: {capacity: {low, high, resolution}}`` through ``launch: vllm`` (bracket and
bisect on one server). Both launch the same ``vllm serve`` command line (``sweeper.core.servers``)
on the same synthetic model, one after the other on the same GPU; each one's wall time is
its GPU time (the server holds the GPU from its start to its stop).

    python3 -m bench capacity-peer --model llama-3.2-1b --out $OUT/capacity_peer.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from actors.backends.server.reaper import stop_groups, tree_groups
from bench.benchkit import write_record

VLLM = [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama-3.2-1b", help="a synthetic preset (random weights)")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--slo-ttft-ms", type=float, default=500.0)
    parser.add_argument("--slo-tpot-ms", type=float, default=50.0)
    parser.add_argument("--low", type=float, default=10.0, help="sweeper's capacity range, req/s")
    parser.add_argument("--high", type=float, default=320.0)
    parser.add_argument("--resolution", type=float, default=0.05, help="sweeper's stopping width, share of the load")
    parser.add_argument("--num-prompts", type=int, default=200, help="requests of each of the peer's runs")
    parser.add_argument("--workload-iters", type=int, default=6, help="the peer's workload levels")
    parser.add_argument("--port", type=int, default=8391, help="the peer's server port")
    parser.add_argument("--eager", action="store_true", help="both servers with --enforce-eager (shorter starts)")
    parser.add_argument("--steps", default="peer,sweeper", help="which to run, in order")
    parser.add_argument("--timeout-s", type=float, default=540.0,
                        help="each step's limit: past it the step's processes (its server too) are stopped and "
                             "what it measured so far is kept")
    parser.add_argument("--out", required=True)


def serve_argv(args: argparse.Namespace, model: str) -> list[str]:
    """sweeper's ``launch: vllm`` command line, on a fixed port (the peer tool launches it itself)."""
    from sweeper.core.servers import ENGINES

    argv = ENGINES["vllm"].command(model=model, served_model=args.model, precision="bf16", tensor_parallel=1,
                                   seed=0, synthetic=True, args=_args(args), device="cuda")
    return [w.replace("{host}", "127.0.0.1").replace("{port}", str(args.port)) for w in argv]


def _args(args: argparse.Namespace) -> dict[str, Any]:
    return {"enforce-eager": True} if args.eager else {}


def peer(args: argparse.Namespace, model: str, out_dir: Path) -> dict[str, Any]:
    bench = [*VLLM, "bench", "serve", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{args.port}",
             "--endpoint", "/v1/completions", "--model", args.model, "--tokenizer", model,
             "--dataset-name", "random", "--random-input-len", str(args.input_len),
             "--random-output-len", str(args.output_len), "--num-prompts", str(args.num_prompts),
             "--ignore-eos", "--percentile-metrics", "ttft,tpot", "--metric-percentiles", "99"]
    cmd = [*VLLM, "bench", "sweep", "serve_workload", "--serve-cmd", shlex.join(serve_argv(args, model)),
           "--bench-cmd", shlex.join(bench), "--workload-var", "request_rate",
           "--workload-iters", str(args.workload_iters), "--num-runs", "1", "--output-dir", str(out_dir),
           "--server-ready-timeout", "600",
           # Its default after each run resets the server's caches, which it knows how to do only for a
           # command that starts with `vllm`; the server here runs with its prefix cache off: nothing to reset.
           "--after-bench-cmd", "true"]
    done = bounded(cmd, args.timeout_s, out_dir / "sweep.log")
    runs = [json.loads(p.read_text()) for p in sorted(out_dir.rglob("run=*.json"))]
    levels = sorted(({"request_rate": _rate(r), "request_throughput": r.get("request_throughput"),
                      "p99_ttft_ms": r.get("p99_ttft_ms"), "p99_tpot_ms": r.get("p99_tpot_ms"),
                      "completed": r.get("completed"), "duration_s": r.get("duration"),
                      "max_concurrency": r.get("max_concurrency")} for r in runs),
                    key=lambda r: r["request_rate"])
    return {"command": cmd, **done.record(), "runs": levels, **knee(levels, args)}


@dataclass(frozen=True)
class Bounded:
    """A step's process as it ended: its exit status (None: stopped), wall time and output's tail."""

    returncode: int | None
    wall_s: float
    stderr: str
    interrupted: bool = False  # stopped by Ctrl-C, not by its limit

    def record(self) -> dict[str, Any]:
        return {"returncode": self.returncode, "wall_s": self.wall_s,
                "timed_out": self.returncode is None and not self.interrupted,
                **({"interrupted": True} if self.interrupted else {}),
                **({"error": self.stderr[-3000:]} if self.returncode != 0 else {})}


def bounded(cmd: list[str], timeout_s: float, log: Path, grace_s: float = 30.0) -> Bounded:
    """Run ``cmd`` in its own process group for at most ``timeout_s``. Past it (or on Ctrl-C) the
    whole tree is stopped, its own group and every group a descendant started: SIGTERM (sweeper
    stops its trials and keeps their results), then SIGKILL to what is left after ``grace_s``
    (``actors.backends.server.reaper.stop_groups``). vLLM's sweep starts ``vllm serve`` as its
    child in a session of its own, which outlives a killed parent and keeps the GPU's memory
    (2026-12-07, twice: the next step's engines found 4.5 of 79 GiB free)."""
    t0 = time.monotonic()
    returncode: int | None = None
    interrupted = False
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            returncode = proc.wait(timeout=timeout_s)
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as stop:
            interrupted = isinstance(stop, KeyboardInterrupt)
            stop_groups(tree_groups(proc.pid), grace_s)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5.0)
    return Bounded(returncode, time.monotonic() - t0, log.read_text()[-20000:], interrupted)





def _rate(run: dict[str, Any]) -> float:
    """The rate a run offered: its request_rate override, or (the two concurrency runs) its throughput."""
    rate = run.get("request_rate")
    if rate is None or rate == "inf" or (isinstance(rate, float) and math.isinf(rate)):
        return float(run.get("request_throughput") or 0.0)
    return float(rate)


def knee(levels: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The highest rate whose p99 TTFT and TPOT keep to the SLO, and the next rate explored above it."""
    def holds(r: dict[str, Any]) -> bool:
        return (r["p99_ttft_ms"] is not None and r["p99_ttft_ms"] <= args.slo_ttft_ms
                and r["p99_tpot_ms"] is not None and r["p99_tpot_ms"] <= args.slo_tpot_ms)

    rated = [r for r in levels if r["max_concurrency"] is None]  # the rate ladder (not the two anchors)
    held = [r["request_rate"] for r in rated if holds(r)]
    capacity = max(held) if held else None
    above = [r["request_rate"] for r in rated if capacity is not None and r["request_rate"] > capacity]
    return {"capacity_req_s": capacity, "next_explored_req_s": min(above) if above else None}


def ours(args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    import yaml

    sweep = {
        "name": "capacity-peer", "models": [args.model], "backends": "server",
        "backend_options": {"server": {"launch": "vllm", "args": _args(args)}}, "precisions": "bf16",
        "workload": {"mode": "serving", "input_len": args.input_len, "output_len": args.output_len,
                     "request_rate": {"capacity": {"low": args.low, "high": args.high,
                                                   "resolution": args.resolution}},
                     "num_prompts": 500, "duration_s": 5, "seed": 0,
                     "slo": {"ttft_ms": args.slo_ttft_ms, "tpot_ms": args.slo_tpot_ms}},
        "measure": {"warmup_iters": 1, "idle_s": 1.0, "min_window_s": 2.5, "timeout_s": 120},
    }
    path = out_dir / "capacity_peer.yaml"
    path.write_text(yaml.safe_dump(sweep))
    done = bounded([sys.executable, "-m", "sweeper", "run", str(path), "-o", str(out_dir / "results"), "-q"],
                   args.timeout_s, out_dir / "sweeper.log")
    result: dict[str, Any] = done.record()
    capacity = out_dir / "results" / "capacity.parquet"
    if capacity.is_file():
        import pyarrow.parquet as pq

        rows = pq.read_table(capacity).to_pylist()
        keys = ("capacity_req_s", "fail_load", "bounded_by", "precise", "imprecise_reason", "n_probes", "gpu_s",
                "slo_attainment", "energy_per_request_j", "ttft_p99_s", "tpot_p99_s")
        result["capacity"] = [{k: r.get(k) for k in keys} for r in rows]
        probes = pq.read_table(out_dir / "results" / "trials.parquet",
                               columns=["request_rate", "num_prompts", "probe_step", "slo_attainment", "duration_s",
                                        "ttft_p99_s", "tpot_p99_s", "unstable_reason", "status"]).to_pylist()
        result["probes"] = sorted(probes, key=lambda r: r["probe_step"] or 0)
    return result


def run(args: argparse.Namespace) -> int:
    from actors.models import materialize_servable

    model = str(materialize_servable(args.model))
    out = Path(args.out)
    results: dict[str, Any] = {"model": args.model, "slo": {"ttft_p99_ms": args.slo_ttft_ms,
                                                            "tpot_p99_ms": args.slo_tpot_ms}}
    for step in args.steps.split(","):
        where = out.with_name(f"{out.stem}_{step}")
        where.mkdir(parents=True, exist_ok=True)
        results[step] = peer(args, model, where) if step == "peer" else ours(args, where)
        write_record(out, "capacity-peer", results)
        if results[step].get("interrupted"):
            return 130  # Ctrl-C: what the step measured is written, the next step is not started
    return 0
