"""A launched server's command line: placeholders filled only where they are placeholders,
values (JSON ``args``, secrets, paths) passed as written, and no secret in any error.

Each server is real (``tests/fault_server.py``, standing in for an engine's program, prints
the arguments it was started with, as vLLM does), started through ``ServerProcess``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import logging
import shlex
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from actors.backends.server.backend import ServerBackend
from actors.backends.server.process import ServerError, ServerProcess
from sweeper.core.secrets import REDACTED
from sweeper.core.servers import ENGINES, LaunchCommand, ServerOptions
from tests.actors.backends.test_server_backend import READY_S, plan_one
from tests.fault_server import FAULT_SERVER

# A secret flag's value that str.format read as a field: its braces made the launch fail, and the
# error (KeyError: 'hf_planted_3b9d41') quoted what was between them.
BRACED_SECRET = "{hf_planted_3b9d41}"
SECRET_CORE = "hf_planted_3b9d41"
PLAIN_SECRET = "hf_planted_plain_7e20c4"  # no braces: the launch itself never fails on it
SPECULATION = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}


def _received(log_path: Path) -> list[str]:
    """The arguments the server says it was started with (its own line in its log)."""
    for line in log_path.read_text().splitlines():
        if line.startswith("fault server args: "):
            return list(ast.literal_eval(line.removeprefix("fault server args: ").rsplit(" key: ", 1)[0]))
    raise AssertionError(f"the server never said its arguments: {log_path.read_text()[-2000:]}")


def _after(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def _get(url: str, key: str) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 - our loopback server
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_mapping_or_list_in_args_reaches_every_engine_s_server_as_json(tmp_path, engine):
    """GUIDE's own recipe, `args: {speculative-config: {method: ngram, ...}}`: the launcher read
    every word as a format string, and the JSON's first key as an unknown field
    (KeyError: '"method"'), on every engine. Values, the model's path among them, reach the
    server as written; the engine's own placeholders are filled."""
    stand_in = dataclasses.replace(ENGINES[engine], program=("python", str(FAULT_SERVER)))
    model = str(tmp_path / "model-{seed}")  # a value: its braces are no placeholder either
    argv = stand_in.command(model=model, served_model="tiny-llama", precision="bf16", tensor_parallel=1, seed=0,
                            synthetic=False, device="cpu",
                            args={"speculative-config": SPECULATION, "cuda-graph-sizes": [1, 2, {"x": "{port}"}]})
    fields = {"model": model, "served_model": "tiny-llama", "dtype": "bfloat16", "tensor_parallel": "1",
              "seed": "0", "device": "cpu"}
    server = ServerProcess.launch(argv, log_path=tmp_path / f"{engine}.log", fields=fields, stop_timeout_s=2.0)
    try:
        server.wait_ready(READY_S)
        got = _received(server.log_path)
    finally:
        server.stop(2.0)
    assert json.loads(_after(got, "--speculative-config")) == SPECULATION
    assert _after(got, "--speculative-config") == json.dumps(SPECULATION, separators=(",", ":"))
    assert _after(got, "--cuda-graph-sizes") == '[1,2,{"x":"{port}"}]'  # a value: not filled
    assert model in got
    assert _after(got, "--port") == str(server.port) and _after(got, "--host") == "127.0.0.1"
    if "{device}" in stand_in.extra_flags:
        assert _after(got, "--device") == "cpu"


def test_a_launch_command_may_hold_json_and_a_secret_with_braces(tmp_path):
    """A command's JSON word was refused at plan time as an unknown placeholder; a secret with
    braces reaches its server as written (it demands exactly that key), and shows nowhere."""
    options = ServerOptions.model_validate({"launch": {"command": [
        "python", str(FAULT_SERVER), "--port", "{port}", "--host", "{host}",
        "--speculative-config", json.dumps(SPECULATION), "--api-key", BRACED_SECRET]}})
    launch = options.launch
    assert isinstance(launch, LaunchCommand)
    assert options.secret_flag_values() == (BRACED_SECRET,)
    server = ServerProcess.launch(launch.argv(), log_path=tmp_path / "cmd.log", stop_timeout_s=2.0,
                                  secrets=options.secret_flag_values(), headers={"Authorization": f"Bearer {BRACED_SECRET}"})
    try:
        server.wait_ready(READY_S)  # with the braced key: the server demands it, so it got it whole
        assert _get(server.base_url + "/models", BRACED_SECRET) == 200
        assert _get(server.base_url + "/models", SECRET_CORE) == 401
        got = _received(server.log_path)
    finally:
        server.stop(2.0)
    assert json.loads(_after(got, "--speculative-config")) == SPECULATION
    assert _after(got, "--api-key") == REDACTED  # what it printed of its own arguments, in its log
    assert SECRET_CORE not in server.log_path.read_text() and SECRET_CORE not in shlex.join(server.argv)
    # A placeholder of no known name is still refused where the sweep is read.
    with pytest.raises(ValueError, match=r"unknown placeholder \{mdoel\}"):
        ServerOptions.model_validate({"launch": {"command": ["srv", "--port", "{port}", "--model", "{mdoel}"]}})


def _secret_trial(secret: str) -> Any:
    """A launch command's trial whose command holds ``secret``; its server gets a fresh key."""
    command = ["python", str(FAULT_SERVER), "--port", "{port}", "--host", "{host}", "--hf-token", secret,
               "--api-key-env", "FAULT_SERVER_KEY"]
    return plan_one({
        "name": "secret", "models": ["tiny-llama"], "backends": "server", "precisions": "fp32",
        "backend_options": {"server": {"launch": {"command": command, "dialect": "vllm",
                                                  "api_key": {"env": "FAULT_SERVER_KEY"}}}},
        "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": 20, "num_prompts": 4},
        "measure": {"warmup_iters": 1, "idle_s": 0, "min_window_s": 0.05},
    }, "cpu")


def test_a_braced_secret_in_a_launch_command_loads_and_shows_nowhere(tmp_path, caplog):
    """The issue's case end to end in the actor: `--hf-token "{...}"` failed the load with the
    secret in the error (the trials row, its shard, the console)."""
    from actors.actor import TrialRunner
    from sweeper.core.trial import GroupLoad

    trial = _secret_trial(BRACED_SECRET)
    runner = TrialRunner()
    try:
        with caplog.at_level(logging.INFO):
            loaded = runner.load(trial, GroupLoad(server_log_dir=str(tmp_path / "servers")))
        assert loaded.ok, loaded.error
        process = runner.backend.process  # type: ignore[union-attr]
        assert f"--hf-token {REDACTED}" in shlex.join(process.argv)
        assert _after(_received(process.log_path), "--hf-token") == REDACTED
        assert SECRET_CORE not in process.log_path.read_text() and SECRET_CORE not in caplog.text
    finally:
        runner.close()


@pytest.mark.parametrize("where", ["load", "run"])
def test_an_error_quoting_a_launched_command_is_redacted_whatever_raised_it(tmp_path, monkeypatch, caplog, where):
    """Every error the actor reports (the row's error) or logs passes through the redaction the
    command line and the server's log pass through: here a failure whose message quotes the
    command (the launch) or the server's fresh key (the run), raised by no code of sweeper's."""
    from actors.actor import TrialRunner
    from sweeper.core.trial import GroupLoad

    def launch_quoting_its_command(cls: type, argv: list[str], **_: Any) -> ServerProcess:
        raise ServerError(f"could not start {shlex.join(argv)}")

    def serve_quoting_the_key(self: ServerBackend, *_: Any, **__: Any) -> Any:
        key = self.headers["Authorization"].removeprefix("Bearer ")
        raise RuntimeError(f"request refused: {self.headers} for {PLAIN_SECRET}; key={key}")

    if where == "load":
        monkeypatch.setattr(ServerProcess, "launch", classmethod(launch_quoting_its_command))
    else:
        monkeypatch.setattr(ServerBackend, "serve", serve_quoting_the_key)
    trial = _secret_trial(PLAIN_SECRET)
    runner = TrialRunner()
    try:
        with caplog.at_level(logging.INFO):
            loaded = runner.load(trial, GroupLoad(server_log_dir=str(tmp_path / "servers")))
            if where == "load":
                assert not loaded.ok
                error = loaded.error or ""
                assert error.startswith("ServerError: could not start python ")
            else:
                assert loaded.ok, loaded.error
                key = runner.backend.headers["Authorization"].removeprefix("Bearer ")  # type: ignore[union-attr]
                row = runner.run(trial).result.row()
                error = str(row["error"])
                assert row["status"] == "failed" and error.startswith("RuntimeError: request refused")
                assert key not in error and key not in caplog.text
        assert f"--hf-token {REDACTED}" in error or f"for {REDACTED}" in error
        assert PLAIN_SECRET not in error and PLAIN_SECRET not in caplog.text
    finally:
        runner.close()
