"""Servers behind a key, and no secret anywhere in what a run leaves.

The servers are real (the fault server, serving real HTTP, demanding
``Authorization: Bearer <key>`` on /v1 when started with one, and printing its own
arguments and key at start as vLLM does); the sweep runs through the real command line,
Ray, Parquet and DuckDB.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path
from secrets import token_hex

import pyarrow.parquet as pq
import pytest

from sweeper.core.secrets import REDACTED, redact_argv
from tests.actors.backends.test_server_backend import READY_S, launch
from tests.conftest import run_cli
from tests.fault_server import FAULT_SERVER

# The external server's key, in the driver's environment: fresh for each test session, so that
# finding it in a file of Ray's shared temporary directory means this session leaked it.
EXTERNAL_KEY = f"sk-planted-external-{token_hex(8)}"
COMMAND_SECRET = "hf_planted_command_55d0b2"  # a secret flag's value in a launch command
KEY_VARIABLE = "SWEEPER_TEST_SERVER_KEY"


def _sweep(base_url: str) -> str:
    return f"""
name: keys
models: [tiny-llama]
backends: server
backend_options:
  server:
    - {{base_url: "{base_url}", model: fault, dialect: vllm, api_key_env: {KEY_VARIABLE}}}
    - launch:
        command: [python, "{FAULT_SERVER}", --port, "{{port}}", --model, keyed, --hf-token, {COMMAND_SECRET},
                  --api-key-env, FAULT_SERVER_KEY, --token-s, "0.002"]
        dialect: vllm
        api_key: {{env: FAULT_SERVER_KEY}}
precisions: fp32
workload: {{mode: serving, input_len: 8, output_len: 8, request_rate: 20, num_prompts: 40, seed: 0}}
measure: {{warmup_iters: 1, idle_s: 0, min_window_s: 0.2}}
"""


def _found_in(path: Path, secrets: tuple[str, ...]) -> list[str]:
    """The secrets a file holds: in its raw bytes, and (a Parquet file) in its decoded values."""
    data = path.read_bytes()
    found = [s for s in secrets if s.encode() in data]
    if path.suffix == ".parquet":
        text = str(pq.read_table(path).to_pylist())
        found += [s for s in secrets if s in text]
    return found


@pytest.mark.slow
def test_a_keyed_external_server_is_measured_and_no_secret_is_left_anywhere(tmp_path, write_sweep):
    external = launch(tmp_path, "--api-key", EXTERNAL_KEY, "--token-s", "0.002", name="external")
    try:
        sweep = write_sweep(_sweep(external.base_url))
        _wait_answering(external.base_url, EXTERNAL_KEY)
        out = tmp_path / "out"
        # On the shared Ray head, whose workers never had the key in their environment: it reaches
        # the actor in the actor's own runtime environment, or not at all.
        proc = run_cli("run", str(sweep), "-o", str(out), "-q", env={KEY_VARIABLE: EXTERNAL_KEY}, driver_env=True)
    finally:
        external.stop(2.0)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    rows = pq.read_table(out / "trials.parquet").to_pylist()
    assert len(rows) == 2 and {r["status"] for r in rows} == {"ok"}, [r.get("error") for r in rows]
    assert all(r["n_requests"] > 0 for r in rows)
    launched = next(r for r in rows if r["server_command"] is not None)
    assert f"--hf-token {REDACTED}" in launched["server_command"]
    # The launched server printed its arguments and the fresh key it was given: redacted in its log.
    log = Path(launched["server_log"]).read_text()
    assert "fault server args:" in log and f"key: {REDACTED}" in log and "key: None" not in log
    # Only the variable's name is kept of the external server's key.
    assert KEY_VARIABLE in next(r["backend_options"] for r in rows if r["server_command"] is None)
    planted = (EXTERNAL_KEY, COMMAND_SECRET)
    leaks = {str(p): found for p in out.rglob("*") if p.is_file() and (found := _found_in(p, planted))}
    assert leaks == {}
    assert not [s for s in planted if s in proc.stdout + proc.stderr]
    # Nor in Ray's session logs (the runtime-env agent's log printed an actor's env_vars in clear).
    logs = [p for p in _ray_temp_dir().glob("session_*/logs/**/*") if p.is_file()]
    assert logs, f"no Ray session log under {_ray_temp_dir()}"
    assert [str(p) for p in logs if EXTERNAL_KEY.encode() in _bytes_left(p)] == []


def _bytes_left(path: Path) -> bytes:
    """A log's bytes; none where it is gone since the listing (the session logs are shared by
    the suite's other Ray clusters, which remove their workers' logs as they end): a file
    removed leaves nothing behind to read."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _ray_temp_dir() -> Path:
    from ray._common.utils import get_default_ray_temp_dir

    return Path(get_default_ray_temp_dir())


def _wait_answering(base_url: str, key: str) -> None:
    import time

    deadline = time.monotonic() + READY_S
    while True:
        try:
            _get(base_url + "/models", key)
            return
        except OSError:
            assert time.monotonic() < deadline, "the external server never answered"
            time.sleep(0.1)


def _get(url: str, key: str | None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - our loopback server
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
def test_a_launched_server_answers_only_its_actor(tmp_path):
    """Started with a fresh key that only its actor holds, on loopback: a request without the
    key (another process of the node) is refused, the actor's own go through."""
    from actors.actor import TrialRunner
    from sweeper.core.trial import GroupLoad
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep

    options = {"launch": {"command": ["python", str(FAULT_SERVER), "--port", "{port}", "--host", "{host}",
                                      "--api-key-env", "FAULT_SERVER_KEY"],
                          "dialect": "vllm", "api_key": {"env": "FAULT_SERVER_KEY"}}}
    trial = make_plan(parse_sweep({
        "name": "k", "models": ["tiny-llama"], "backends": "server", "precisions": "fp32",
        "backend_options": {"server": options},
        "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": 20, "num_prompts": 10},
    }), "cpu").runnable[0]
    runner = TrialRunner()
    try:
        assert runner.load(trial, GroupLoad(server_log_dir=str(tmp_path / "servers"))).ok
        backend = runner.backend
        process = backend.process  # type: ignore[union-attr]
        assert process.base_url.startswith("http://127.0.0.1:")  # loopback only
        assert process.log_path.parent == tmp_path / "servers"  # where the load said
        assert _get(process.base_url + "/models", None) == 401
        assert _get(process.base_url + "/models", "a-guess") == 401
        key = backend.headers["Authorization"].removeprefix("Bearer ")  # type: ignore[union-attr]
        assert len(key) >= 32 and _get(process.base_url + "/models", key) == 200
        assert key not in " ".join(process.argv) and key not in process.log_path.read_text()
        assert runner.run(trial).row["status"] == "ok"
    finally:
        runner.close()


def test_an_external_servers_key_is_checked_before_any_trial_starts(tmp_path, write_sweep):
    server = launch(tmp_path, "--api-key", EXTERNAL_KEY, name="external")
    try:
        _wait_answering(server.base_url, EXTERNAL_KEY)
        root = server.base_url
        keyed = write_sweep(_sweep(root).split("    - launch:")[0] + "precisions: fp32\n"
                            "workload: {mode: serving, input_len: 8, output_len: 8, request_rate: 20, num_prompts: 4}\n", "keyed.yaml")
        unkeyed = write_sweep(keyed.read_text().replace(f", api_key_env: {KEY_VARIABLE}", ""), "unkeyed.yaml")
        cases = [
            (keyed, {}, f"backend_options.server.api_key_env: {KEY_VARIABLE} is not set in this environment"),
            (keyed, {KEY_VARIABLE: "sk-wrong"}, "backend_options.server.api_key_env: GET "),
            (unkeyed, {}, "backend_options.server.base_url: GET "),
            # Keys no HTTP header can carry: named as the key's fault before the server is asked.
            (keyed, {KEY_VARIABLE: "sk-wrong\nline"}, f"api_key_env: the key in {KEY_VARIABLE}: it holds a line break"),
            (keyed, {KEY_VARIABLE: "sk-wrong\n folded"}, "it holds a line break at character 9 of 16"),
            (keyed, {KEY_VARIABLE: "sk-wrong-\u20ac"}, "it holds a non-ASCII character at character 10 of 10"),
            (keyed, {KEY_VARIABLE: "sk-wrong-\u00e9"}, "it holds a non-ASCII character"),
        ]
        for sweep, extra, message in cases:  # `sweeper run` checks its servers before Ray starts
            proc = run_cli("run", str(sweep), "-o", str(tmp_path / "out"), env=extra, driver_env=True)
            assert proc.returncode == 2, proc.stderr
            assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
            assert "Traceback" not in proc.stderr and "sk-wrong" not in proc.stderr
            assert not (tmp_path / "out" / "shards").exists()  # nothing ran
        assert "refused the key" in run_cli("run", str(keyed), "-o", str(tmp_path / "out"),
                                            env={KEY_VARIABLE: "sk-wrong"}, driver_env=True).stderr
        assert "demands a key" in run_cli("run", str(unkeyed), "-o", str(tmp_path / "out")).stderr
    finally:
        server.stop(2.0)


def test_secret_flags_are_kept_out_of_ids_labels_and_records():
    from sweeper.core.servers import ServerOptions

    plain = ServerOptions.model_validate({"launch": "vllm", "args": {"max-num-seqs": 64}})
    secret = ServerOptions.model_validate({"launch": "vllm", "args": {"max-num-seqs": 64, "hf-token": "hf_x1"}})
    # Not part of the options' JSON (ids, stored rows, the plan record), nor of their repr.
    assert secret.model_dump_json() == plain.model_dump_json() and hash(secret) == hash(plain)
    assert "hf_x1" not in repr(secret) and secret.secret_args == {"hf-token": "hf_x1"}
    # The flag's last whole word: a token count, a token time or a key's variable are no secrets.
    assert ServerOptions.model_validate({"launch": "vllm", "args": {"max-num-batched-tokens": 8}}).args
    assert redact_argv(["serve", "--api-key", "k", "--token=t", "--max-num-batched-tokens", "8", "--token-s", "0.1",
                        "--api-key-env", "K"]) == [
        "serve", "--api-key", REDACTED, f"--token={REDACTED}", "--max-num-batched-tokens", "8", "--token-s", "0.1",
        "--api-key-env", "K"]
    with pytest.raises(ValueError, match="api_key_env: applies to a base_url server"):
        ServerOptions.model_validate({"launch": "vllm", "api_key_env": "K"})


def test_the_actor_is_told_which_variable_holds_the_key(monkeypatch):
    """On a cluster the actor may run on any node: the driver hands it the key (never the
    sweep file, never the results, never a runtime environment) with its load call."""
    from sweeper.core.backends import BACKENDS
    from sweeper.core.servers import ServerOptions

    options = ServerOptions.model_validate({"base_url": "http://127.0.0.1:1", "model": "m", "api_key_env": KEY_VARIABLE})
    assert BACKENDS["server"].actor_env(options) == (KEY_VARIABLE,)
    assert BACKENDS["server"].actor_env(ServerOptions.model_validate({"launch": "vllm"})) == ()
    # What goes with the load call shows the variable's name only, wherever it is printed.
    from sweeper.core.secrets import SecretValues
    from sweeper.core.trial import GroupLoad

    load = GroupLoad(secrets=SecretValues.of({KEY_VARIABLE: EXTERNAL_KEY}))
    assert load.secrets.get(KEY_VARIABLE) == EXTERNAL_KEY
    assert EXTERNAL_KEY not in repr(load) and KEY_VARIABLE in repr(load)
