"""Grid expansion, exclusions, trial identity, compatibility and grouping."""

from __future__ import annotations

import pytest

from sweeper.core.errors import SweepFileError
from sweeper.plan.expand import expand, make_plan
from sweeper.plan.spec import parse_sweep

BASE = {
    "name": "s", "models": ["tiny-llama", "tiny-qwen2"], "precisions": ["fp32", "bf16", "fp16"],
    "batch_sizes": [1, 4], "workload": {"input_len": [8, 16], "output_len": 4}, "repeats": 2,
}


def sweep(**patch):
    return parse_sweep({**BASE, **patch})


def test_full_grid_is_the_cartesian_product():
    trials, excluded = expand(sweep())
    assert excluded == 0
    assert len(trials) == 2 * 3 * 2 * 2 * 1 * 2
    assert len({t.trial_id for t in trials}) == len(trials)
    combos = {(t.model, t.precision, t.batch_size, t.input_len, t.repeat) for t in trials}
    assert ("tiny-qwen2", "fp16", 4, 16, 1) in combos


def test_exclusions_match_partially_and_by_list():
    trials, excluded = expand(sweep(exclude=[
        {"model": "tiny-qwen2", "precision": "fp16"},       # 2*2*2 = 8
        {"batch_size": 4, "input_len": [8, 16], "model": "tiny-llama"},  # 3*2*2 = 12
    ]))
    assert excluded == 8 + 12
    assert len(trials) == 48 - 20
    assert not any(t.model == "tiny-qwen2" and t.precision == "fp16" for t in trials)
    assert not any(t.model == "tiny-llama" and t.batch_size == 4 for t in trials)


def test_trial_id_is_a_stable_content_hash():
    a, _ = expand(sweep())
    b, _ = expand(sweep(name="renamed"))
    assert [t.trial_id for t in a] == [t.trial_id for t in b]  # the sweep's name is not identity
    c, _ = expand(sweep(batch_sizes=[1, 4, 8]))
    ids_a, ids_c = {t.trial_id for t in a}, {t.trial_id for t in c}
    assert ids_a < ids_c and len(ids_c - ids_a) == 24  # adding an axis value adds only new trials
    d, _ = expand(sweep(measure={"min_iters": 9}))
    assert not ({t.trial_id for t in d} & ids_a)  # measurement settings are identity
    assert len(a[0].trial_id) == 16 and int(a[0].trial_id, 16) >= 0


def test_known_trial_id_does_not_drift():
    # If this changes, every user's resume breaks: bump METHOD_VERSION on purpose instead.
    t, _ = expand(parse_sweep({"name": "x", "models": "tiny-llama", "precisions": "fp32",
                               "batch_sizes": 1, "workload": {"input_len": 8, "output_len": 4}}))
    assert t[0].trial_id == KNOWN_ID


KNOWN_ID = "2d75e3c1929734bf"


def test_compatibility_decided_at_plan_time():
    cpu = make_plan(sweep(), "cpu")
    skipped = cpu.skipped
    assert len(skipped) == 16 and all(p.trial.precision == "fp16" for p in skipped)
    assert "fp16 on cpu" in skipped[0].skip_reason
    gpu = make_plan(sweep(), "cuda")
    assert not gpu.skipped


def test_groups_share_a_load_key_and_run_small_batches_first():
    p = make_plan(sweep(batch_sizes=[4, 1]), "cuda")
    groups = p.groups()
    assert len(groups) == 2 * 3  # model x precision
    for g in groups:
        assert len({t.load_key for t in g.trials}) == 1
        sizes = [t.batch_size for t in g.trials]
        assert sizes == sorted(sizes)
    assert sum(len(g.trials) for g in groups) == len(p.runnable)


def test_wide_groups_and_engine_starts_go_first_then_table_order():
    # The table lists the quick groups first; an engine start (vLLM) and a two-GPU group
    # should still be placed before them, wider first.
    p = make_plan(parse_sweep({**BASE, "models": ["tiny-llama", "tiny-qwen2"], "precisions": "bf16",
                               "backends": ["transformers", "vllm", "noop"], "batch_sizes": 1, "repeats": 1,
                               "tensor_parallel": [1, 2],
                               "exclude": [{"backend": "transformers", "tensor_parallel": 2},
                                           {"backend": "vllm", "tensor_parallel": 2}]}), "cuda")
    order = [(g.trials[0].model, g.trials[0].backend, g.num_gpus) for g in p.groups()]
    assert order == [
        ("tiny-llama", "noop", 2), ("tiny-qwen2", "noop", 2),             # widest
        ("tiny-llama", "vllm", 1), ("tiny-qwen2", "vllm", 1),             # engine starts
        ("tiny-llama", "transformers", 1), ("tiny-llama", "noop", 1),     # the rest, in table order
        ("tiny-qwen2", "transformers", 1), ("tiny-qwen2", "noop", 1),
    ], order


def test_unresolvable_models_name_the_entry(tmp_path):
    with pytest.raises(SweepFileError) as info:
        expand(sweep(models=["tiny-llama", "no such thing!"]), sweep_path="f.yaml")
    assert info.value.field == "models[1]"
    with pytest.raises(SweepFileError, match="neither cached locally nor reachable"):
        expand(sweep(models=["nobody-xyz/no-such-model-123"]), sweep_path="f.yaml")
    with pytest.raises(SweepFileError, match="no config.json"):
        expand(sweep(models=[str(tmp_path)]), sweep_path="f.yaml")
    with pytest.raises(SweepFileError, match="unknown preset"):
        expand(sweep(models=["synthetic:llama-99b"]), sweep_path="f.yaml")


def test_local_checkpoint_directory_resolves(tiny_gpt2_dir):
    trials, _ = expand(sweep(models=[str(tiny_gpt2_dir)], precisions="fp32"))
    assert trials[0].model_source == "path"
    assert trials[0].model_location == str(tiny_gpt2_dir.resolve())


def test_option_variants_and_tensor_parallel_are_axes():
    sweep = parse_sweep({**BASE, "models": "tiny-llama", "precisions": "bf16", "batch_sizes": 1,
                         "repeats": 1, "workload": {"input_len": 8, "output_len": 4},
                         "tensor_parallel": [1, 2],
                         "backend_options": {"transformers": [{}, {"compile": True}]}})
    trials, _ = expand(sweep)
    assert len(trials) == 4
    assert len({t.load_key for t in trials}) == 4
    assert {t.num_gpus for t in trials} == {1, 2}
    compiled = [t for t in trials if getattr(t.backend_options, "compile", False)]
    assert len(compiled) == 2 and all("compile=True" in t.label() for t in compiled)
    plan = make_plan(sweep, "cuda")
    # transformers shards nothing: tp=2 is skipped at plan time, with the reason
    for p in plan.trials:
        if p.trial.tensor_parallel == 2:
            assert "tensor_parallel <= 1" in p.skip_reason
        else:
            assert p.runnable


def test_default_options_and_tp1_leave_the_id_alone():
    base = {**BASE, "models": "tiny-llama", "precisions": "bf16", "batch_sizes": 1}
    plain = expand(parse_sweep(base))[0][0]
    spelled_out = expand(parse_sweep({
        **base, "tensor_parallel": 1,
        "backend_options": {"transformers": {"compile": False, "attn_implementation": "sdpa"}}}))[0][0]
    assert plain.trial_id == spelled_out.trial_id
    changed = expand(parse_sweep({**base, "backend_options": {"transformers": {"compile": True}}}))[0][0]
    assert changed.trial_id != plain.trial_id


def test_library_too_old_for_a_device_is_a_plan_time_skip():
    from sweeper.core.precisions import PRECISIONS

    int8 = PRECISIONS["int8"]
    assert "bitsandbytes>=0.46" in int8.unsupported_reason("cpu", "0.45.5")
    assert int8.unsupported_reason("cpu", "0.50.2") is None
    assert int8.unsupported_reason("cuda", "0.45.5") is None  # the floor is CPU-only
    assert int8.unsupported_reason("cpu", None) is None  # unknown: the worker decides
    assert "FP8 tensor cores" in PRECISIONS["fp8"].unsupported_reason("cpu")


def test_a_trial_wider_than_every_node_is_the_sweep_files_error():
    from sweeper.plan.capabilities import Capabilities, NodeCapabilities, local_capabilities

    sweep = parse_sweep({**BASE, "models": "tiny-llama", "backends": "noop", "precisions": "bf16",
                         "batch_sizes": 1, "repeats": 1, "tensor_parallel": [1, 2, 4],
                         "workload": {"input_len": 8, "output_len": 4}})
    with pytest.raises(SweepFileError) as info:
        make_plan(sweep, "cuda", capabilities=local_capabilities(gpus=2))
    assert str(info.value) == "<sweep>: tensor_parallel: 4 GPUs per trial on one node, but this machine has 2"
    # A cluster: judged by its widest node (a GPU can't lend itself to another node's group).
    nodes = tuple(NodeCapabilities(f"n{i}", f"h{i}", gpus, {}) for i, gpus in enumerate((2, 2)))
    with pytest.raises(SweepFileError, match="the widest node of the cluster .* has 2"):
        make_plan(sweep, "cuda", capabilities=Capabilities(nodes, "cluster (2 nodes probed)"))
    # A cluster with no GPU node yet autoscales from zero: its trials wait for their nodes.
    idle = Capabilities((NodeCapabilities("h", "head", 0, {}),), "cluster (1 node probed)")
    assert all(p.runnable for p in make_plan(sweep, "cuda", capabilities=idle).trials)


def test_every_model_that_resolves_to_nothing_is_named_at_once(tmp_path):
    with pytest.raises(SweepFileError) as info:
        expand(sweep(models=["tiny-llama", "synthetic:nope", str(tmp_path / "missing"), "not a model"]))
    assert [field for field, _ in info.value.problems] == ["models[1]", "models[2]", "models[3]"]
    assert len(str(info.value).splitlines()) == 3


@pytest.mark.parametrize(("text", "message"), [("{not json", "is not valid JSON"),
                                               ('{"hidden_size": 8}', 'has no "model_type"')])
def test_a_malformed_checkpoint_config_fails_at_plan_time(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(SweepFileError, match=message):
        expand(sweep(models=[str(tmp_path)]))


def test_a_shape_longer_than_the_models_positions_is_skipped_at_plan_time(tiny_gpt2_dir):
    # presets read their config (tiny-llama: 2048), local checkpoints their config.json (GPT-2: 64)
    plan = make_plan(sweep(models=["tiny-llama", str(tiny_gpt2_dir)], precisions="fp32", batch_sizes=1,
                           workload={"input_len": [16, 2040, 2041], "output_len": 8}), "cpu")
    skipped = {(p.trial.model, p.trial.input_len): p.skip_reason for p in plan.trials if not p.runnable}
    gpt2 = str(tiny_gpt2_dir)
    assert set(skipped) == {("tiny-llama", 2041), (gpt2, 2040), (gpt2, 2041)}  # 2040 + 8 fits 2048 exactly
    assert skipped[("tiny-llama", 2041)] == ("input_len + output_len = 2049 exceeds the model's 2048 positions "
                                             "(max_position_embeddings in its config)")
    assert "exceeds the model's 64 positions" in skipped[(gpt2, 2040)]


def test_a_fidelity_reference_its_backend_cannot_run_is_the_sweep_files_error():
    fidelity = {"name": "f", "models": "llama-3.2-1b", "backends": ["transformers", "vllm"], "precisions": ["fp32", "bf16"],
                "exclude": [{"backend": "vllm", "precision": "fp32"}], "batch_sizes": 1,
                "workload": {"input_len": 8, "output_len": 4}}
    with pytest.raises(SweepFileError, match="fidelity.reference") as info:
        make_plan(parse_sweep({**fidelity, "fidelity": {"reference": "fp32"}}), "cuda")
    assert "the vllm trials' reference cannot run: backend vllm does not support precision fp32" in str(info.value)
    assert "reference: {backend: transformers, precision: fp32}" in str(info.value)
    # Named on a backend that runs it, the same reference plans; on a CPU the vLLM trials are
    # skipped, so their reference is no one's problem.
    ok = make_plan(parse_sweep({**fidelity, "fidelity": {"reference": {"backend": "transformers", "precision": "fp32"}}}),
                   "cuda")
    assert len(ok.runnable) == 3
    assert make_plan(parse_sweep({**fidelity, "fidelity": {"reference": "fp32"}}), "cpu").runnable
