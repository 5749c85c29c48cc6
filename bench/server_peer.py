"""A peer client against the same server: ``vllm bench serve`` beside sweeper's HTTP client.

One ``vllm serve`` is launched here with exactly the command line sweeper's ``launch:
vllm`` uses (``sweeper.core.servers``), on a synthetic model's servable directory. At
each rate, in turn on that one server:

  peer     ``vllm bench serve`` (vLLM's own client): random prompts of ``--input-len``
           tokens, ``--output-len`` tokens with EOS ignored, Poisson arrivals, its
           TTFT/TPOT/ITL percentiles saved as JSON;
  sweeper  ``sweeper run`` of a sweep whose backend is ``server`` with this server's
           ``base_url``: the same lengths, rate and number of requests.

With ``--matched``, a third client runs in every repeat: ``peer-matched``, ``vllm bench
serve`` sending the fields sweeper's client adds to each request (``min_tokens``, greedy
decoding, per-chunk usage: ``stream_options.continuous_usage_stats``) through ``--extra-body``, so that
a difference between the clients that those fields make shows as peer vs peer-matched.

With ``--aiperf CMD`` (a command that runs AIPerf, e.g. ``"python3 -m aiperf"``), a fourth
client runs in every repeat: AIPerf's ``profile`` with synthetic prompts of exactly
``--input-len`` tokens, ``--output-len`` tokens (``ignore_eos`` and ``min_tokens`` as extra
inputs), Poisson arrivals at the rate (at ``inf``: all requests at once, as ``--concurrency``),
its TTFT, inter-token latency and the delay from each request's credit to its send saved.

With ``--prefix-repetition PREFIX,SUFFIX,PREFIXES`` both clients send vLLM bench's shared-prefix
prompts instead of random ones: ``vllm bench serve --dataset-name prefix_repetition`` and
sweeper's ``dataset: {prefix_repetition: ...}`` with the same lengths (``--args`` turns the
server's prefix cache on: ``{"enable-prefix-caching": true}``); AIPerf is not run then.

``--client-processes 1,auto`` runs sweeper's client once per value in every repeat (its
requests sent from that many processes: ``actors.backends.server.fanout``), paired on the one
server. ``--tensor-parallel N`` serves on the first N GPUs and, with ``--energy``, sweeper
meters them as an external server's energy site (``energy: {node, gpu_uuids}``): each GPU's
energy and their sum per trial. ``--model`` names a synthetic preset or the bundled model.

Each rate runs ``--repeats`` times, peer then sweeper, the seed of both clients set to the
repeat's index, so that the difference between the clients can be set against the spread
of one client's repeats (Poisson arrivals of a few hundred requests differ run to run).
Reported per rate and repeat: TTFT and TPOT p50 and p99 of each (milliseconds), and
sweeper's over the peer's. The server is stopped (its process group) at the end, whatever
happened.

    python3 -m bench server-peer --model llama-3.1-8b --rates 4,16,32 --repeats 2 --out $OUT/server_peer.json
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.benchkit import write_record


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama-3.1-8b", help="a synthetic preset")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--rates", default="4,16,32,inf", help="requests per second, comma-separated")
    parser.add_argument("--duration-s", type=float, default=10.0, help="seconds of arrivals per rate")
    parser.add_argument("--max-prompts", type=int, default=600)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--args", default='{"max-num-seqs": 128}', help="engine flags, JSON")
    parser.add_argument("--repeats", type=int, default=1, help="runs per rate and client, alternating")
    parser.add_argument("--matched", action="store_true",
                        help="also run vllm bench serve with sweeper's request fields (min_tokens, per-chunk usage)")
    parser.add_argument("--prefix-repetition", default=None, metavar="PREFIX,SUFFIX,PREFIXES",
                        help="shared-prefix prompts (token lengths and the number of prefixes) for both clients")
    parser.add_argument("--aiperf", default=None,
                        help='a command that runs AIPerf (e.g. "python3 -m aiperf"): a third client in every repeat')
    parser.add_argument("--client-processes", default="auto",
                        help="sweeper's client processes, comma-separated (a count or auto): each in every repeat")
    parser.add_argument("--tensor-parallel", type=int, default=1, help="the server's GPUs (the first N)")
    parser.add_argument("--energy", action="store_true",
                        help="meter the server's GPUs through an energy site (external-server energy)")
    parser.add_argument("--results", default="/tmp/sweeper-results/server_peer", help="sweeper's results directory")
    parser.add_argument("--out", required=True)


def _matched_body(output_len: int) -> dict[str, Any]:
    """The fields sweeper's client adds to each vLLM request, from its vllm dialect itself:
    ``min_tokens`` (with ``ignore_eos``), greedy decoding, per-chunk usage. ``include_usage``
    is among them, which vllm bench serve reads too."""
    from sweeper.core.servers import DIALECTS

    dialect = DIALECTS["vllm"]
    body = dialect.length_fields(output_len, exact=True, eos_token_id=None)
    body.pop("max_tokens")  # vllm bench serve sets it from --random-output-len
    return {**body, "stream_options": dialect.stream_options()}


def _count(rate: float, duration_s: float, cap: int) -> int:
    return cap if math.isinf(rate) else min(cap, max(1, round(rate * duration_s)))


def _prefix_repetition(args: argparse.Namespace) -> dict[str, int] | None:
    if not args.prefix_repetition:
        return None
    prefix, suffix, prefixes = (int(x) for x in args.prefix_repetition.split(","))
    return {"prefix_len": prefix, "suffix_len": suffix, "num_prefixes": prefixes}


def _peer_dataset(args: argparse.Namespace) -> list[str]:
    shared = _prefix_repetition(args)
    if shared is None:
        return ["--dataset-name", "random", "--random-input-len", str(args.input_len),
                "--random-output-len", str(args.output_len)]
    return ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", str(shared["prefix_len"]),
            "--prefix-repetition-suffix-len", str(shared["suffix_len"]),
            "--prefix-repetition-num-prefixes", str(shared["num_prefixes"]),
            "--prefix-repetition-output-len", str(args.output_len)]


def _peer(base: str, served: str, tokenizer: str, rate: float, n: int, seed: int, args: argparse.Namespace,
          result_dir: Path, extra_body: dict[str, Any] | None = None) -> dict[str, Any]:
    name = f"peer_{rate:g}_{seed}{'_matched' if extra_body else ''}.json"
    cmd = [sys.executable, "-m", "vllm.entrypoints.cli.main", "bench", "serve", "--backend", "vllm",
           "--base-url", base, "--endpoint", "/v1/completions", "--model", served, "--tokenizer", tokenizer,
           *_peer_dataset(args), "--num-prompts", str(n),
           "--request-rate", "inf" if math.isinf(rate) else str(rate), "--ignore-eos", "--seed", str(seed),
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
           "--save-result", "--result-dir", str(result_dir), "--result-filename", name]
    if extra_body:
        cmd += ["--extra-body", json.dumps(extra_body)]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:], "wall_s": time.monotonic() - t0}
    r = json.loads((result_dir / name).read_text())
    keys = ("completed", "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
            "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
            "median_e2el_ms", "duration")
    return {**{k: r.get(k) for k in keys}, "wall_s": time.monotonic() - t0}


def _aiperf(command: str, base: str, served: str, tokenizer: str, rate: float, n: int, seed: int,
            args: argparse.Namespace, result_dir: Path) -> dict[str, Any]:
    """AIPerf's ``profile`` on the same server and load: exact prompt and reply lengths, Poisson
    arrivals at ``rate`` (at inf, every request at once). Milliseconds, from its own summary;
    ``credit_to_start`` is how long after its scheduler released a request the request left."""
    import shlex

    art = result_dir / f"aiperf_{rate:g}_{seed}"
    load = (["--concurrency", str(n)] if math.isinf(rate)
            else ["--request-rate", str(rate), "--arrival-pattern", "poisson"])
    cmd = [*shlex.split(command), "profile", "--model", served, "--url", base, "--endpoint-type", "completions",
           "--streaming", "--tokenizer", tokenizer, "--isl", str(args.input_len), "--isl-stddev", "0",
           "--osl", str(args.output_len), "--osl-stddev", "0", "--extra-inputs", "ignore_eos:true",
           "--extra-inputs", f"min_tokens:{args.output_len}", *load, "--request-count", str(n),
           "--random-seed", str(seed), "--ui", "none", "--no-gpu-telemetry", "--no-server-metrics",
           "--artifact-dir", str(art)]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    (result_dir / f"aiperf_{rate:g}_{seed}.log").write_text(done.stdout[-20000:] + done.stderr[-20000:])
    summary_path = art / "profile_export_aiperf.json"
    if done.returncode != 0 or not summary_path.exists():
        return {"error": (done.stderr or done.stdout)[-2000:], "wall_s": time.monotonic() - t0}
    r = json.loads(summary_path.read_text())

    def pct(key: str, p: str) -> float | None:
        return (r.get(key) or {}).get(p)

    return {"completed": (r.get("request_count") or {}).get("avg"),
            "request_throughput": pct("request_throughput", "avg"),
            "median_ttft_ms": pct("time_to_first_token", "p50"), "p99_ttft_ms": pct("time_to_first_token", "p99"),
            "median_itl_ms": pct("inter_token_latency", "p50"), "p99_itl_ms": pct("inter_token_latency", "p99"),
            "median_chunk_gap_ms": pct("inter_chunk_latency", "p50"),
            "median_e2el_ms": pct("request_latency", "p50"),
            "credit_to_start_p50_ms": pct("credit_to_start_latency", "p50"),
            "credit_to_start_p99_ms": pct("credit_to_start_latency", "p99"),
            "errors": r.get("error_summary"), "wall_s": time.monotonic() - t0}


def _sweeper(base: str, served: str, rate: float, n: int, seed: int, args: argparse.Namespace, results: Path,
             log: Path, processes: str, site: dict[str, Any] | None) -> dict[str, Any]:
    import yaml

    options: dict[str, Any] = {"base_url": base + "/v1", "model": served, "dialect": "vllm",
                               "client_processes": processes if processes == "auto" else int(processes)}
    if site is not None:
        options["energy"] = site
    sweep = {
        "name": "server-peer", "models": [args.model], "backends": ["server"],
        "backend_options": {"server": options},
        "precisions": [args.precision],
        "workload": {"mode": "serving", "output_len": args.output_len,
                     **({"input_len": args.input_len} if _prefix_repetition(args) is None
                        else {"dataset": {"prefix_repetition": _prefix_repetition(args)}}),
                     "request_rate": ["inf" if math.isinf(rate) else rate], "num_prompts": n, "seed": seed},
        "measure": {"warmup_iters": 1, "idle_s": 0.5, "min_window_s": 3.0},
    }
    path = Path(tempfile.mkdtemp()) / "peer.yaml"
    path.write_text(yaml.safe_dump(sweep))
    with open(log, "a") as out:
        subprocess.run([sys.executable, "-m", "sweeper", "run", str(path), "-o", str(results), "-q"],
                       stdout=out, stderr=subprocess.STDOUT, timeout=600, check=False)
    import pyarrow.parquet as pq

    rows = pq.read_table(results / "trials.parquet").to_pandas()
    rows = rows[rows["status"] == "ok"]
    rows = rows[rows["request_rate"] == rate]
    if rows.empty:
        return {"error": "no ok trial (see the run log)"}
    r = rows.iloc[0]
    ms = {k.replace("_s", "_ms"): (None if r[k] is None or r[k] != r[k] else float(r[k]) * 1000)
          for k in ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "itl_p50_s", "itl_p99_s", "e2e_p50_s")}
    def plain(key: str) -> Any:
        value = r.get(key)
        if value is None or (isinstance(value, float) and value != value):
            return None
        return value.tolist() if hasattr(value, "tolist") else value

    return {"n_requests": int(r["n_requests"]), "achieved_rate_req_s": r["achieved_rate_req_s"],
            "throughput_tok_s": r["throughput_tok_s"], **ms, "unstable_reason": r["unstable_reason"],
            **{k: plain(k) for k in ("client_processes", "prefix_cache_hit_rate", "send_lateness_p50_s", "send_lateness_p99_s",
                                     "send_lateness_max_s", "client_behind", "energy_j", "gpu_energy_j", "gpu_uuids",
                                     "energy_per_request_j", "energy_per_token_j", "avg_power_w",
                                     "energy_unmetered_reason")}}


def _energy_site(gpus: int) -> dict[str, Any]:
    """The first ``gpus`` GPUs of this node as an external server's energy site."""
    import pynvml
    import ray

    pynvml.nvmlInit()
    try:
        uuids = [pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(gpus)]
    finally:
        pynvml.nvmlShutdown()
    return {"node": ray.util.get_node_ip_address(), "gpu_uuids": [u.decode() if isinstance(u, bytes) else u
                                                                   for u in uuids]}


def run(args: argparse.Namespace) -> int:
    import os

    from actors.backends.server.process import ServerProcess
    from actors.models import materialize_bundled, materialize_servable
    from sweeper.core.bundled import BUNDLED_MODELS
    from sweeper.core.servers import ENGINES

    bundled = args.model in BUNDLED_MODELS
    model = str(materialize_bundled(args.model) if bundled else materialize_servable(args.model))
    served = args.model
    argv = ENGINES["vllm"].command(model=model, served_model=served, precision=args.precision,
                                   tensor_parallel=args.tensor_parallel, seed=0, synthetic=not bundled,
                                   args=json.loads(args.args), device="cuda")
    out = Path(args.out)
    log = out.with_suffix(".log")
    gpus = [str(i) for i in range(args.tensor_parallel)]
    env = {**os.environ, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    site = _energy_site(args.tensor_parallel) if args.energy else None
    server = ServerProcess.launch(argv, log_path=out.with_name("server_peer_vllm.log"), env=env)
    results: dict[str, Any] = {"command": server.argv, "energy_site": site, "rates": {}}
    try:
        results["ready_s"] = server.wait_ready(900.0)
        base = server.base_url.removesuffix("/v1")
        peer_dir = out.with_name(out.stem + "_clients")  # every client's own output, kept
        peer_dir.mkdir(parents=True, exist_ok=True)
        for text in args.rates.split(","):
            rate = float(text)
            n = _count(rate, args.duration_s, args.max_prompts)
            runs = results["rates"].setdefault(text, [])
            for seed in range(args.repeats):
                entry: dict[str, Any] = {
                    "num_prompts": n, "seed": seed,
                    "peer": _peer(base, served, model, rate, n, seed, args, peer_dir)}
                for processes in args.client_processes.split(","):
                    key = "sweeper" if processes == args.client_processes.split(",")[0] else f"sweeper_{processes}"
                    entry[key] = _sweeper(base, served, rate, n, seed, args,
                                          Path(args.results) / f"rate_{text}_{seed}_{processes}", log, processes, site)
                if args.aiperf and not args.prefix_repetition:
                    entry["aiperf"] = _aiperf(args.aiperf, base, served, model, rate, n, seed, args, peer_dir)
                if args.matched:
                    entry["peer_matched"] = _peer(base, served, model, rate, n, seed, args, peer_dir,
                                                  extra_body=_matched_body(args.output_len))
                p, s = entry["peer"], entry["sweeper"]
                for ours, theirs in (("ttft_p50_ms", "median_ttft_ms"), ("tpot_p50_ms", "median_tpot_ms")):
                    if s.get(ours) is not None and p.get(theirs):
                        entry[f"{ours}_ratio"] = s[ours] / p[theirs]
                    if s.get(ours) is not None and entry.get("peer_matched", {}).get(theirs):
                        entry[f"{ours}_ratio_matched"] = s[ours] / entry["peer_matched"][theirs]
                runs.append(entry)
                write_record(out, "server-peer", results)
    finally:
        results["server_exit_code"] = server.stop(30.0)
        write_record(out, "server-peer", results)
    return 0
