"""Endpoint mode end to end through the real command line, Ray, Parquet and DuckDB.

- ``sweeps/server.yaml``'s ``launch: transformers`` rows, and the bundled real model, served
  by ``transformers serve`` that each group's actor launches: every serving column filled,
  energy null with its reason (never 0), each server's log in ``DIR/servers/``, and no
  server process left once the sweep is over;
- an already-running ``transformers serve`` measured through ``base_url``;
- a server that cannot start fails its group in one line, and the sweep goes on;
- Ctrl-C and SIGTERM of ``sweeper run``, and a killed actor, leave no server process
  behind (checked by PID, a server's child process included).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.actors.backends.test_server_backend import alive, read_pids, wait_gone
from tests.conftest import ROOT, interruptible, on_the_shared_head, run_cli
from tests.fault_server import FAULT_SERVER
from tests.run.test_serving_e2e import SERVING_COLUMNS

SERVER_COLUMNS = ("server_engine", "server_version", "server_command", "server_url", "server_log", "server_ready_s",
                  "energy_unmetered_reason")




def _server_pids(results: Path) -> list[int]:
    """The pid each launched server's log names in its header."""
    pids = []
    for log in sorted((results / "servers").glob("*.log")):
        found = re.search(r"^# pid (\d+)", log.read_text(), re.MULTILINE)
        assert found, f"{log} names no pid"
        pids.append(int(found.group(1)))
    return pids


@pytest.mark.slow
def test_launched_transformers_servers_end_to_end(tmp_path, write_sweep, smollm2_dir):
    """The shipped example's transformers rows plus the bundled real model, each group served
    by its own launched ``transformers serve``."""
    text = (ROOT / "sweeps" / "server.yaml").read_text()
    # The bundled model in fp32: bf16 matmuls on a CPU without bf16 units crawl (TPOT > 1 s).
    text = text.replace("models: [tiny-llama]", "models: [tiny-llama, smollm2-135m]").replace(
        "precisions: bf16", "precisions: [bf16, fp32]\nexclude: [{model: smollm2-135m, precision: bf16}, "
                            "{model: tiny-llama, precision: fp32}]")
    # One rate, 24 requests of 8 tokens: the real model's server computes every request on 2
    # shared cores (its decode steps are most of this test's time).
    sweep = write_sweep(text.replace("request_rate: [4, 16]", "request_rate: [8]").replace(
        "num_prompts: 48", "num_prompts: 24").replace("output_len: 16", "output_len: 8"))
    out = tmp_path / "server"
    # A machine that never downloaded a model has no Hub cache directory, and transformers
    # serve answers its model list with an error there: the launcher creates it.
    hub = tmp_path / "no-hub-yet" / "hub"
    proc = run_cli("run", str(sweep), "-o", str(out), "-q", env={"HF_HUB_CACHE": str(hub)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert hub.is_dir()
    rows = duckdb.sql(f"SELECT * FROM '{out}/trials.parquet' ORDER BY model").df()
    launched = rows[rows["server_engine"] == "transformers"]
    assert len(launched) == 2 and set(launched["status"]) == {"ok"}, rows[["status", "error"]]
    assert set(launched["model"]) == {"tiny-llama", "smollm2-135m"}
    # The example's rows: every serving column. The real model, slow on 2 CPU cores
    # (hundreds of ms a step), is saturated at once: its latencies, not a steady window.
    example = launched[launched["model"] == "tiny-llama"]
    assert [c for c in SERVING_COLUMNS + SERVER_COLUMNS if example[c].isna().any()] == []
    latency = ("ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "itl_p50_s", "e2e_p50_s", "run_duration_s")
    assert [c for c in latency + SERVER_COLUMNS if launched[c].isna().any()] == []
    assert launched["energy_j"].isna().all() and launched["energy_per_request_j"].isna().all()
    assert launched["energy_unmetered_reason"].str.contains("no GPU").all()
    assert launched["server_command"].str.contains("transformers.cli.transformers serve").all()
    failed = duckdb.sql(f"SELECT trial_id, request_index, error FROM '{out}/requests.parquet' "
                        "WHERE error IS NOT NULL").fetchall()
    assert (example["output_tokens"] > 0).all() and (launched["n_failed_requests"] == 0).all(), failed
    # vLLM's rows are skipped without a GPU (or without vllm), with the reason.
    vllm = rows[rows["status"] == "skipped"]
    assert len(vllm) == 2 and vllm["error"].str.contains("launch: vllm").all()

    requests = duckdb.sql(f"SELECT trial_id, count(*) AS n, bool_and(error IS NULL) AS ok, "
                          f"bool_and(output_tokens = 8) AS exact FROM '{out}/requests.parquet' GROUP BY trial_id").df()
    assert requests["ok"].all() and requests["exact"].all()  # exactly output_len, through min_new_tokens
    counted = dict(zip(requests["trial_id"], requests["n"], strict=True))
    assert all(counted[t] == n for t, n in zip(launched["trial_id"], launched["n_requests"], strict=True))

    pids = _server_pids(out)
    assert len(pids) == 2
    assert wait_gone(pids, bound_s=5.0) == []  # stopped with their groups, before the sweep ended
    assert all(Path(p).is_file() and Path(p).parent == out / "servers" for p in launched["server_log"])


@pytest.mark.slow
def test_base_url_measures_a_running_transformers_serve(tmp_path, write_sweep):
    from actors.backends.server.process import ServerProcess
    from actors.models import materialize_servable
    from sweeper.core.servers import ENGINES

    model = str(materialize_servable("tiny-llama"))
    argv = ENGINES["transformers"].command(model=model, served_model=model, precision="fp32", tensor_parallel=1,
                                           seed=0, synthetic=True, args={}, device="cpu")
    server = ServerProcess.launch(argv, log_path=tmp_path / "external.log", fields={"device": "cpu"})
    try:
        server.wait_ready(120)
        sweep = write_sweep(f"""
name: external
models: [tiny-llama]
backends: server
backend_options:
  server: {{base_url: "{server.base_url}", model: "{model}", dialect: transformers}}
precisions: fp32
workload: {{mode: serving, input_len: 16, output_len: 8, request_rate: 8, num_prompts: 24, seed: 0}}
measure: {{warmup_iters: 1, idle_s: 0, min_window_s: 0.5}}
""")
        out = tmp_path / "external"
        proc = run_cli("run", str(sweep), "-o", str(out), "-q")
        assert proc.returncode == 0, proc.stderr[-3000:]
        row = duckdb.sql(f"SELECT * FROM '{out}/trials.parquet'").df().iloc[0]
        assert row["status"] == "ok", row["error"]
        assert row["server_engine"] == server.base_url and row["server_command"] is None
        assert row["server_version"] == __import__("transformers").__version__ or row["server_version"] is None
        assert row["throughput_tok_s"] > 0 and row["ttft_p50_s"] > 0 and row["n_failed_requests"] == 0
        assert row["energy_j"] is None or row["energy_j"] != row["energy_j"]  # null, never 0
        assert "base_url" in row["energy_unmetered_reason"]
        # A short multi-turn replay through the same real server: every turn's prompt resends the
        # conversation so far, the model's replies included.
        chats = tmp_path / "chats.jsonl"
        chats.write_text("\n".join(json.dumps({"conversations": [
            {"role": "user", "content": f"question {i} about the weather"}, {"role": "assistant", "content": "sun"},
            {"role": "user", "content": "and tomorrow?"}, {"role": "assistant", "content": "rain"},
            {"role": "user", "content": "thanks"}]}) for i in range(3)))
        sweep = write_sweep(f"""
name: external-chat
models: [tiny-llama]
backends: server
backend_options:
  server: {{base_url: "{server.base_url}", model: "{model}", dialect: transformers}}
precisions: fp32
workload: {{mode: serving, dataset: "{chats}", conversations: true, turn_gap_s: 0.1, output_len: 6,
           request_rate: 4, num_prompts: 3, seed: 0}}
measure: {{warmup_iters: 1, idle_s: 0, min_window_s: 0.2}}
""")
        out = tmp_path / "external-chat"
        proc = run_cli("run", str(sweep), "-o", str(out), "-q")
        assert proc.returncode == 0, proc.stderr[-3000:]
        row = duckdb.sql(f"SELECT * FROM '{out}/trials.parquet'").df().iloc[0]
        assert row["status"] == "ok", row["error"]
        assert row["n_conversations"] == 3 and row["conversations_completed"] == 3
        turns = duckdb.sql(f"SELECT conversation_id, turn, input_len, error FROM '{out}/requests.parquet' "
                           "ORDER BY conversation_id, turn").fetchall()
        assert [(c, t) for c, t, _, _ in turns] == [(c, t) for c in range(3) for t in range(3)]
        assert all(e is None for *_, e in turns)
        for c in range(3):  # the server counted each turn's history: it only grows
            lens = [n for cc, _, n, _ in turns if cc == c]
            assert lens[0] < lens[1] < lens[2], lens
        assert server.popen.poll() is None  # sweeper leaves a server it did not start running
    finally:
        server.stop(10.0)


def _fault_sweep(write_sweep, pid_file: Path, *variants: str, rate: float = 4, prompts: int = 8,
                 token_s: float = 0.0) -> Path:
    def command(extra: str) -> str:
        return (f'{{launch: {{command: [python, "{FAULT_SERVER}", --port, "{{port}}", --pid-file, "{pid_file}", '
                f'--child, --token-s, "{token_s}"{extra}], dialect: vllm}}}}')

    options = "\n".join(f"    - {command(v)}" for v in variants)
    return write_sweep(f"""
name: faults
models: [tiny-llama]
backends: server
backend_options:
  server:
{options}
precisions: fp32
workload: {{mode: serving, input_len: 8, output_len: 4, request_rate: {rate}, num_prompts: {prompts}, seed: 0}}
measure: {{warmup_iters: 1, idle_s: 0, min_window_s: 0.2, load_timeout_s: 60}}
""")


@pytest.mark.slow
def test_a_server_that_cannot_start_fails_its_group_in_one_line(tmp_path, write_sweep):
    pid_file = tmp_path / "pids"
    # A message with brackets (as transformers serve's own): every output path keeps them whole.
    # It names a module that is missing here, which a second run finds installed.
    sweep = _fault_sweep(write_sweep, pid_file, ", --exit-before-ready, '3', --exit-message, "
                                                "\"No module named 'sweeper_probe_pkg'. Install with pip install "
                                                "transformers[serving]\"", "")
    out = tmp_path / "faults"
    proc = run_cli("run", str(sweep), "-o", str(out))
    assert proc.returncode == 1, proc.stderr[-3000:]  # a failed trial: exit 1, the sweep went on
    rows = duckdb.sql(f"SELECT status, reason, error, backend_options FROM '{out}/trials.parquet'").df()
    failed, ok = rows[rows["status"] == "failed"], rows[rows["status"] == "ok"]
    assert len(failed) == 1 and len(ok) == 1
    error = failed["error"].iloc[0]
    assert failed["reason"].iloc[0] == "load_failed"
    assert "exited with code 3 before it was ready" in error and "transformers[serving]" in error
    # The log named is the results directory's: the driver said where with the load (a run in a
    # process whose Ray driver was already connected, as this one is, sets no job environment).
    assert "\n" not in error and f"{out / 'servers'}/" in error
    # The progress line says it with the log's last line (the summary repeats it, wrapped to the terminal).
    assert any("exited with code 3" in ln and "transformers[serving]" in ln for ln in proc.stderr.splitlines())
    summary = proc.stderr[proc.stderr.index("done in"):]
    failures = [ln for ln in summary.splitlines() if ln.lstrip().startswith("failed ")]
    assert len(failures) == 1 and "transformers[serving]" in " ".join(summary.split()), summary
    # The last lines say how to run it again; so does a plain re-run, which runs nothing.
    hint = f"1 trial(s) of this sweep stand failed in {out}; once their cause is fixed, run them again with: " \
           f"sweeper run {sweep} -o {out} --retry-failed"
    assert hint in " ".join(proc.stderr.split()) and "for want of a Python package" not in proc.stderr
    # The missing module installed (a real package on the path): the re-run, which runs
    # nothing, says that --retry-failed would now get further.
    (tmp_path / "site" / "sweeper_probe_pkg").mkdir(parents=True)
    (tmp_path / "site" / "sweeper_probe_pkg" / "__init__.py").write_text("")
    again = run_cli("run", str(sweep), "-o", str(out), env={"PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}"})
    assert again.returncode == 0 and "1 failed kept" in again.stderr and hint in " ".join(again.stderr.split())
    assert ("1 of them failed for want of a Python package that this environment now has (sweeper_probe_pkg): "
            "--retry-failed runs them again") in " ".join(again.stderr.split())
    assert wait_gone(read_pids(pid_file, 4)) == []  # both servers and both children


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_interrupting_the_sweep_leaves_no_server_behind(tmp_path, write_sweep, sig, code):
    pid_file = tmp_path / "pids"
    # 40 requests of 4 tokens, one every 0.25 s, each token 0.3 s: the run lasts long enough to be cut.
    sweep = _fault_sweep(write_sweep, pid_file, "", token_s=0.3, prompts=40)
    cmd, env = [sys.executable, "-m", "sweeper", "run", str(sweep), "-o", str(tmp_path / "out")], dict(os.environ)
    if sig == signal.SIGTERM:  # Ctrl-C on the embedded local Ray, SIGTERM on a cluster's driver
        cmd, env = on_the_shared_head(cmd)
    with interruptible(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env={**env, "COLUMNS": "200"}) as driver:
        pids = read_pids(pid_file, 2, bound_s=120.0)
        assert all(alive(p) for p in pids)
        driver.send_signal(sig)
        _, stderr = driver.communicate(timeout=120)
        assert driver.returncode == code, stderr[-2000:]
        assert wait_gone(pids, bound_s=30.0) == []  # before anything of the run's is killed


@pytest.mark.slow
def test_a_killed_actor_takes_its_server_with_it(tmp_path, write_sweep, ray_local):
    import ray

    from actors.actor import TrialRunner
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import load_sweep

    pid_file = tmp_path / "pids"
    trial = make_plan(load_sweep(_fault_sweep(write_sweep, pid_file, "")), "cpu").runnable[0]
    actor = ray.remote(TrialRunner).options(num_cpus=0).remote()
    loaded = ray.get(actor.load.remote(trial), timeout=120)
    assert loaded.ok, loaded.error
    pids = read_pids(pid_file, 2)
    assert all(alive(p) for p in pids)
    ray.kill(actor)  # what the driver does to a hung actor, and what a lost node does to every one
    assert wait_gone(pids, bound_s=30.0) == []


@pytest.mark.slow
def test_closing_the_actor_stops_its_server(tmp_path, write_sweep, ray_local):
    import ray

    from actors.actor import TrialRunner
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import load_sweep

    pid_file = tmp_path / "pids"
    trial = make_plan(load_sweep(_fault_sweep(write_sweep, pid_file, "")), "cpu").runnable[0]
    actor = ray.remote(TrialRunner).options(num_cpus=0).remote()
    assert ray.get(actor.load.remote(trial), timeout=120).ok
    outcome = ray.get(actor.run.remote(trial), timeout=120)
    assert outcome.row["status"] == "ok", outcome.row.get("error")
    pids = read_pids(pid_file, 2)
    ray.get(actor.close.remote(), timeout=60)
    assert wait_gone(pids, bound_s=5.0) == []
    ray.kill(actor)


def test_a_refused_base_url_is_one_line_and_exit_2(tmp_path, write_sweep):
    from actors.backends.server.process import free_port

    port = free_port()
    sweep = write_sweep(f"""
name: refused
models: [tiny-llama]
backends: server
backend_options:
  server: {{base_url: "http://127.0.0.1:{port}/v1", model: m}}
precisions: bf16
workload: {{mode: serving, input_len: 8, output_len: 4, request_rate: 2, num_prompts: 4}}
""")
    t0 = time.monotonic()
    proc = run_cli("run", str(sweep), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert time.monotonic() - t0 < 30
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "backend_options.server.base_url" in lines[0] and "refused" in lines[0]
    assert "Traceback" not in proc.stderr


def test_a_base_url_not_serving_the_model_is_one_line_and_exit_2(tmp_path, write_sweep):
    from actors.backends.server.process import ServerProcess

    server = ServerProcess.launch(["python", str(FAULT_SERVER), "--port", "{port}", "--model", "served"],
                                  log_path=tmp_path / "fault.log")
    try:
        server.wait_ready(30)
        sweep = write_sweep(f"""
name: wrong-model
models: [tiny-llama]
backends: server
backend_options:
  server: {{base_url: "{server.base_url}", model: other}}
precisions: bf16
workload: {{mode: serving, input_len: 8, output_len: 4, request_rate: 2, num_prompts: 4}}
""")
        proc = run_cli("run", str(sweep), "-o", str(tmp_path / "out"))
        assert proc.returncode == 2
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "backend_options.server.model" in lines[0]
        assert "does not serve 'other'; it serves: 'served'" in lines[0]
    finally:
        server.stop(5.0)


@pytest.mark.slow
def test_energy_sites_are_placed_on_their_node_or_refused(tmp_path, write_sweep):
    """An energy site on a node the cluster lacks is one line, exit 2 (its actor could never be
    placed); on this node it is placed there, and GPUs the node does not have fail the group
    with the reason (on a CPU machine: no NVML at all)."""
    from ray._private.services import get_node_ip_address

    from actors.backends.server.process import ServerProcess

    server = ServerProcess.launch(["python", str(FAULT_SERVER), "--port", "{port}", "--model", "served"],
                                  log_path=tmp_path / "fault.log")
    try:
        server.wait_ready(30)

        def sweep(node: str) -> Path:
            return write_sweep(f"""
name: site
models: [tiny-llama]
backends: server
backend_options:
  server: {{base_url: "{server.base_url}", model: served, dialect: vllm,
            energy: {{node: "{node}", gpu_uuids: [GPU-00000000-0000-0000-0000-00000000beef]}}}}
precisions: bf16
workload: {{mode: serving, input_len: 8, output_len: 4, request_rate: 20, num_prompts: 10}}
measure: {{warmup_iters: 1, idle_s: 0, min_window_s: 0.05}}
""", name=f"site-{node}.yaml")

        refused = run_cli("run", str(sweep("203.0.113.7")), "-o", str(tmp_path / "refused"))
        assert refused.returncode == 2, refused.stderr[-2000:]
        lines = [ln for ln in refused.stderr.strip().splitlines() if ln.startswith("error")]
        assert len(lines) == 1 and "backend_options.server.energy.node" in lines[0] and "203.0.113.7" in lines[0]

        out = tmp_path / "here"
        placed = run_cli("run", str(sweep(get_node_ip_address())), "-o", str(out), "-q")
        assert placed.returncode == 1, placed.stderr[-2000:]
        row = duckdb.sql(f"SELECT status, reason, error FROM '{out}/trials.parquet'").df().iloc[0]
        assert row["status"] == "failed" and row["reason"] == "load_failed"
        assert "backend_options.server.energy" in row["error"] and "are not metered on node" in row["error"]
    finally:
        server.stop(5.0)
