"""The server backend's HTTP client and process lifecycle, against real server processes.

The client runs against ``tests/fault_server.py`` (a real aiohttp server that fails on
purpose) launched through ``ServerProcess``: streamed tokens, chunk accounting, HTTP and
mid-stream errors, a server dying mid-run, deadlines, the concurrency cap. The lifecycle
tests check by PID that a launched server's whole process group is gone after a stop,
after a failed start and after its launcher is SIGKILLed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from actors.backends.server.client import Endpoint
from actors.backends.server.fanout import run_http
from actors.backends.server.process import ServerError, ServerProcess, free_port, listening_pids
from actors.backends.server.reaper import alive, group_running
from actors.serving.records import NOT_SENT, UNFINISHED, ServingRequest
from sweeper.core.servers import DIALECTS
from tests.fault_server import FAULT_SERVER

READY_S = 30.0


def wait_gone(pids: list[int], bound_s: float = 15.0) -> list[int]:
    """The pids still alive after ``bound_s`` (polled)."""
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def read_pids(path: Path, count: int, bound_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if path.is_file():
            pids = [int(x) for x in path.read_text().split()]
            if len(pids) >= count:
                return pids
        time.sleep(0.05)
    raise AssertionError(f"{path} never listed {count} pids")


def launch(tmp_path: Path, *flags: str, name: str = "fault") -> ServerProcess:
    argv = ["python", str(FAULT_SERVER), "--port", "{port}", "--model", "fault", *flags]
    return ServerProcess.launch(argv, log_path=tmp_path / "servers" / f"{name}.log", stop_timeout_s=2.0)


@pytest.fixture
def server(request, tmp_path):
    flags = getattr(request, "param", ())
    proc = launch(tmp_path, "--pid-file", str(tmp_path / "pids"), *flags)
    proc.wait_ready(READY_S)
    yield proc
    proc.stop(2.0)
    assert wait_gone(read_pids(tmp_path / "pids", 1)) == []


def requests(n: int, gap_s: float = 0.0, output_len: int = 8) -> list[ServingRequest]:
    return [ServingRequest(i, np.arange(5, 21), output_len, i * gap_s) for i in range(n)]


def endpoint(server: ServerProcess, dialect: str = "vllm", chat: bool = False) -> Endpoint:
    d = DIALECTS[dialect]

    def body(r: ServingRequest) -> dict:
        return {"model": "fault", "stream": True, "stream_options": d.stream_options(),
                "prompt": [int(t) for t in r.prompt_ids],
                **d.length_fields(r.output_len, exact=True, eos_token_id=None)}

    path = "chat/completions" if chat else "completions"
    return Endpoint(url=f"{server.base_url}/{path}", body=body, continuous_usage=d.continuous_usage)


def serve(server: ServerProcess, reqs: list[ServingRequest], *, dialect: str = "vllm", cap: int | None = None,
          limit_s: float = 30.0):
    return run_http(endpoint(server, dialect), reqs, max_concurrency=cap, deadline_s=time.monotonic() + limit_s)


@pytest.mark.parametrize("server", [("--first-token-s", "0.05", "--token-s", "0.01")], indirect=True)
def test_every_token_is_stamped_and_counted(server):
    run = serve(server, requests(6, gap_s=0.02, output_len=10))
    assert [r.index for r in run.requests] == list(range(6))
    for r in run.requests:
        assert r.ok, r.error
        assert r.output_tokens == 10 and r.prompt_tokens == 16
        assert r.ttft_s is not None and r.ttft_s >= 0.05
        assert list(r.token_times_s) == sorted(r.token_times_s)
        # One token per chunk, each stamped as it is read: 9 gaps. Two chunks read in one go (a busy
        # machine's client falls behind the server's 10 ms) share a stamp, as documented: a gap of 0.
        assert len(r.itl_s) == 9 and min(r.itl_s) >= 0
        assert r.tpot_s == pytest.approx((r.finish_s - r.first_token_s) / 9)


@pytest.mark.parametrize("server", [("--tokens-per-chunk", "3", "--no-done", "--token-s", "0.02")], indirect=True)
def test_tokens_in_one_chunk_share_its_arrival_without_continuous_usage(server):
    """Chunks of 3 tokens counted as one each (the dialect cannot say more), the rest of the
    usage's 10 put at the last chunk; a stream that ends without [DONE] after its
    finish_reason is complete."""
    run = serve(server, requests(2, output_len=10), dialect="openai")
    for r in run.requests:
        assert r.ok, r.error
        assert r.output_tokens == 10
        times = r.token_times_s
        assert len(set(times)) == 4  # 4 chunks (3+3+3+1 tokens)
        assert times[-7:] == (times[-1],) * 7


@pytest.mark.parametrize("server", [("--tokens-per-chunk", "3", "--continuous-usage", "--token-s", "0.02")], indirect=True)
def test_continuous_usage_gives_each_chunk_its_exact_count(server):
    run = serve(server, requests(2, output_len=10))
    for r in run.requests:
        assert r.ok, r.error
        times = r.token_times_s
        assert len(times) == 10
        # 3, 3, 3, 1 tokens, each group at its own chunk's arrival
        assert [len([t for t in times if t == u]) for u in sorted(set(times))] == [3, 3, 3, 1]
        assert r.itl_s.count(0.0) == 6


@pytest.mark.parametrize("server", [("--http-error-every", "3", "--error-after-chunks", "99")], indirect=True)
def test_http_errors_are_per_request_errors(server):
    run = serve(server, requests(6, output_len=4))
    failed = [r for r in run.requests if not r.ok]
    assert len(failed) == 2 and all(r.error.startswith("HTTP 500") and "refused on purpose" in r.error
                                    for r in failed)
    assert len(run.completed) == 4


@pytest.mark.parametrize("server", [("--error-after-chunks", "2",)], indirect=True)
def test_an_error_mid_stream_fails_its_request(server):
    run = serve(server, requests(3, output_len=6))
    assert all(not r.ok and "mid-stream" in r.error and "on purpose" in r.error for r in run.requests)
    assert all(r.finish_s is None for r in run.requests)


def test_a_server_dying_mid_run_fails_the_rest_without_a_hang(tmp_path):
    proc = launch(tmp_path, "--die-after", "3", "--token-s", "0.01")
    proc.wait_ready(READY_S)
    t0 = time.monotonic()
    run = serve(proc, requests(8, gap_s=0.05, output_len=4), limit_s=60.0)
    assert time.monotonic() - t0 < 30.0
    # Requests begun before it died may have finished; none begun after it did.
    assert 1 <= len(run.completed) <= 3
    assert len(run.failed) >= 5 and all(r.error for r in run.failed)
    proc.stop(2.0)


@pytest.mark.parametrize("server", [("--hold-after-tokens", "3",)], indirect=True)
def test_the_deadline_cuts_the_run_and_keeps_what_arrived(server):
    """The server sends 3 of 50 tokens at once and then nothing, so what arrived before the
    deadline is known whatever the machine's speed (a token every 0.2 s against a 1.5 s limit
    gave 0 tokens on a loaded 2-core machine; 4 s to get 3 held tokens, too, once)."""
    reqs = requests(2, output_len=50) + [ServingRequest(2, np.arange(4), 4, 30.0)]  # arrives after the deadline
    t0 = time.monotonic()
    run = serve(server, reqs, limit_s=10.0)
    assert time.monotonic() - t0 < 10.0 + 5.0
    cut = {r.index: r for r in run.requests}
    assert cut[0].error == UNFINISHED and len(cut[0].token_times_s) == 3
    assert cut[2].error == NOT_SENT and cut[2].submit_s is None


@pytest.mark.parametrize("server", [("--hold-after-tokens", "0",)], indirect=True)
def test_a_hung_external_server_times_the_trial_out_with_its_requests_marked(server):
    """A server that takes every request and answers none: the trial's time limit ends it as
    ``timeout`` (re-run by --retry-failed) with a row per request, never as an exception."""
    from actors.actor import TrialRunner
    from sweeper.core.trial import GroupLoad
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep

    trial = make_plan(parse_sweep({
        "name": "hung", "models": ["tiny-llama"], "backends": "server", "precisions": "fp32",
        "backend_options": {"server": {"base_url": server.base_url, "model": "fault", "dialect": "vllm"}},
        "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": 50, "num_prompts": 6},
        "measure": {"warmup_iters": 1, "idle_s": 0, "timeout_s": 3},
    }), "cpu").runnable[0]
    runner = TrialRunner()
    try:
        assert runner.load(trial, GroupLoad()).ok
        outcome = runner.run(trial)
    finally:
        runner.close()
    row = outcome.row
    assert (row["status"], row["reason"]) == ("failed", "timeout"), row.get("error")
    assert "had not finished when the run's time limit" in row["error"]
    marked = outcome.tables["requests"]
    marked = marked.to_pylist() if hasattr(marked, "to_pylist") else marked
    assert len(marked) == 6 and all(r["error"] in (NOT_SENT, UNFINISHED) for r in marked)


@pytest.mark.parametrize("server", [("--token-s", "0.02",)], indirect=True)
def test_max_concurrency_caps_requests_in_flight(server):
    import json
    import urllib.request

    run = serve(server, requests(12, output_len=10), cap=3)
    assert len(run.completed) == 12
    with urllib.request.urlopen(server.base_url + "/models") as response:
        assert 1 <= json.loads(response.read())["max_in_flight"] <= 3  # what the server itself saw


# -- lifecycle ----------------------------------------------------------------------------

def test_stop_ends_the_whole_group_and_kills_what_ignores_sigterm(tmp_path):
    pid_file = tmp_path / "pids"
    proc = launch(tmp_path, "--pid-file", str(pid_file), "--child", "--ignore-term")
    proc.wait_ready(READY_S)
    pids = read_pids(pid_file, 2)
    assert all(alive(p) for p in pids)
    t0 = time.monotonic()
    code = proc.stop(timeout_s=1.0)
    assert code == -signal.SIGKILL  # SIGTERM was ignored: the bound passed, then SIGKILL
    assert time.monotonic() - t0 < 10.0
    assert wait_gone(pids) == []


def test_a_group_whose_processes_have_all_exited_is_not_waited_for():
    """A server that ends on SIGTERM stays a zombie until its launcher reaps it, and a zombie
    still answers killpg's signal 0: a stop that asked only that waited out its whole bound
    (30 s per launched server) for a server already gone."""
    leader = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while alive(leader.pid):  # exited, and left unreaped: a zombie
            assert time.monotonic() < deadline, "a process that does nothing never exited"
            time.sleep(0.02)
        os.killpg(leader.pid, 0)  # the zombie is still its group's member
        assert not group_running(leader.pid)
    finally:
        leader.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert group_running(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not group_running(sleeper.pid)


def test_a_server_that_exits_before_ready_says_why_in_one_line(tmp_path):
    pid_file = tmp_path / "pids"
    proc = launch(tmp_path, "--pid-file", str(pid_file), "--child", "--exit-before-ready", "3")
    with pytest.raises(ServerError) as err:
        proc.wait_ready(READY_S)
    text = str(err.value)
    assert "exited with code 3 before it was ready" in text and "failed on purpose" in text
    assert "\n" not in text and str(proc.log_path) in text
    proc.stop(2.0)
    assert wait_gone(read_pids(pid_file, 2)) == []  # its child went with it


def test_a_server_that_prints_its_help_after_the_error_is_quoted_by_its_error(tmp_path):
    """``vllm serve`` given a bad value prints the error, then its help: the error line leads."""
    message = "\n".join(["fault server: error: argument --max-model-len: invalid int value: 'lots'",
                          *(f"  --option-{k} VALUE   what option {k} does" for k in range(12))])
    proc = launch(tmp_path, "--exit-before-ready", "2", "--exit-message", message)
    with pytest.raises(ServerError) as err:
        proc.wait_ready(READY_S)
    proc.stop(2.0)
    text = str(err.value)
    assert "\n" not in text
    assert "): fault server: error: argument --max-model-len: invalid int value: 'lots' | ... | " in text
    assert text.endswith("--option-11 VALUE   what option 11 does")


def test_a_launch_port_is_kept_from_other_binds_but_open_to_its_server():
    """The port stays out of the kernel's pool (a plain bind of it is refused, so no bind of
    port 0 is handed it either) while a server binding it with SO_REUSEADDR gets it."""
    import errno
    import socket

    port = free_port()
    with socket.socket() as plain, pytest.raises(OSError) as err:
        plain.bind(("127.0.0.1", port))
    assert err.value.errno == errno.EADDRINUSE
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)


@pytest.mark.parametrize("ours", [
    ["python", "-c", "import time; time.sleep(120)"],  # it never binds: the other answers alone
    ["python", str(FAULT_SERVER), "--port", "{port}", "--model", "fault", "--reuse-port"],  # they share it
], ids=["held", "shared"])
def test_an_answer_from_another_process_on_the_port_is_not_the_server_s(tmp_path, ours):
    """Another process listening on the server's port (it bound it by number first, or shares
    it with SO_REUSEPORT as vLLM binds) would be measured in the server's name: its answer is
    refused in one line naming it, and the launched server is stopped."""
    proc = ServerProcess.launch(ours, log_path=tmp_path / "servers" / "ours.log", stop_timeout_s=2.0)
    other = subprocess.Popen([sys.executable, str(FAULT_SERVER), "--port", str(proc.port), "--model", "other",
                              "--reuse-port"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_S
        while other.pid not in (listening_pids(proc.port) or ()):  # the other is there first
            assert other.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(ServerError, match=rf"port {proc.port} is held by another process \(pid {other.pid}: ") as err:
            proc.wait_ready(READY_S)
        assert "\n" not in str(err.value)
        assert proc.popen.poll() is not None  # stopped
    finally:
        other.kill()
        other.wait()
        proc.stop(2.0)


def test_a_server_never_ready_is_stopped_at_the_bound(tmp_path):
    pid_file = tmp_path / "pids"
    proc = launch(tmp_path, "--pid-file", str(pid_file), "--never-ready")
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"did not answer .*/v1/models within 2 s"):
        proc.wait_ready(2.0)
    assert time.monotonic() - t0 < 15.0
    assert wait_gone(read_pids(pid_file, 1)) == []


def test_a_server_that_answers_errors_fails_after_the_grace_not_the_load_bound(tmp_path):
    """Up but broken (transformers serve without a Hub cache answers its model list with 500):
    the wait ends after the grace with the status, not at measure.load_timeout_s."""
    pid_file = tmp_path / "pids"
    proc = launch(tmp_path, "--pid-file", str(pid_file), "--models-error", "500")
    t0 = time.monotonic()
    with pytest.raises(ServerError, match=r"answered GET .*/v1/models with HTTP 500 for 1 s") as err:
        proc.wait_ready(600.0, error_grace_s=1.0)
    assert time.monotonic() - t0 < 30.0
    assert "\n" not in str(err.value)
    assert wait_gone(read_pids(pid_file, 1)) == []


def test_a_server_answering_503_while_it_warms_up_is_waited_for(tmp_path):
    proc = launch(tmp_path, "--ready-after-s", "1.5")
    try:
        assert proc.wait_ready(60.0, error_grace_s=30.0) >= 1.5
    finally:
        proc.stop(2.0)


def _launch_in_a_process(tmp_path: Path, pid_file: Path, *flags: str,
                         env: dict[str, str] | None = None) -> subprocess.Popen:
    """A process that launches the fault server (``flags`` added), says ``ready`` once it
    answers, then waits: the launcher an actor is, as a process of its own."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path.cwd())!r})
        from pathlib import Path
        from actors.backends.server.process import ServerProcess
        p = ServerProcess.launch(["python", {str(FAULT_SERVER)!r}, "--port", "{{port}}", "--pid-file",
                                  {str(pid_file)!r}, "--child", *{list(flags)!r}],
                                 log_path=Path({str(tmp_path / 'l.log')!r}), stop_timeout_s=2.0)
        p.wait_ready(30)
        print("ready", flush=True)
        time.sleep(600)
    """)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def test_a_launcher_killed_the_moment_its_server_starts_takes_it_with_it(tmp_path):
    """An interrupt as the server starts, on a machine where the watchdog is slow to start:
    the server's first act is to SIGKILL its launcher and the launcher's other children (what
    Ray does to a dead actor), and every Python the launcher starts takes a second longer to
    start the watchdog. The watchdog detaches before the server starts, so the server's group
    ends all the same; a watchdog started after the server was still the launcher's child
    there, died with it, and left the server's child running for good."""
    slow = tmp_path / "slow-watchdog"
    slow.mkdir()
    (slow / "sitecustomize.py").write_text(
        "import sys, time\nif sys.argv and sys.argv[0].endswith('reaper.py'):\n    time.sleep(1.0)\n")
    pid_file = tmp_path / "pids"
    launcher = _launch_in_a_process(tmp_path, pid_file, "--kill-launcher", env={"PYTHONPATH": str(slow)})
    try:
        assert launcher.wait(60) == -signal.SIGKILL
        pids = read_pids(pid_file, 2)
        assert wait_gone(pids) == [], [p for p in pids if alive(p)]
    finally:
        launcher.kill()


def test_a_killed_launcher_takes_its_server_with_it(tmp_path):
    """SIGKILL to the process that launched the server (what Ray does to an actor): nothing of
    the launcher runs any more, and the watchdog ends the server's group."""
    pid_file = tmp_path / "pids"
    launcher = _launch_in_a_process(tmp_path, pid_file)
    try:
        assert launcher.stdout is not None and launcher.stdout.readline().strip() == "ready"
        pids = read_pids(pid_file, 2)
        assert all(alive(p) for p in pids)
        launcher.kill()
        launcher.wait(10)
        assert wait_gone(pids) == []
    finally:
        launcher.kill()


def plan_one(sweep: dict, device: str) -> Any:
    """The sweep's one runnable trial."""
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep

    return make_plan(parse_sweep(sweep), device).runnable[0]


def run_trial(trial: Any) -> Any:
    """``trial`` loaded (it must load) and run on a fresh actor; its outcome."""
    from actors.actor import TrialRunner

    runner = TrialRunner()
    try:
        loaded = runner.load(trial)
        assert loaded.ok, loaded.error
        return runner.run(trial)
    finally:
        runner.close()


def run_one_trial(sweep: dict, device: str) -> Any:
    return run_trial(plan_one(sweep, device))


def _stand_in_group(monkeypatch, engine: str, *flags: str, **fields: Any) -> dict[str, Any]:
    """Launch one group of ``launch: engine`` in this process (``TrialRunner``, no Ray) with the
    fault server standing in for the engine's program, through the engine's own command line
    (the flags it does not know, it ignores); returns the group's one trial row."""
    import dataclasses

    from sweeper.core import servers

    stand_in = dataclasses.replace(servers.ENGINES[engine], program=("python", str(FAULT_SERVER), *flags),
                                   devices=frozenset({"cpu", "cuda"}), module="json", **fields)
    monkeypatch.setitem(servers.ENGINES, engine, stand_in)
    return run_one_trial({
        "name": "stand-in", "models": ["tiny-llama"], "backends": "server", "precisions": "bf16",
        "backend_options": {"server": {"launch": engine}},
        "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": 50, "num_prompts": 10},
        "measure": {"warmup_iters": 1, "idle_s": 0, "min_window_s": 0.05, "load_timeout_s": 60},
    }, "cpu").row


@pytest.mark.slow
def test_an_engine_whose_model_list_is_the_hub_cache_is_not_held_to_it(tmp_path, monkeypatch):
    """transformers serve 5.17 lists the Hub cache's models, not the one it was started with
    (on the GPU machine: an empty list), and answers the list with HTTP 500 where the cache
    directory does not exist: the launcher creates the directory, and serves the model it
    started although the list does not name it."""
    import huggingface_hub.constants

    hub = tmp_path / "never-downloaded" / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub))
    row = _stand_in_group(monkeypatch, "transformers", "--model", "some-cached-model",
                          "--models-error-unless-dir", str(hub))
    assert hub.is_dir()
    assert row["status"] == "ok", row.get("error")
    assert row["n_requests"] == 10 and row["n_failed_requests"] == 0
    assert "some-cached-model" in row["server_command"]


@pytest.mark.slow
def test_a_launched_vllm_server_shares_the_node_s_compile_cache(tmp_path, monkeypatch):
    """``vllm serve`` finds what in-process engines compiled (and they what it compiled): its
    VLLM_CACHE_ROOT is sweeper's node cache, as the in-process backend's; one the user set stays."""
    from actors.backends.vllm.backend import share_compile_cache

    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    for name in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):  # absent now, and again after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    env_out = tmp_path / "env.json"
    row = _stand_in_group(monkeypatch, "vllm", "--model", "tiny-llama", "--env-out", str(env_out))
    assert row["status"] == "ok", row.get("error")
    seen = json.loads(env_out.read_text())
    assert seen["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")
    assert seen["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")
    assert "VLLM_CACHE_ROOT" not in os.environ  # the server's environment, not the actor's
    assert share_compile_cache() == seen["VLLM_CACHE_ROOT"]  # the in-process engine's directory

    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "mine"))
    _stand_in_group(monkeypatch, "vllm", "--model", "tiny-llama", "--env-out", str(env_out))
    assert json.loads(env_out.read_text())["VLLM_CACHE_ROOT"] == str(tmp_path / "mine")


# -- an external server's energy site ------------------------------------------------------

def test_an_energy_site_meters_the_named_gpus_and_lists_their_processes(tmp_path, monkeypatch):
    """``base_url`` with ``energy: {node, gpu_uuids}``: the actor holds no GPU, yet meters the
    named ones (NVML is the test double: no GPU on a CPU machine), each on its own and summed,
    and records which processes were on them. The server is a real one (the fault server)
    serving real HTTP."""
    from tests.bench.test_bench_energy import RealClock
    from tests.fake_nvml import FakeGpu, FakeNvml, PowerTrace

    site, other = "GPU-5ea5ea5e-0000-0000-0000-000000000001", "GPU-5ea5ea5e-0000-0000-0000-000000000000"
    second = "GPU-5ea5ea5e-0000-0000-0000-000000000002"  # the server spans two GPUs (tensor parallel)
    fake = FakeNvml([FakeGpu(other, power=PowerTrace.constant(90.0)),
                     FakeGpu(site, power=PowerTrace.constant(300.0), process_pids=(os.getpid(),)),
                     FakeGpu(second, power=PowerTrace.constant(200.0))], RealClock())
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the client's actor holds no GPU
    server = launch(tmp_path, "--token-s", "0.01")
    try:
        server.wait_ready(READY_S)
        trial = plan_one({
            "name": "site", "models": ["tiny-llama"], "backends": "server", "precisions": "bf16",
            "backend_options": {"server": {"base_url": server.base_url, "model": "fault", "dialect": "vllm",
                                           "energy": {"node": "127.0.0.1", "gpu_uuids": [site, second]}}},
            "workload": {"mode": "serving", "input_len": 8, "output_len": 8, "request_rate": 20, "num_prompts": 40},
            "measure": {"warmup_iters": 1, "idle_s": 0.3, "min_window_s": 0.2},
        }, "cpu")
        assert trial.num_gpus == 0
        outcome = run_trial(trial)
    finally:
        server.stop(2.0)
    row = outcome.row
    assert row["status"] == "ok", row.get("error")
    assert row["gpu_uuids"] == f"{site},{second}" and row["energy_unmetered_reason"] is None
    assert row["client_processes"] == 1  # auto: 20 requests/s of 8 tokens need one
    assert row["energy_j"] > 0 and row["run_energy_j"] > 0
    # The site's two GPUs (500 W), within what the row itself reports as its uncertainty. The
    # steady window (about 1.4 s) has boundaries interpolated between counter reads made in
    # real time, so a busy machine that delays the sampler's reads moves each by up to some
    # 0.1 s x 500 W: a fixed 5 % would hold on an idle machine only.
    assert abs(row["energy_j"] - 500.0 * row["duration_s"]) <= 3 * row["energy_uncertainty_j"]
    # Each of the site's GPUs on its own (read back to back, so their boundary errors move
    # together and their ratio stays 300:200), summing to the row's.
    first, second_w = row["gpu_avg_power_w"]
    assert first / second_w == pytest.approx(1.5, rel=0.1)
    assert sum(row["gpu_energy_j"]) == pytest.approx(row["energy_j"], rel=1e-12)
    assert not any("nvmlDeviceGetTotalEnergyConsumption" in fns for uuid, fns in fake.reads_by_uuid.items()
                   if uuid == other)
    assert row["gpu_processes"] == f"{os.getpid()} {Path(f'/proc/{os.getpid()}/comm').read_text().strip()}"
    assert row["energy_exclusive"] is None  # whose processes they are is not known for an external server
    requests = outcome.tables["requests"].to_pylist()
    assert sum(r["energy_j"] for r in requests) == pytest.approx(row["run_energy_j"], rel=1e-9)
    # An HTTP server stamps no scheduling: its requests' prefills are counted from their sends.
    assert row["request_prefill_from"] == "sent" and 0 < row["request_prefill_share"] < 1


def test_without_an_energy_site_an_external_server_has_no_energy_and_says_why(tmp_path):

    server = launch(tmp_path)
    try:
        server.wait_ready(READY_S)
        row = run_one_trial({
            "name": "nosite", "models": ["tiny-llama"], "backends": "server", "precisions": "bf16",
            # Sent from two client processes (actors.backends.server.fanout), whatever the run's rate.
            "backend_options": {"server": {"base_url": server.base_url, "model": "fault", "dialect": "vllm",
                                           "client_processes": 2}},
            "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": 50, "num_prompts": 30},
            "measure": {"warmup_iters": 1, "idle_s": 0.3, "min_window_s": 0.05},
        }, "cuda").row
    finally:
        server.stop(2.0)
    assert row["status"] == "ok", row.get("error")
    assert all(row[c] is None for c in ("energy_j", "energy_per_token_j", "energy_per_request_j", "run_energy_j"))
    assert "base_url" in row["energy_unmetered_reason"] and "energy" in row["energy_unmetered_reason"]
    assert row["server_command"] is None and row["server_url"] == server.base_url
    assert row["client_processes"] == 2 and row["n_requests"] == 30


def test_a_servers_prefix_cache_hits_are_each_requests_and_the_trials_hit_rate(tmp_path):
    """A server that reports its prefix cache (``usage.prompt_tokens_details.cached_tokens``, as
    vLLM does with ``--enable-prompt-tokens-details``; here the fault server's cache of 16-token
    blocks) and a workload of shared prefixes: each request records what the cache held, and
    the trial's ``prefix_cache_hit_rate`` is their sum over the prompts' tokens."""

    server = launch(tmp_path, "--prefix-block", "16")
    try:
        server.wait_ready(READY_S)
        outcome = run_one_trial({
            "name": "prefix", "models": ["tiny-llama"], "backends": "server", "precisions": "bf16",
            "backend_options": {"server": {"base_url": server.base_url, "model": "fault", "dialect": "vllm"}},
            "workload": {"mode": "serving", "output_len": 4, "request_rate": 50, "num_prompts": 20,
                         "dataset": {"prefix_repetition": {"prefix_len": 32, "suffix_len": 8, "num_prefixes": 2}}},
            "measure": {"warmup_iters": 1, "idle_s": 0.3, "min_window_s": 0.05},
        }, "cpu")
    finally:
        server.stop(2.0)
    row, requests = outcome.row, outcome.tables["requests"].to_pylist()
    assert row["status"] == "ok", row.get("error")
    cached = [r["cached_tokens"] for r in requests]
    # A prefix's two 16-token blocks are held once a request with it has arrived; a suffix never is.
    assert set(cached) <= {0, 32} and cached.count(32) >= 20 - 2
    assert row["prefix_cache_hit_rate"] == pytest.approx(sum(cached) / sum(r["input_len"] for r in requests))
