"""Several servers launched at the same moment on one machine: each on a port of its own,
each answered by itself.

    python3 -m bench launch-race [--engine fault|vllm] [--servers 4] [--out launch_race.json]

What it checks: ``ServerProcess.launch`` from that many threads at once (so the ports are
chosen within the same instant, the way several trial groups' actors on one node start
theirs); then, for every server, that it became ready, that its model list names the model
it was started with (each serves under a name of its own), that only processes of its own
group listen on its port, and that after ``stop`` nothing of its group runs. A port handed
to two launches shows as a server that never gets ready or a model list with the other's
name. ``--engine fault`` runs the tests' fault server (no GPU, seconds); ``--engine vllm``
runs ``vllm serve`` on a synthetic model (``--model``, random weights) with the GPU's
memory split between the servers and a 4 GiB KV cache each.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench import benchkit

READY_S = 600.0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--engine", choices=("fault", "vllm"), default="fault",
                    help="fault: the tests' fault server (CPU); vllm: `vllm serve` (GPU) (default: %(default)s)")
    ap.add_argument("--servers", type=int, default=4, help="servers launched at once (default: %(default)s)")
    ap.add_argument("--model", default="llama-3.2-1b", help="vllm: the synthetic model's preset (default: %(default)s)")
    ap.add_argument("--out", type=Path, default=Path("launch_race.json"), help="the record to write")


def _argv(engine: str, name: str, model_dir: str | None, servers: int) -> list[str]:
    if engine == "fault":
        from tests.fault_server import FAULT_SERVER

        return ["python", str(FAULT_SERVER), "--port", "{port}", "--model", name]
    from sweeper.core.servers import ENGINES

    # The command a sweep's launched vLLM server gets (the engine registry's), with the GPU's
    # memory split between the servers.
    args = {"enforce-eager": True, "max-model-len": 2048, "gpu-memory-utilization": f"{0.8 / servers:.3f}",
            # A KV cache of a set size: sized from a memory profile instead, an engine counts what
            # the others allocate meanwhile as its own (one of four came out at -4.3 GiB on an H200).
            "kv-cache-memory-bytes": 4 << 30}
    return ENGINES["vllm"].command(model=str(model_dir), served_model=name, precision="bf16", tensor_parallel=1,
                                   seed=0, synthetic=True, args=args, device="cuda")


def _check(proc: Any, name: str) -> dict[str, Any]:
    """One server, once ready: what answered, who listens; then stopped and its group gone."""
    from actors.backends.server.process import get_json, port_listeners
    from actors.backends.server.reaper import group_running

    row: dict[str, Any] = {"name": name, "port": proc.port, "pid": proc.pid}
    try:
        row["ready_s"] = round(proc.wait_ready(READY_S), 3)
        models = get_json(proc.base_url + "/models")
        row["served"] = [m["id"] for m in models["data"]] if isinstance(models, dict) else None
        ours, others = port_listeners(proc.port, proc.pid) or (set(), set())
        row["listeners_in_own_group"], row["listeners_elsewhere"] = sorted(ours), sorted(others)
    except Exception as exc:  # noqa: BLE001 - a failed server is this bench's finding, recorded
        row["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        proc.stop(30.0)
    deadline = time.monotonic() + 30.0
    while group_running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    row["group_left_running"] = group_running(proc.pid)
    row["ok"] = (row.get("served") == [name] and bool(row.get("listeners_in_own_group"))
                 and not row.get("listeners_elsewhere") and not row["group_left_running"])
    return row


def run(args: argparse.Namespace) -> int:
    from actors.backends.server.process import ServerProcess

    model_dir = None
    if args.engine == "vllm":
        from actors.models import materialize_servable

        model_dir = str(materialize_servable(args.model))
    logs = Path(tempfile.mkdtemp(prefix="launch-race-"))
    names = [f"race{i}" for i in range(args.servers)]

    def launch(name: str) -> Any:
        return ServerProcess.launch(_argv(args.engine, name, model_dir, args.servers),
                                    log_path=logs / f"{name}.log", stop_timeout_s=10.0)

    with ThreadPoolExecutor(max_workers=args.servers) as pool:
        procs = list(pool.map(launch, names))  # every port chosen within the same instant
        rows = list(pool.map(_check, procs, names))
    distinct = len({r["port"] for r in rows}) == len(rows)
    results = {"engine": args.engine, "servers": args.servers, "model": args.model if model_dir else None,
               "distinct_ports": distinct, "rows": rows, "ok": distinct and all(r["ok"] for r in rows),
               "logs": str(logs)}
    for r in rows:
        print(f"{r['name']}: port {r['port']} ready {r.get('ready_s')} s, serves {r.get('served')}, "
              f"listeners {r.get('listeners_in_own_group')} (elsewhere {r.get('listeners_elsewhere')})"
              f"{', ' + r['error'] if 'error' in r else ''} -> {'ok' if r['ok'] else 'FAILED'}")
    benchkit.write_record(args.out, "launch-race", results)
    return 0 if results["ok"] else 1
