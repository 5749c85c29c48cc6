"""Quantized precisions on CPU: seeded weights on disk, bitsandbytes through the real backend, clear errors."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
import torch
from safetensors import safe_open

from actors.backends import create_backend
from actors.backends.base import ModelSpec
from actors.errors import PrecisionUnavailable, QuantizationShapeError
from actors.models import (
    INDEX_FILE,
    materialize_synthetic,
    materialize_weights,
    parameter_layout,
    weights_dir,
)
from sweeper.core.backends import BACKENDS
from sweeper.core.presets import PRESETS

OPTIONS = BACKENDS["transformers"].default_options()


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _read_checkpoint(path) -> dict[str, torch.Tensor]:
    index = json.loads((path / INDEX_FILE).read_text())
    out = {}
    for name, fname in index["weight_map"].items():
        with safe_open(str(path / fname), "pt") as f:
            out[name] = f.get_tensor(name)
    return out


def _meta_layout(preset: str) -> dict[str, tuple[int, ...]]:
    from transformers import AutoConfig

    return dict(parameter_layout(AutoConfig.for_model(**PRESETS[preset].config_dict())))


# -- weights on disk -----------------------------------------------------------------

@pytest.mark.slow
def test_weights_match_the_meta_model_and_hf_init(cache):
    path = materialize_weights("tiny-qwen2", seed=0, max_shard_bytes=300_000)
    index = json.loads((path / INDEX_FILE).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    tensors = _read_checkpoint(path)
    layout = _meta_layout("tiny-qwen2")
    assert {k: tuple(v.shape) for k, v in tensors.items()} == layout
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    assert all(t.dtype == torch.bfloat16 for t in tensors.values())
    assert json.loads((path / "config.json").read_text())["dtype"] == "bfloat16"
    # tied: the checkpoint holds the embedding once, as a Hugging Face one does
    assert "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors
    up = tensors["model.layers.0.mlp.up_proj.weight"].float()
    assert abs(float(up.std()) - 0.02) < 0.002 and abs(float(up.mean())) < 0.002
    assert (tensors["model.norm.weight"] == 1).all()
    assert (tensors["model.layers.0.self_attn.q_proj.bias"] == 0).all()
    assert not any(p.name.startswith(".") and p.is_dir() for p in path.parent.iterdir())


def test_untied_model_has_its_own_output_projection():
    tensors = _read_checkpoint(materialize_weights("tiny-llama", seed=0))
    assert tensors.keys() == _meta_layout("tiny-llama").keys()
    assert not torch.equal(tensors["lm_head.weight"], tensors["model.embed_tokens.weight"])


def test_weights_are_determined_by_the_seed(tmp_path):
    a = _read_checkpoint(materialize_weights("tiny-llama", seed=3, root=tmp_path / "a"))
    b = _read_checkpoint(materialize_weights("tiny-llama", seed=3, root=tmp_path / "b", max_shard_bytes=100_000))
    c = _read_checkpoint(materialize_weights("tiny-llama", seed=4, root=tmp_path / "c"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # sharding does not change the draw
    assert not torch.equal(a["model.layers.0.mlp.up_proj.weight"], c["model.layers.0.mlp.up_proj.weight"])


def test_materialization_is_reused_and_safe_under_a_race(cache):
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(materialize_weights("tiny-mistral", seed=1)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and results[0] == weights_dir("tiny-mistral", 1)
    stamp = {p.name: p.stat().st_mtime_ns for p in results[0].iterdir()}
    assert materialize_weights("tiny-mistral", seed=1) == results[0]
    assert {p.name: p.stat().st_mtime_ns for p in results[0].iterdir()} == stamp
    parent = results[0].parent
    assert [p.name for p in parent.iterdir() if p.is_dir()] == [results[0].name]  # no half-built copies left


def test_dtype_precisions_keep_the_config_only_checkpoint(cache):
    b = create_backend("transformers")
    b.load(ModelSpec("synthetic", "tiny-llama", "bf16", OPTIONS))
    b.close()
    dirs = [p.name for p in (cache / "synthetic").iterdir() if p.is_dir()]
    assert dirs == [materialize_synthetic("tiny-llama").name]  # no weights written


# -- bitsandbytes on CPU -------------------------------------------------------------

@pytest.mark.slow
def test_int8_loads_int8_layers_and_generates_exact_lengths():
    import bitsandbytes as bnb

    b = create_backend("transformers")
    info = b.load(ModelSpec("synthetic", "tiny-llama", "int8", OPTIONS, seed=0))
    layers = [m for m in b.model.modules() if isinstance(m, bnb.nn.Linear8bitLt)]
    assert len(layers) == 2 * 7  # every linear of both blocks; lm_head stays in fp16
    assert layers[0].weight.dtype == torch.int8
    gen = b.generate(np.random.default_rng(0).integers(8, 2048, size=(2, 8)), output_len=6)
    assert gen.output_tokens == 12 and all(r.output_tokens == 6 for r in gen.requests)
    # the footprint counts the per-row scales that get_memory_footprint misses
    scales = sum(m.out_features * 4 for m in layers)
    assert info.weight_memory_bytes == b.model.get_memory_footprint() + scales
    b.close()

    ref = create_backend("transformers")
    bf16 = ref.load(ModelSpec("synthetic", "tiny-llama", "bf16", OPTIONS, seed=0, weights_on_disk=True))
    assert info.weight_memory_bytes < bf16.weight_memory_bytes
    ref.close()


@pytest.mark.parametrize("precision, quant_type", [("nf4", "nf4"), ("fp4", "fp4")])
def test_4bit_loads_4bit_layers_and_generates(precision, quant_type):
    import bitsandbytes as bnb

    b = create_backend("transformers")
    info = b.load(ModelSpec("synthetic", "tiny-llama", precision, OPTIONS, seed=0))
    layers = [m for m in b.model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 14 and layers[0].weight.quant_type == quant_type
    assert layers[0].compute_dtype == torch.bfloat16
    gen = b.generate(np.random.default_rng(0).integers(8, 2048, size=(3, 8)), output_len=4)
    assert gen.output_tokens == 12
    # 4-bit payload plus absmax: more than get_memory_footprint, far less than bf16
    assert info.weight_memory_bytes > b.model.get_memory_footprint()
    b.close()


def test_double_quantization_option_reaches_bitsandbytes():
    b = create_backend("transformers")
    b.load(ModelSpec("synthetic", "tiny-llama", "nf4", OPTIONS.model_copy(update={"bnb_double_quant": True})))
    assert b.model.model.layers[0].mlp.up_proj.weight.compress_statistics is True
    assert b.generate(np.full((1, 4), 9), output_len=3).output_tokens == 3
    b.close()


def test_4bit_shape_the_cpu_kernel_cannot_run_is_a_clear_error(tmp_path):
    from bitsandbytes.functional import has_avx512bf16

    if not has_avx512bf16():
        pytest.skip("bitsandbytes repacks 4-bit weights for its block kernel only on AVX512-BF16 CPUs")
    from transformers import AutoConfig, AutoModelForCausalLM

    # 144 is even and a multiple of 16, not of the CPU kernel's block of 32 output rows.
    cfg = {**PRESETS["tiny-llama"].config_dict(), "intermediate_size": 144}
    odd = tmp_path / "odd"
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg)).save_pretrained(odd)
    b = create_backend("transformers")
    with pytest.raises(QuantizationShapeError) as err:
        b.load(ModelSpec("path", str(odd), "nf4", OPTIONS))
    text = str(err.value)
    assert "model.layers.0.mlp.gate_proj" in text and "out_features 144" in text
    assert "block_n 32" in text and "N must be divisible by block_n" in text


def test_missing_library_fails_the_trial_before_writing_weights(monkeypatch, cache):
    import actors.errors
    from actors.actor import TrialRunner
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    real = actors.errors.find_spec
    monkeypatch.setattr(actors.errors, "find_spec", lambda name: None if name == "bitsandbytes" else real(name))
    b = create_backend("transformers")
    with pytest.raises(PrecisionUnavailable, match=r"^precision int8 needs bitsandbytes on this worker: "
                                                   r"pip install bitsandbytes$"):
        b.load(ModelSpec("synthetic", "tiny-llama", "int8", OPTIONS))
    assert not (cache / "synthetic").exists()

    trials, _ = expand(parse_sweep({
        "name": "q", "models": "tiny-llama", "precisions": "nf4", "batch_sizes": 1,
        "workload": {"input_len": 4, "output_len": 2}}))
    result = TrialRunner().load(trials[0])
    assert not result.ok and result.reason == "load_failed"
    assert result.error.startswith("PrecisionUnavailable: precision nf4 needs bitsandbytes on this worker")
