"""The vllm backend on a machine without vLLM: options, plan-time skips, result conversion,
and what happens when a vllm trial reaches a worker that lacks it.

The conversion tests feed ``RequestOutput``-shaped records (the field names of
vLLM's V1 ``RequestOutput`` / ``CompletionOutput`` / ``RequestStateStats``):
data fixtures, not stand-ins for sweeper code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from actors.backends import BackendUnavailable, create_backend
from actors.backends.vllm.backend import (
    VllmBackend,
    VllmMetricsError,
    architecture_overrides,
    capability_problem,
    engine_kwargs,
    generation_from_outputs,
)
from actors.measure import request_records
from actors.records import Generation
from sweeper.core.backends import BACKENDS, VllmOptions
from sweeper.core.errors import SweepFileError
from sweeper.plan.capabilities import (
    LOCAL,
    Capabilities,
    NodeCapabilities,
    local_capabilities,
    probe_cluster,
    probed_libraries,
)
from sweeper.plan.expand import expand, make_plan
from sweeper.plan.spec import parse_sweep
from tests.conftest import ROOT, run_cli

BASE = {
    "name": "v", "models": ["tiny-llama"], "backends": ["transformers", "vllm"],
    "precisions": ["bf16"], "batch_sizes": [1, 4], "workload": {"input_len": 8, "output_len": 4},
}


def sweep(**patch):
    return parse_sweep({**BASE, **patch})


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "field", "says"), [
    ({"gpu_memory_utilization": 1.5}, "backend_options.vllm.gpu_memory_utilization", "less than or equal to 1"),
    ({"gpu_memory_utilization": 0}, "backend_options.vllm.gpu_memory_utilization", "greater than 0"),
    ({"max_num_seqs": 0}, "backend_options.vllm.max_num_seqs", "greater than 0"),
    ({"max_num_seqs": 2.5}, "backend_options.vllm.max_num_seqs", "integer"),
    ({"max_model_len": -1}, "backend_options.vllm.max_model_len", "greater than 0"),
    ({"kv_cache_dtype": "int4"}, "backend_options.vllm.kv_cache_dtype", "'auto'"),
    ({"enforce_eager": "sometimes"}, "backend_options.vllm.enforce_eager", "boolean"),
    ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "backend_options.vllm.max_num_batched_tokens",
     "at least max_num_seqs (64)"),
    ({"tensor_parallel_size": 2}, "backend_options.vllm.tensor_parallel_size", "unknown key"),
    ({"speculative": {"method": "eagle", "num_speculative_tokens": 4}}, "backend_options.vllm.speculative.method",
     "'ngram'"),
    ({"speculative": {"num_speculative_tokens": 0}}, "backend_options.vllm.speculative.num_speculative_tokens",
     "greater than 0"),
    ({"speculative": {"method": "ngram"}}, "backend_options.vllm.speculative.num_speculative_tokens", "required"),
    ({"speculative": {"num_speculative_tokens": 4, "prompt_lookup_max": 2, "prompt_lookup_min": 3}},
     "backend_options.vllm.speculative.prompt_lookup_min", "at most prompt_lookup_max (2)"),
])
def test_bad_options_name_the_field(options, field, says):
    with pytest.raises(SweepFileError) as info:
        parse_sweep({**BASE, "backend_options": {"vllm": options}}, "s.yaml")
    text = str(info.value)
    assert f"s.yaml: {field}: " in text and says in text
    assert "\n" not in text


def test_option_variants_name_their_index():
    with pytest.raises(SweepFileError, match=r"backend_options\.vllm\[1\]\.max_num_seqs: "):
        parse_sweep({**BASE, "backend_options": {"vllm": [{"enforce_eager": True}, {"max_num_seqs": 0}]}})


def test_bad_options_exit_2_through_the_cli(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: v\nmodels: tiny-llama\nbackends: vllm\nprecisions: bf16\nbatch_sizes: 1\n"
                   "workload: {input_len: 8, output_len: 4}\n"
                   "backend_options: {vllm: {gpu_memory_utilization: 2}}\n")
    r = run_cli("plan", str(bad))
    assert r.returncode == 2, r.stdout + r.stderr
    # One message (the console may wrap it at its width), no traceback.
    text = r.stderr.replace("\n", "")
    assert text.startswith("error: ") and "Traceback" not in text, r.stderr
    assert "backend_options.vllm.gpu_memory_utilization: Input should be less than or equal to 1" in text


def test_options_are_identity_only_when_not_default():
    plain, _ = expand(sweep(backends="vllm"))
    defaults, _ = expand(sweep(backends="vllm", backend_options={"vllm": {"enable_prefix_caching": False}}))
    cached, _ = expand(sweep(backends="vllm", backend_options={"vllm": {"enable_prefix_caching": True}}))
    assert [t.trial_id for t in plain] == [t.trial_id for t in defaults]
    assert not {t.trial_id for t in plain} & {t.trial_id for t in cached}
    assert plain[0].load_key != cached[0].load_key  # another engine, another group
    assert "enable_prefix_caching=True" in cached[0].label()


# -- plan time -------------------------------------------------------------------------------


def _node(name: str, gpus: int, **libs: str | None) -> NodeCapabilities:
    versions = dict.fromkeys(probed_libraries(), "1.0")
    versions.update(libs)
    return NodeCapabilities(name, name, gpus, versions)


def _reasons(plan) -> dict[tuple[str, str, int], str | None]:
    return {(p.trial.backend, p.trial.precision, p.trial.tensor_parallel): p.skip_reason for p in plan.trials}


def test_local_environment_without_vllm_skips_vllm_trials():
    caps = local_capabilities(gpus=1)
    assert caps.source == LOCAL and caps.nodes[0].libraries["vllm"] is None  # CI never installs vllm
    plan = make_plan(sweep(), "cuda", capabilities=caps)
    reasons = _reasons(plan)
    assert reasons[("transformers", "bf16", 1)] is None
    assert reasons[("vllm", "bf16", 1)] == "backend vllm needs vllm, which is not installed in the local environment"
    assert len(plan.skipped) == 2 and all(p.trial.backend == "vllm" for p in plan.skipped)
    assert "local environment" in plan.notes[-1]


def test_a_gpu_worker_with_vllm_behind_a_head_without_it_runs_vllm():
    caps = Capabilities((_node("head", 0, vllm=None), _node("gpu", 1, vllm="0.26.0")), "cluster, 2 nodes probed")
    assert make_plan(sweep(), "cuda", capabilities=caps).skipped == []


def test_vllm_only_on_a_gpu_less_node_is_a_skip_naming_the_gpu_need():
    caps = Capabilities((_node("head", 0, vllm="0.26.0"), _node("gpu", 1, vllm=None)), "cluster, 2 nodes probed")
    reason = _reasons(make_plan(sweep(), "cuda", capabilities=caps))[("vllm", "bf16", 1)]
    assert reason == ("backend vllm needs vllm, which no node with 1 GPU of the cluster has installed "
                      "(cluster, 2 nodes probed)")


def test_precision_library_version_is_judged_on_the_nodes_not_the_driver():
    s = sweep(backends="transformers", precisions="nf4")
    old = Capabilities((_node("a", 0, bitsandbytes="0.45.0"),), "cluster, 1 node probed")
    assert "needs bitsandbytes>=0.46; 0.45.0 is installed" in _reasons(make_plan(s, "cpu", capabilities=old))[
        ("transformers", "nf4", 1)]
    mixed = Capabilities(old.nodes + (_node("b", 0, bitsandbytes="0.50.2"),), "cluster, 2 nodes probed")
    assert make_plan(s, "cpu", capabilities=mixed).skipped == []
    missing = Capabilities((_node("a", 0, bitsandbytes=None),), "cluster, 1 node probed")
    assert _reasons(make_plan(s, "cpu", capabilities=missing))[("transformers", "nf4", 1)].startswith(
        "precision nf4 needs bitsandbytes, which no node of the cluster has installed")


def test_no_answer_is_not_a_reason_to_skip():
    assert make_plan(sweep(), "cuda", capabilities=Capabilities((), "cluster, 0 nodes probed")).skipped == []


def test_tensor_parallel_and_precisions_vllm_lacks_are_skipped_with_their_reason():
    caps = Capabilities((_node("gpu", 8, vllm="0.26.0"),), "cluster, 1 node probed")
    plan = make_plan(sweep(backends="vllm", precisions=["bf16", "nf4", "int8", "fp8"], tensor_parallel=[1, 2, 16]),
                     "cuda", capabilities=caps)
    reasons = _reasons(plan)
    assert reasons[("vllm", "bf16", 2)] is None and reasons[("vllm", "fp8", 1)] is None
    assert reasons[("vllm", "bf16", 16)] == "backend vllm runs tensor_parallel <= 8, not 16"
    assert "bitsandbytes" in reasons[("vllm", "nf4", 1)] and "synthetic" in reasons[("vllm", "int8", 1)]
    cpu = _reasons(make_plan(sweep(backends="vllm", tensor_parallel=[1, 2]), "cpu", capabilities=caps))
    assert cpu[("vllm", "bf16", 2)] == "backend vllm does not run on cpu"


@pytest.mark.slow
def test_the_ray_probe_reports_each_nodes_libraries(ray_local):
    import importlib.metadata

    caps = probe_cluster()
    assert caps.source == "cluster, 1 node probed" and not caps.unanswered
    (node,) = caps.nodes
    assert node.libraries["transformers"] == importlib.metadata.version("transformers")
    assert node.libraries["vllm"] is None
    reason = _reasons(make_plan(sweep(), "cuda", capabilities=caps))[("vllm", "bf16", 1)]
    assert reason == "backend vllm needs vllm, which no node of the cluster has installed (cluster, 1 node probed)"


# -- engine arguments ---------------------------------------------------------------------------


def test_engine_kwargs_for_a_synthetic_bf16_model():
    kw = engine_kwargs(model_path="/m", precision="bf16", options=VllmOptions(), tensor_parallel=1, seed=3,
                       dummy_weights=True, hf_overrides={"architectures": ["LlamaForCausalLM"]})
    assert kw == {
        "model": "/m", "dtype": "bfloat16", "seed": 3, "tensor_parallel_size": 1,
        "gpu_memory_utilization": 0.9, "enforce_eager": False, "enable_prefix_caching": False,
        "kv_cache_dtype": "auto", "skip_tokenizer_init": True, "disable_log_stats": False,
        "worker_extension_cls": "actors.backends.vllm.worker.SweeperWorkerExtension",
        "load_format": "dummy", "hf_overrides": {"architectures": ["LlamaForCausalLM"]},
    }


def test_engine_kwargs_fp8_tensor_parallel_and_set_options():
    options = VllmOptions(max_num_seqs=64, max_model_len=1024, enforce_eager=True, enable_prefix_caching=True)
    kw = engine_kwargs(model_path="org/model", precision="fp8", options=options, tensor_parallel=2, seed=0,
                       dummy_weights=False)
    assert kw["quantization"] == "fp8" and kw["dtype"] == "bfloat16"
    assert kw["distributed_executor_backend"] == "mp" and kw["tensor_parallel_size"] == 2
    assert (kw["max_num_seqs"], kw["max_model_len"], kw["enforce_eager"], kw["enable_prefix_caching"]) == (
        64, 1024, True, True)
    assert "load_format" not in kw and "max_num_batched_tokens" not in kw and "hf_overrides" not in kw


def test_the_engine_captures_cuda_graphs_for_the_group_s_steps_only():
    from actors.backends.vllm.backend import capture_sizes
    from sweeper.plan.expand import TrialGroup, make_plan
    from sweeper.plan.spec import parse_sweep

    # The plan knows each offline group's steps: decode at each batch, and each batch's prefill.
    plan = make_plan(parse_sweep({"name": "cg", "models": "tiny-llama", "backends": "vllm", "precisions": "bf16",
                                  "batch_sizes": [1, 8, 32], "workload": {"input_len": 64, "output_len": 4}}), "cuda")
    (group,) = plan.groups()
    assert group.load_request.step_tokens == (1, 8, 32, 64, 512, 2048)
    trials = VllmOptions(cudagraph_capture_sizes="trials")
    kw = engine_kwargs(model_path="/m", precision="bf16", options=trials, tensor_parallel=1, seed=0,
                       dummy_weights=True, step_tokens=group.load_request.step_tokens)
    # 2048 tokens is above vLLM's largest default size: that prefill runs without a graph either way.
    assert kw["compilation_config"] == {"cudagraph_capture_sizes": [1, 8, 32, 64, 512]}
    # vLLM's own list; the sizes given; nothing to capture without graphs; steps not known in advance.
    assert capture_sizes(VllmOptions(cudagraph_capture_sizes="engine"), (1, 8)) is None
    assert capture_sizes(VllmOptions(cudagraph_capture_sizes=[16, 4, 4]), (1, 8)) == [4, 16]
    assert capture_sizes(VllmOptions(cudagraph_capture_sizes="trials", enforce_eager=True), (1, 8)) is None
    assert capture_sizes(trials, None) is None and capture_sizes(trials, (1024,)) is None
    assert capture_sizes(VllmOptions(), (1, 8)) is None  # the default: vLLM's own list
    natural = make_plan(parse_sweep({"name": "cg", "models": "tiny-llama", "backends": "vllm", "precisions": "bf16",
                                     "batch_sizes": [1, 8], "workload": {"input_len": 64, "output_len": "natural",
                                                                         "max_output_len": 4}}), "cuda")
    trials = tuple(p.trial for p in natural.trials)
    assert TrialGroup(trials[0].load_key, trials).step_tokens is None  # batches shrink as sequences end
    with pytest.raises(ValueError, match="cudagraph_capture_sizes"):
        VllmOptions(cudagraph_capture_sizes=[0])
    # The default leaves trial ids alone (it is no option away from its default).
    assert VllmOptions() == VllmOptions(cudagraph_capture_sizes="engine")
    assert "compilation_config" not in engine_kwargs(model_path="/m", precision="bf16", options=VllmOptions(),
                                                     tensor_parallel=1, seed=0, dummy_weights=True, step_tokens=(1, 8))


def test_the_actor_hands_the_group_s_steps_to_the_backend_s_load(monkeypatch):
    import actors.actor as actor_module
    from actors.actor import TrialRunner
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep

    plan = make_plan(parse_sweep({"name": "cg", "models": "tiny-llama", "backends": "noop", "precisions": "bf16",
                                  "batch_sizes": [2, 4], "workload": {"input_len": 8, "output_len": 2},
                                  "measure": {"idle_s": 0}}), "cpu")
    (group,) = plan.groups()
    specs = []
    real_create = actor_module.create_backend

    def recording(name: str):
        backend = real_create(name)
        real_load = backend.load
        backend.load = lambda spec: specs.append(spec) or real_load(spec)
        return backend

    monkeypatch.setattr(actor_module, "create_backend", recording)
    runner = TrialRunner()
    assert runner.load(group.trials[0], group.load_request).ok
    runner.close()
    assert [s.step_tokens for s in specs] == [(2, 4, 16, 32)]


def test_synthetic_configs_get_their_architecture(tmp_path):
    from actors.models import materialize_synthetic

    for preset, arch in [("tiny-llama", "LlamaForCausalLM"), ("tiny-qwen2", "Qwen2ForCausalLM")]:
        config = json.loads((materialize_synthetic(preset, root=tmp_path) / "config.json").read_text())
        assert architecture_overrides(config) == {"architectures": [arch]}
    assert architecture_overrides({"architectures": ["X"], "model_type": "llama"}) is None


def test_fp8_needs_ada_or_newer():
    assert capability_problem("fp8", [("NVIDIA H200", (9, 0)), ("NVIDIA L40S", (8, 9))]) is None
    why = capability_problem("fp8", [("NVIDIA H200", (9, 0)), ("NVIDIA A100-SXM4-80GB", (8, 0))])
    assert "compute capability >= 8.9" in why and "A100" in why and "8.0" in why
    assert capability_problem("bf16", [("NVIDIA A100-SXM4-80GB", (8, 0))]) is None


# -- result conversion ------------------------------------------------------------------------


@dataclass
class Completion:  # vllm.outputs.CompletionOutput's fields that sweeper reads
    token_ids: list[int]
    index: int = 0
    finish_reason: str = "length"


@dataclass
class Stats:  # vllm.v1.metrics.stats.RequestStateStats
    arrival_time: float = 0.0  # wall clock, frontend
    queued_ts: float = 0.0  # engine core monotonic clock from here on
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0
    num_generation_tokens: int = 0


@dataclass
class Output:  # vllm.outputs.RequestOutput
    request_id: str
    outputs: list[Completion]
    metrics: Stats | None
    prompt_token_ids: list[int] = field(default_factory=list)
    finished: bool = True


def _out(i: int, first: float, last: float, n: int = 4, **stats) -> Output:
    return Output(str(i), [Completion(list(range(n)))], Stats(first_token_ts=first, last_token_ts=last,
                                                              num_generation_tokens=n, **stats))


def test_engine_clock_stamps_become_request_timings_and_phase_marks():
    outputs = [_out(0, 100.20, 100.80), _out(1, 100.25, 100.90)]
    gen, how = generation_from_outputs(outputs, t_start_s=100.0, t_end_s=101.0, output_len=4,
                                       wall_minus_monotonic_s=9e8)
    assert how == {"engine_clock"}
    assert isinstance(gen, Generation) and (gen.t_start_s, gen.t_end_s) == (100.0, 101.0)
    assert [(r.t_start_s, r.t_first_token_s, r.t_end_s, r.output_tokens) for r in gen.requests] == [
        (100.0, 100.20, 100.80, 4), (100.0, 100.25, 100.90, 4)]
    # Prefill lasts until the whole batch has its first token; decode is the rest.
    assert gen.marks == (("prefill", 100.0, 100.25), ("decode", 100.25, 101.0))
    rows = request_records("t", [gen], t0_s=100.0, input_len=8)
    assert rows[0].ttft_s == pytest.approx(0.20) and rows[0].e2e_s == pytest.approx(0.80)
    assert rows[1].tpot_s == pytest.approx((0.90 - 0.25) / 3)  # vLLM's TPOT: (e2e - ttft) / (n - 1)


def test_stamps_on_another_clock_fall_back_to_latencies():
    # Engine stamps far from the call (another clock); arrival is wall clock.
    outputs = [_out(0, 5.00, 5.60, arrival_time=1000.05, first_token_latency=0.15)]
    gen, how = generation_from_outputs(outputs, t_start_s=100.0, t_end_s=101.0, output_len=4,
                                       wall_minus_monotonic_s=900.0)
    assert how == {"latency"}
    (r,) = gen.requests
    assert r.t_first_token_s == pytest.approx(100.20)  # arrival 100.05 on this clock + 0.15
    assert r.t_end_s == pytest.approx(100.80)  # + the engine's first-to-last interval


def test_missing_metrics_and_short_outputs_are_errors():
    no_stats = Output("0", [Completion([1, 2, 3, 4])], None)
    with pytest.raises(VllmMetricsError, match="disable_log_stats=False"):
        generation_from_outputs([no_stats], t_start_s=0, t_end_s=1, output_len=4, wall_minus_monotonic_s=0)
    with pytest.raises(RuntimeError, match="produced 3 tokens, expected 4"):
        generation_from_outputs([_out(0, 0.2, 0.8, n=3)], t_start_s=0, t_end_s=1, output_len=4,
                                wall_minus_monotonic_s=0)
    unstamped = Output("0", [Completion([1, 2, 3, 4])], Stats())
    with pytest.raises(VllmMetricsError, match="no first-token time"):
        generation_from_outputs([unstamped], t_start_s=0, t_end_s=1, output_len=4, wall_minus_monotonic_s=0)


def test_out_of_memory_is_recognised():
    assert VllmBackend.is_out_of_memory(ValueError("No available memory for the cache blocks. Try increasing "
                                                   "`gpu_memory_utilization`"))
    # A model whose one sequence does not fit the KV cache (vLLM 0.26 and 0.34 word it so).
    assert VllmBackend.is_out_of_memory(ValueError(
        "To serve at least one request with the model's max seq len (131072), (16.0 GiB KV cache is needed, which is "
        "larger than the available KV cache memory (9.5 GiB). Based on the available memory, ..."))
    assert not VllmBackend.is_out_of_memory(ValueError("bad prompt"))


# -- without vllm ------------------------------------------------------------------------------


def test_layer_hooks_do_not_apply_to_vllm_trials():
    from actors.layers.profile_pass import profile_layers

    (trial, *_), _ = expand(sweep(backends="vllm", profile={"layers": "block"}))
    assert BACKENDS["vllm"].layer_hooks is False
    columns = profile_layers(VllmBackend(), trial, None, None, headline_s_per_iter=None).columns
    assert columns.layer_profile_status == "not applicable: backend vllm has no layer hooks"


def test_a_worker_without_vllm_refuses_the_backend_clearly():
    with pytest.raises(BackendUnavailable, match="needs the Python module 'vllm', which is not installed"):
        create_backend("vllm")
    from actors.actor import TrialRunner

    (trial, *_), _ = expand(sweep(backends="vllm"))
    result = TrialRunner().load(trial)
    assert not result.ok and result.reason == "load_failed"
    assert "BackendUnavailable: backend vllm needs the Python module 'vllm'" in result.error


@pytest.mark.slow
def test_a_vllm_trial_on_a_worker_without_vllm_fails_and_the_sweep_goes_on(tmp_path):
    """On a (logical) GPU node without vllm: the vllm trial fails with the clear error, the rest
    (the noop backend's, which needs nothing) finish."""
    from sweeper.run.storage import ResultStore

    s = tmp_path / "mixed.yaml"
    s.write_text("name: mixed\nmodels: tiny-llama\nbackends: [vllm, noop]\nprecisions: bf16\n"
                 "batch_sizes: [1, 2]\nworkload: {input_len: 8, output_len: 4}\n"
                 "measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0.2, idle_s: 0}\n")
    from tests.cluster_scenarios import run_scenario

    # "single" plans without a capability probe, as a stale probe would: the vllm
    # trials reach a worker that lacks vllm.
    info = run_scenario("single", s, tmp_path / "out", ROOT)
    assert (info["runnable"], info["ok"], info["failed"]) == (4, 2, 2)
    rows = ResultStore(str(tmp_path / "out")).read_shards("trials").to_pylist()
    by_backend = {(row["backend"], row["batch_size"]): row for row in rows}
    assert {by_backend[("noop", b)]["status"] for b in (1, 2)} == {"ok"}
    for b in (1, 2):
        row = by_backend[("vllm", b)]
        assert row["status"] == "failed" and row["reason"] == "load_failed"
        assert "needs the Python module 'vllm', which is not installed on this worker" in row["error"]


def test_engine_architecture_feeds_the_roofline():
    from types import SimpleNamespace

    from transformers import AutoConfig

    from actors.backends.vllm.backend import _architecture
    from sweeper.core.presets import PRESETS

    config = AutoConfig.for_model(**PRESETS["llama-3.2-1b"].config_dict())
    arch = _architecture(SimpleNamespace(hf_config=config))
    assert arch["num_hidden_layers"] == 16 and arch["hidden_size"] == 2048
    assert _architecture(SimpleNamespace()) is None  # no hf_config: null roofline, no failure


def test_a_shape_longer_than_max_model_len_is_skipped_at_plan_time():
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep

    sweep = parse_sweep({"name": "m", "models": "llama-3.2-1b", "backends": "vllm", "precisions": "bf16",
                         "batch_sizes": 1, "workload": {"input_len": [128, 1000], "output_len": 128},
                         "backend_options": {"vllm": {"max_model_len": 512}}})
    reasons = {p.trial.input_len: p.skip_reason for p in make_plan(sweep, "cuda").trials}
    assert "exceeds backend_options.vllm.max_model_len = 512" in reasons[1000]
    assert "max_model_len" not in (reasons[128] or "")  # 256 tokens fit (vllm itself may be missing here)


def test_the_worker_extension_answers_by_name_without_vllm():
    """The method vLLM runs in each worker, on a stand-in worker (vLLM itself cannot run on a CPU)."""
    import importlib
    from types import SimpleNamespace

    module_name, _, class_name = engine_kwargs(
        model_path="/m", precision="bf16", options=VllmOptions(), tensor_parallel=1, seed=0,
        dummy_weights=True)["worker_extension_cls"].rpartition(".")
    extension = getattr(importlib.import_module(module_name), class_name)
    worker = type("Worker", (extension,), {})()
    worker.model_runner = SimpleNamespace(model_memory_usage=2_471_000_000.0)
    assert worker.sweeper_weight_memory_bytes() == 2_471_000_000


def test_the_registry_finds_the_backend_and_the_package_does_not_stand_in_for_vllm():
    """``actors.backends.vllm`` is a package of sweeper's: the registry names its class, and
    ``vllm`` (what ``requires`` checks, what the modules import) is still vLLM's own, or absent."""
    import importlib
    import importlib.util

    module_name, _, class_name = BACKENDS["vllm"].impl.partition(":")
    assert getattr(importlib.import_module(module_name), class_name) is VllmBackend
    spec = importlib.util.find_spec("vllm")
    assert spec is None or "actors" not in str(spec.origin)


def test_engines_on_a_node_share_one_compile_cache_under_sweepers(monkeypatch, tmp_path):
    from actors.backends.vllm.backend import share_compile_cache

    for name in ("VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):  # absent now, and again after the test
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    assert share_compile_cache() == str(tmp_path / "cache" / "vllm")
    import os

    assert os.environ["VLLM_CACHE_ROOT"] == str(tmp_path / "cache" / "vllm")  # the engine's processes inherit it
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "cache" / "triton")  # its kernels too
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/elsewhere")  # the user's own choice stands
    monkeypatch.setenv("TRITON_CACHE_DIR", "/kernels")
    assert share_compile_cache() == "/elsewhere" and os.environ["TRITON_CACHE_DIR"] == "/kernels"


def test_the_engine_core_runs_where_the_group_asks_and_the_next_group_starts_clean(monkeypatch):
    """engine_core: actor sets VLLM_ENABLE_V1_MULTIPROCESSING=0 while the offline engine is built
    (vLLM reads it then), process sets 1; either way the variable is as it was afterwards, so an
    actor handed on to another group does not carry the choice."""
    import os

    from actors.backends.vllm.backend import engine_core_in

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    with engine_core_in("actor"):
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the user's own, outside any engine start
    with engine_core_in("process"):
        assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


def test_an_engine_core_in_the_actor_is_offline_only():
    from sweeper.core.backends import BACKENDS, VllmOptions

    assert BACKENDS["vllm"].unsupported_serving(VllmOptions()) is None
    reason = BACKENDS["vllm"].unsupported_serving(VllmOptions(engine_core="actor"))
    assert reason is not None and reason.startswith("engine_core: actor") and "AsyncLLM" in reason


def test_a_vllm_actor_is_handed_on_unless_its_engine_core_stays_in_it():
    """An engine whose core and workers are processes of their own leaves the actor's process
    holding nothing on the GPU once closed: the actor may load the next group. An engine core
    in the actor's process leaves a CUDA context there: a fresh actor for the next group."""
    from sweeper.core.backends import TransformersOptions

    vllm = BACKENDS["vllm"]
    assert vllm.reuses_actor_with(VllmOptions()) and vllm.reuses_actor_with(VllmOptions(engine_core="process"))
    assert not vllm.reuses_actor_with(VllmOptions(engine_core="actor"))
    assert BACKENDS["transformers"].reuses_actor_with(TransformersOptions())
    assert not BACKENDS["server"].reuses_actor_with(None)


def test_closing_waits_until_no_engine_process_holds_the_gpu_and_kills_those_that_keep_it():
    """close() returns only once no process it started holds the engine's GPUs (the next
    engine on them would otherwise find their memory taken): a holder that ends by itself is
    waited for, one that ignores the shutdown is killed at the bound, and a child that never
    held the GPU (as multiprocessing's resource tracker, which lives as long as its parent) is
    left alone. NVML's list of the GPU's processes is the one part given here: these are real
    child processes, and which of them "hold the GPU" is what the test says."""
    import subprocess
    import sys

    import psutil

    from actors.backends.vllm.backend import release_gpus

    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    ends = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    stays = subprocess.Popen(sleeper)
    bystander = subprocess.Popen(sleeper)
    try:
        holders = {ends.pid, stays.pid, 999_999_999}  # and a process of another namespace

        def alive(pid: int) -> bool:  # an exited process holds nothing, reaped or not
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        def on_gpu() -> set[int]:
            return {pid for pid in holders if alive(pid)} | {999_999_999}

        assert release_gpus(on_gpu, timeout_s=2.0, poll_s=0.02) == [stays.pid]
        assert ends.wait(timeout=5) == 0  # ended by itself, before the bound
        assert not psutil.pid_exists(stays.pid)  # it would have slept for 600 s: killed
        assert bystander.poll() is None  # never held the GPU: still running
        assert release_gpus(on_gpu, timeout_s=2.0) == []  # nothing of ours holds it now
    finally:
        bystander.kill()
        bystander.wait()


# -- speculative decoding ------------------------------------------------------------------

# What vLLM's /metrics says with speculation on, two engines (data parallel): its counters carry
# ``_total`` and a ``_created`` sample each (prometheus_client's exposition), one sample per engine.
VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 60.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 400.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 240.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 90.0
# HELP vllm:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position.
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 90.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 5000.0
"""


def test_speculation_counts_are_summed_over_engines_and_a_window_is_a_difference():
    from actors.backends.speculation import SpeculationCounts, window_speculation
    from sweeper.core.results import Speculation

    after = SpeculationCounts.from_prometheus_text(VLLM_METRICS)
    assert after == SpeculationCounts(drafts=160.0, draft_tokens=640.0, accepted_tokens=240.0)
    before = SpeculationCounts(drafts=60.0, draft_tokens=240.0, accepted_tokens=40.0)
    assert window_speculation(before, after) == Speculation(
        spec_drafts=100.0, spec_draft_tokens=400.0, spec_accepted_tokens=200.0, spec_acceptance_rate=0.5,
        spec_tokens_per_step=3.0)
    # Speculation off: the engine counts none of them, and the row gets no such columns.
    assert SpeculationCounts.from_prometheus_text("vllm:generation_tokens_total 5.0\n") is None
    assert window_speculation(None, after) is None and window_speculation(before, None) is None
    # No draft in the window: the rates are unknown, not zero.
    idle = window_speculation(before, before)
    assert idle is not None and idle.spec_acceptance_rate is None and idle.spec_tokens_per_step is None


def test_speculation_counts_from_vllms_in_process_snapshot():
    """``vllm.v1.metrics.reader.get_metrics_snapshot()`` gives objects with a name and, for
    counters and gauges, a value (histograms and vectors have none), without ``_total``."""
    from types import SimpleNamespace as Metric

    from actors.backends.speculation import SpeculationCounts

    snapshot = [Metric(name="vllm:spec_decode_num_drafts", value=10),
                Metric(name="vllm:spec_decode_num_draft_tokens", value=40),
                Metric(name="vllm:spec_decode_num_accepted_tokens", value=25),
                Metric(name="vllm:spec_decode_num_accepted_tokens_per_pos", values=[10, 8, 5, 2]),
                Metric(name="vllm:time_to_first_token_seconds", buckets={})]
    assert SpeculationCounts.from_metrics(snapshot) == SpeculationCounts(10.0, 40.0, 25.0)


def test_the_speculative_options_reach_the_engine_and_the_plan_warns_on_random_weights():
    options = VllmOptions(speculative={"num_speculative_tokens": 4})
    kwargs = engine_kwargs(model_path="/m", precision="bf16", options=options, tensor_parallel=1, seed=0,
                           dummy_weights=True)
    assert kwargs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}
    assert "speculative_config" not in engine_kwargs(model_path="/m", precision="bf16", options=VllmOptions(),
                                                     tensor_parallel=1, seed=0, dummy_weights=True)
    spec = {"vllm": {"speculative": {"num_speculative_tokens": 4}}}
    synthetic = make_plan(sweep(backend_options=spec), "cuda")
    assert [w for w in synthetic.warnings if "speculative decoding" in w] == [
        "tiny-llama vllm: speculative decoding on a synthetic (random-weight) model: its acceptance rate says "
        "nothing of real text; measure it on a real model (e.g. the bundled smollm2-135m)"]
    real = make_plan(sweep(models=["smollm2-135m"], backend_options=spec), "cuda")
    assert not [w for w in real.warnings if "speculative decoding" in w]
    assert not [w for w in make_plan(sweep(), "cuda").warnings if "speculative decoding" in w]


def test_a_launched_server_takes_structured_flags_as_json_and_its_speculation_is_seen():
    from sweeper.core.servers import ServerOptions, engine_args

    args = {"speculative-config": {"method": "ngram", "num_speculative_tokens": 4}, "max-num-seqs": 64}
    assert engine_args(args) == ["--speculative-config", '{"method":"ngram","num_speculative_tokens":4}',
                                 "--max-num-seqs", "64"]
    assert ServerOptions(launch="vllm", args=args).speculates()
    assert not ServerOptions(launch="vllm", args={"max-num-seqs": 64}).speculates()


def test_a_servers_speculation_counters_are_read_from_its_metrics_page():
    """ServerBackend reads /metrics beside the API's /v1 (a real HTTP server here); a server
    with no such page, or none of the counters, gives no reading rather than an error."""
    import http.server
    import threading

    from actors.backends.server.backend import ServerBackend
    from actors.backends.speculation import SpeculationCounts

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the handler's API
            body = VLLM_METRICS.encode() if self.path == "/metrics" else b"not here"
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        backend = ServerBackend()
        backend.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        assert backend.speculation_counts() == SpeculationCounts(160.0, 640.0, 240.0)
        backend.base_url = f"http://127.0.0.1:{server.server_address[1]}/other/v1"
        assert backend.speculation_counts() is None  # 404
    finally:
        server.shutdown()
        server.server_close()


def test_the_plan_names_each_engine_s_versions_and_warns_outside_the_tested_range():
    tested = Capabilities((_node("head", 0, vllm=None), _node("gpu", 1, vllm="0.26.0")), "cluster, 2 nodes probed")
    plan = make_plan(sweep(), "cuda", capabilities=tested)
    assert "vllm on the nodes that run its trials: 0.26.0 (tested: ==0.26.*)" in plan.notes
    assert not any("outside the versions" in w for w in plan.warnings)
    newer = Capabilities((_node("a", 1, vllm="0.26.0"), _node("b", 1, vllm="0.34.0")), "cluster, 2 nodes probed")
    plan = make_plan(sweep(), "cuda", capabilities=newer)
    assert plan.skipped == []  # it runs
    [warning] = [w for w in plan.warnings if "outside the versions" in w]
    assert warning.startswith("vllm 0.34.0 is outside the versions sweeper is tested with (==0.26.*)")
    # An engine no runnable trial needs is not mentioned.
    only_transformers = make_plan(sweep(backends="transformers"), "cuda", capabilities=newer)
    assert not any(n.startswith("vllm on the nodes") for n in only_transformers.notes)
