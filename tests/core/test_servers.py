"""The server backend's options and engine registry (sweeper.core.servers): command lines,
what each engine runs, the request fields each dialect sends, and refusals at plan time."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from sweeper.core.backends import BACKENDS
from sweeper.core.continuous_batching import CPU_KV_CACHE_PAGES, CPU_MAX_BATCH_TOKENS
from sweeper.core.errors import SweepFileError
from sweeper.core.servers import DIALECTS, ENGINES, ServerOptions, engine_args
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import parse_sweep


def test_engine_command_lines_carry_precision_parallelism_and_flags():
    vllm = ENGINES["vllm"].command(model="/m", served_model="llama-3.1-8b", precision="fp8", tensor_parallel=2,
                                   seed=3, synthetic=True, args={"max-num-seqs": 64, "enforce_eager": True},
                                   device="cuda")
    assert vllm[:4] == ["python", "-m", "vllm.entrypoints.cli.main", "serve"]
    text = " ".join(vllm)
    assert "/m --host {host} --port {port} --served-model-name llama-3.1-8b" in text
    assert "--dtype bfloat16 --quantization fp8 --tensor-parallel-size 2 --seed 3 --load-format dummy" in text
    assert text.endswith("--max-num-seqs 64 --enforce-eager")
    hf = ENGINES["transformers"].command(model="/m", served_model="x", precision="nf4", tensor_parallel=1, seed=0,
                                         synthetic=True, args={}, device="cuda")
    assert "--quantization bnb-4bit" in " ".join(hf) and "--continuous-batching" in hf and "--load-format" not in hf
    # On a GPU transformers sizes its KV cache itself.
    assert "--cb-num-blocks" not in hf and "--cb-max-batch-tokens" not in hf
    assert engine_args({"no_x": False, "n": 2}) == ["--no-no-x", "--n", "2"]
    # SGLang reports each reply's cached prompt tokens; its radix cache is turned off by args.
    sg = " ".join(ENGINES["sglang"].command(model="/m", served_model="x", precision="bf16", tensor_parallel=2,
                                            seed=1, synthetic=True, args={"disable-radix-cache": True},
                                            device="cuda"))
    assert "--tp-size 2 --random-seed 1 --load-format dummy --enable-cache-report --disable-radix-cache" in sg


def test_transformers_serve_on_a_cpu_gets_a_bounded_kv_cache_that_args_override():
    """transformers' default on a CPU is 60 % of the host's free memory, zeroed at start: a
    launched server on a CPU gets sweeper's bound instead, unless the sweep's args set one."""
    def command(args):
        return ENGINES["transformers"].command(model="/m", served_model="x", precision="fp32", tensor_parallel=1,
                                               seed=0, synthetic=True, args=args, device="cpu")

    bounded = " ".join(command({}))
    assert f"--cb-num-blocks {CPU_KV_CACHE_PAGES} --cb-max-batch-tokens {CPU_MAX_BATCH_TOKENS}" in bounded
    own = command({"cb-num-blocks": 8})
    assert own.count("--cb-num-blocks") == 1 and own[own.index("--cb-num-blocks") + 1] == "8"
    assert own[own.index("--cb-max-batch-tokens") + 1] == str(CPU_MAX_BATCH_TOKENS)


@pytest.mark.parametrize(("launch", "precision", "device", "tp", "why"), [
    ("vllm", "bf16", "cpu", 1, "runs on cuda, not cpu"),
    ("vllm", "nf4", "cuda", 1, "does not run precision nf4"),
    ("transformers", "fp8", "cpu", 1, "no fp8 flag"),
    ("transformers", "bf16", "cuda", 2, "serves from one device"),
    ("sglang", "fp32", "cuda", 1, "does not run precision fp32"),
])
def test_engines_refuse_what_they_cannot_run(launch, precision, device, tp, why):
    reason = BACKENDS["server"].unsupported_reason(precision, device, tp, ServerOptions(launch=launch))
    assert reason is not None and why in reason


def test_engines_run_their_precisions():
    server = BACKENDS["server"]
    assert server.unsupported_reason("fp32", "cpu", 1, ServerOptions(launch="transformers")) is None
    assert server.unsupported_reason("fp8", "cuda", 4, ServerOptions(launch="vllm")) is None
    assert server.unsupported_reason("bf16", "cuda", 1, ServerOptions(base_url="http://h:1/v1", model="m")) is None


def test_dialects_ask_for_exact_lengths_their_own_way():
    assert DIALECTS["vllm"].length_fields(7, exact=True, eos_token_id=2) == {
        "max_tokens": 7, "temperature": 0.0, "ignore_eos": True, "min_tokens": 7}
    assert DIALECTS["vllm"].length_fields(7, exact=False, eos_token_id=2) == {"max_tokens": 7, "temperature": 0.0}
    hf = DIALECTS["transformers"].length_fields(7, exact=False, eos_token_id=2)
    assert json.loads(hf["generation_config"]) == {"max_new_tokens": 7, "do_sample": False, "eos_token_id": 2}
    assert json.loads(DIALECTS["transformers"].length_fields(7, exact=True, eos_token_id=2)["generation_config"]) \
        == {"max_new_tokens": 7, "do_sample": False, "min_new_tokens": 7}
    assert DIALECTS["openai"].length_fields(7, exact=True, eos_token_id=2) == {"max_tokens": 7, "temperature": 0.0}
    assert DIALECTS["vllm"].stream_options() == {"include_usage": True, "continuous_usage_stats": True}


@pytest.mark.parametrize(("options", "message"), [
    ({}, "exactly one of launch"),
    ({"launch": "vllm", "base_url": "http://h:1/v1"}, "exactly one of launch"),
    ({"base_url": "http://h:1/v1"}, "model: required with base_url"),
    ({"base_url": "ftp://h/v1", "model": "m"}, "should match pattern"),
    ({"launch": "vllm", "energy": {"node": "1.2.3.4", "gpu_uuids": ["GPU-1"]}}, "energy: applies to a base_url"),
    ({"launch": {"command": ["srv", "--port", "{port}", "--x", "{nope}"]}}, "unknown placeholder {nope}"),
    ({"launch": {"command": ["srv"]}}, "must contain {port}"),
    ({"launch": "tgi"}, "launch"),
])
def test_bad_server_options_name_their_field(options, message):
    with pytest.raises(ValidationError, match=message.replace("{", r"\{").replace("}", r"\}")):
        ServerOptions.model_validate(options)


def _sweep(**over) -> dict:
    base = {"name": "s", "models": ["tiny-llama"], "backends": "server", "precisions": "bf16",
            "backend_options": {"server": [{"launch": "transformers"}, {"launch": "vllm"}]},
            "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": [2, 4],
                         "num_prompts": 8}}
    return {**base, **over}


def test_an_offline_sweep_naming_the_server_backend_is_refused():
    data = _sweep(workload={"input_len": 8, "output_len": 4}, batch_sizes=[1])
    with pytest.raises(SweepFileError, match="backends: server measures a server.*no offline mode"):
        parse_sweep(data)


def test_a_server_backend_without_options_is_refused():
    data = _sweep()
    del data["backend_options"]
    with pytest.raises(SweepFileError, match="backend_options.server: required"):
        parse_sweep(data)


def test_plan_skips_an_engine_the_device_cannot_run_and_places_clients_without_gpus():
    plan = make_plan(parse_sweep(_sweep()), "cpu")
    by_engine = {(p.trial.backend_options.label(), p.trial.request_rate): p for p in plan.trials}
    assert by_engine[("transformers", 2.0)].runnable
    assert "launch: vllm runs on cuda, not cpu" in (by_engine[("vllm", 2.0)].skip_reason or "")
    external = parse_sweep(_sweep(backend_options={"server": {"base_url": "http://h:1/v1", "model": "m"}}))
    trial = make_plan(external, "cuda").trials[0].trial
    assert trial.num_gpus == 0  # a client of a server running elsewhere holds no GPU
    assert BACKENDS["server"].ray_resources(trial.backend_options) == {}
    sited = ServerOptions(base_url="http://h:1/v1", model="m", energy={"node": "10.0.0.5", "gpu_uuids": ["GPU-a"]})
    assert BACKENDS["server"].ray_resources(sited) == {"node:10.0.0.5": 0.001}


def test_option_variants_are_distinct_trials_with_stable_ids():
    plan = make_plan(parse_sweep(_sweep()), "cuda")
    ids = [p.trial.trial_id for p in plan.trials]
    assert len(set(ids)) == 4
    assert ids == [p.trial.trial_id for p in make_plan(parse_sweep(_sweep()), "cuda").trials]


def test_a_launched_engine_whose_server_packages_are_missing_is_skipped_with_its_install_line():
    """transformers installed without its [serving] extra: `transformers serve` would fail at
    run time; the plan skips its trials instead, saying what to install."""
    from sweeper.plan.capabilities import (
        LOCAL,
        Capabilities,
        NodeCapabilities,
        library_versions,
        probed_libraries,
    )

    have = library_versions(probed_libraries())
    without = {**have, "fastapi": None}
    sweep = parse_sweep(_sweep(backend_options={"server": {"launch": "transformers"}}))
    skipped = make_plan(sweep, "cpu", capabilities=Capabilities((NodeCapabilities("n", "h", 0, without),), LOCAL))
    assert {p.skip_reason for p in skipped.trials} == {
        "backend server needs fastapi, which is not installed in the local environment; install it with: "
        "pip install 'transformers[serving]'"}
    ready = make_plan(sweep, "cpu", capabilities=Capabilities((NodeCapabilities("n", "h", 0, have),), LOCAL))
    assert all(p.runnable for p in ready.trials)  # this environment has the extra (the tests need it)


def test_a_base_url_with_a_user_or_password_is_refused_without_showing_it(write_sweep):
    """`http://user:pw@host` passed validation, then failed as a DNS error that printed the
    password: refused where the sweep is read, in one line naming the field, the URL unquoted
    (the server's key goes in api_key_env)."""
    from tests.conftest import run_cli

    password = "pw-planted-41c9"
    for url in (f"http://user:{password}@127.0.0.1:1/v1", f"https://{password}@server.example/v1"):
        sweep = write_sweep(f"""
name: userinfo
models: [tiny-llama]
backends: server
backend_options:
  server: {{base_url: "{url}", model: m}}
precisions: bf16
workload: {{mode: serving, input_len: 8, output_len: 4, request_rate: 2, num_prompts: 4}}
""")
        proc = run_cli("plan", str(sweep))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "backend_options.server.base_url: holds a user name or password" in lines[0]
        assert "api_key_env" in lines[0] and "Traceback" not in proc.stderr
        assert password not in proc.stdout + proc.stderr
    # The authority only: a path may hold an @.
    assert ServerOptions(base_url="http://h:1/v1/a@b", model="m").base_url == "http://h:1/v1/a@b"
