"""Analytic FLOPs/bytes against hand-computed values, the GPU table's matching, MFU/MBU and the null paths.

Expected numbers are written out from the published shapes of each checkpoint
(hidden size, layers, heads, ...), not computed by the code under test.
"""

from __future__ import annotations

import pytest

from sweeper.core.gpus import GPUS, held_gpu_names, match_gpu
from sweeper.core.precisions import PRECISIONS
from sweeper.core.presets import PRESETS
from sweeper.core.results import Roofline
from sweeper.core.roofline import (
    Architecture,
    UnsupportedArchitectureError,
    kv_bytes_per_token,
    request_flops,
    roofline,
)

# meta-llama/Llama-3.2-1B: hidden 2048, MLP 8192, 16 layers, 32 heads of 64, 8 KV heads, vocab 128256, tied.
L1B_BLOCKS = 16 * (2048 * 2048 + 2 * 2048 * 512 + 2048 * 2048 + 3 * 2048 * 8192)
L1B_VD = 128256 * 2048
# meta-llama/Llama-3.1-8B: hidden 4096, MLP 14336, 32 layers, 32 heads of 128, 8 KV heads, vocab 128256, untied.
L8B_BLOCKS = 32 * (4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336)
L8B_VD = 128256 * 4096


def cfg(name: str, **override) -> dict:
    return {**PRESETS[name].config_dict(), **override}


def cols(config: dict, precision: str = "bf16", **kw) -> dict:
    args = dict(batch_size=1, input_len=128, output_len=64, gpu_names=["NVIDIA H200"],
                throughput_tok_s=100.0, tpot_s=0.01)
    return dict(roofline(config, PRECISIONS[precision], **{**args, **kw}).items())


# -- parameter counts -----------------------------------------------------------------------

def test_parameter_counts_match_the_published_checkpoints():
    a1 = Architecture.from_config(cfg("llama-3.2-1b"))
    assert a1.block_matmul_params == L1B_BLOCKS == 973_078_528
    assert a1.lm_head_params == L1B_VD
    # the model cards' totals: the tied lm_head is the embedding, stored once
    assert a1.total_params == 1_235_814_400 == L1B_BLOCKS + L1B_VD + 33 * 2048
    a8 = Architecture.from_config(cfg("llama-3.1-8b"))
    assert a8.block_matmul_params == L8B_BLOCKS
    assert a8.total_params == 8_030_261_248 == L8B_BLOCKS + 2 * L8B_VD + 65 * 4096
    # Qwen2 carries q/k/v biases; Mistral's head_dim is explicit
    assert Architecture.from_config(cfg("qwen2.5-7b")).total_params == 7_615_616_512
    assert Architecture.from_config(cfg("qwen2.5-0.5b")).total_params == 494_032_768
    assert Architecture.from_config(cfg("mistral-7b")).total_params == 7_248_023_552


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_counts_match_the_real_transformers_modules(name):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**PRESETS[name].config_dict())
    with torch.device("meta"):  # shapes only: no memory for the 8B presets
        model = AutoModelForCausalLM.from_config(config)
    real = sum(p.numel() for p in model.parameters())  # a tied weight is listed once
    assert Architecture.from_config(config.to_dict()).total_params == real


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads():
    a = Architecture.from_config(cfg("qwen2.5-0.5b"))  # no head_dim in its config
    assert a.head_dim == 896 // 14 == 64
    mha = Architecture.from_config({k: v for k, v in cfg("llama-3.1-8b").items() if k != "num_key_value_heads"})
    assert mha.num_kv_heads == 32


# -- FLOPs ------------------------------------------------------------------------------------

def test_flops_per_token_by_hand_for_two_presets():
    # P=128 prompt, n=64 generated: 191 positions through the blocks, 64 lm_head rows,
    # causal attention pairs 1 + 2 + ... + 191, 4 x heads x head_dim FLOPs per pair per layer.
    pairs = 191 * 192 // 2
    f1 = 2 * L1B_BLOCKS * 191 + 2 * L1B_VD * 64 + 16 * 4 * 32 * 64 * pairs
    f8 = 2 * L8B_BLOCKS * 191 + 2 * L8B_VD * 64 + 32 * 4 * 32 * 128 * pairs
    assert cols(cfg("llama-3.2-1b"))["flops_per_token"] == f1 / 64
    assert cols(cfg("llama-3.1-8b"))["flops_per_token"] == f8 / 64
    # the familiar "2 x parameters" for a short context: within 10% (attention is small at 191)
    assert f8 / 64 == pytest.approx(2 * (L8B_BLOCKS + L8B_VD) * 191 / 64, rel=0.1)


def test_flops_do_not_depend_on_precision_or_tying():
    c = cfg("llama-3.1-8b")
    base = cols(c)["flops_per_token"]
    for precision in ("fp32", "fp16", "int8", "nf4", "fp4", "fp8"):
        assert cols(c, precision)["flops_per_token"] == base
    assert cols({**c, "tie_word_embeddings": True})["flops_per_token"] == base


def test_sliding_window_caps_attended_keys():
    # window 3, P=4, n=3: positions 1..6 attend to 1, 2, 3, 3, 3, 3 keys = 15 per layer
    c = cfg("tiny-mistral", sliding_window=3)
    a = Architecture.from_config(c)
    assert a.windows == (3, 3)
    full = Architecture.from_config(cfg("tiny-mistral"))
    per_pair = 2 * 4 * 4 * 32  # layers x 4 x heads x head_dim
    assert request_flops(full, 4, 3) - request_flops(a, 4, 3) == per_pair * (21 - 15)
    # decode steps feed positions 5 and 6: 3 keys each, not 5 and 6
    kv_per_key = 2 * 2 * 2 * 32 * 4  # K and V x layers x kv heads x head_dim x fp32 bytes
    assert kv_bytes_per_token(a, PRECISIONS["fp32"], 4, 3) == kv_per_key * 3
    assert kv_bytes_per_token(full, PRECISIONS["fp32"], 4, 3) == kv_per_key * 5.5


def test_qwen2_layer_types_pick_the_sliding_layers():
    c = cfg("tiny-qwen2", sliding_window=2, layer_types=["full_attention", "sliding_attention"])
    assert Architecture.from_config(c).windows == (None, 2)
    assert Architecture.from_config(cfg("tiny-qwen2")).windows == (None, None)  # use_sliding_window false


# -- bytes ------------------------------------------------------------------------------------

def test_weight_bytes_by_hand_bf16():
    # every matmul weight at 2 bytes, plus norms (2 per layer + final) and B embedding rows
    got = cols(cfg("llama-3.2-1b"), batch_size=4)["weight_bytes_per_token"]
    assert got == ((L1B_BLOCKS + L1B_VD) * 2 + (33 * 2048 + 4 * 2048) * 2) / 4
    got = cols(cfg("llama-3.1-8b"))["weight_bytes_per_token"]
    assert got == (L8B_BLOCKS + L8B_VD) * 2 + (65 * 4096 + 4096) * 2
    assert cols(cfg("llama-3.1-8b"), "fp32")["weight_bytes_per_token"] == (L8B_BLOCKS + L8B_VD) * 4 + 66 * 4096 * 4


def test_tied_and_untied_read_the_same_bytes_per_step():
    # the lm_head matrix is read once per step either way; tying only saves storage
    untied, tied = cfg("llama-3.1-8b"), cfg("llama-3.1-8b", tie_word_embeddings=True)
    assert Architecture.from_config(untied).total_params - Architecture.from_config(tied).total_params == L8B_VD
    assert cols(untied)["weight_bytes_per_token"] == cols(tied)["weight_bytes_per_token"]
    small = cfg("llama-3.2-1b", tie_word_embeddings=False)
    assert cols(small)["weight_bytes_per_token"] == cols(cfg("llama-3.2-1b"))["weight_bytes_per_token"]


def test_quantized_bytes_keep_lm_head_in_the_compute_dtype():
    rest = 65 * 4096 + 4096  # norms + one embedding row, compute dtype
    int8 = cols(cfg("llama-3.1-8b"), "int8")["weight_bytes_per_token"]
    assert int8 == L8B_BLOCKS * 1 + L8B_VD * 2 + rest * 2
    nf4 = cols(cfg("llama-3.1-8b"), "nf4")["weight_bytes_per_token"]
    assert nf4 == L8B_BLOCKS * 4.5 / 8 + L8B_VD * 2 + rest * 2
    # QLoRA double quantization: absmax in 8 bits per 64 weights + an fp32 per 256 blocks
    dq = cols(cfg("llama-3.1-8b"), "nf4", double_quant=True)["weight_bytes_per_token"]
    assert dq == pytest.approx(L8B_BLOCKS * (4 + 8 / 64 + 32 / (64 * 256)) / 8 + L8B_VD * 2 + rest * 2)
    assert nf4 - dq == pytest.approx(L8B_BLOCKS * 0.373 / 8, rel=1e-3)
    # a bf16 lm_head dominates less as the model grows, but is ~1/4 of the 8B's nf4 bytes
    assert 0.2 < L8B_VD * 2 / nf4 < 0.3


def test_double_quant_is_read_from_the_loaded_models_quantization_config():
    from transformers import BitsAndBytesConfig

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True)
    loaded = cfg("llama-3.1-8b", quantization_config=quant.to_dict())
    assert cols(loaded, "nf4")["weight_bytes_per_token"] == cols(cfg("llama-3.1-8b"), "nf4", double_quant=True)[
        "weight_bytes_per_token"]
    # int8 has no double quantization: the flag changes nothing
    assert cols(cfg("llama-3.1-8b"), "int8", double_quant=True) == cols(cfg("llama-3.1-8b"), "int8")


def test_gqa_kv_bytes_by_hand():
    # Llama-3.1-8B: K and V x 32 layers x 8 KV heads x 128 x 2 bytes = 128 KiB per position;
    # P=128, n=64: the decode steps' contexts 129..191, mean 160
    assert cols(cfg("llama-3.1-8b"))["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2 * 160 == 131072 * 160
    # Llama-3.2-1B: 16 layers x 8 KV heads x 64: 32 KiB per position
    assert cols(cfg("llama-3.2-1b"))["kv_bytes_per_token"] == 2 * 16 * 8 * 64 * 2 * 160
    # without GQA (32 KV heads) four times as much; int8's KV cache is fp16, fp32's 4 bytes
    mha = cfg("llama-3.1-8b", num_key_value_heads=32)
    assert cols(mha)["kv_bytes_per_token"] == 4 * 131072 * 160
    assert cols(cfg("llama-3.1-8b"), "int8")["kv_bytes_per_token"] == 131072 * 160
    assert cols(cfg("llama-3.1-8b"), "fp32")["kv_bytes_per_token"] == 2 * 131072 * 160


# -- MFU, MBU ---------------------------------------------------------------------------------

def test_mfu_and_mbu_from_throughput_and_tpot():
    c = cfg("llama-3.1-8b")
    got = cols(c, batch_size=8, throughput_tok_s=2000.0, tpot_s=0.004, gpu_names=["NVIDIA H200"])
    assert got["gpu_peak_flop_per_s"] == 1979e12 / 2  # H200 BF16 1,979 TFLOPS with sparsity
    assert got["gpu_peak_bandwidth_bytes_per_s"] == 4.8e12
    assert got["mfu"] == pytest.approx(got["flops_per_token"] * 2000.0 / (1979e12 / 2))
    step = (L8B_BLOCKS + L8B_VD) * 2 + (65 * 4096 + 8 * 4096) * 2 + 8 * 131072 * 160
    assert got["mbu"] == pytest.approx(step / 0.004 / 4.8e12)
    assert 0 < got["mbu"] < 1


def test_peaks_follow_the_precisions_compute_format():
    names = ["NVIDIA H100 80GB HBM3"]
    assert cols(cfg("llama-3.2-1b"), "fp32", gpu_names=names)["gpu_peak_flop_per_s"] == 67e12  # non-tensor
    for p in ("fp16", "bf16", "nf4", "fp4"):
        assert cols(cfg("llama-3.2-1b"), p, gpu_names=names)["gpu_peak_flop_per_s"] == 1979e12 / 2
    assert cols(cfg("llama-3.2-1b"), "int8", gpu_names=names)["gpu_peak_flop_per_s"] == 3958e12 / 2
    assert cols(cfg("llama-3.2-1b"), "fp8", gpu_names=names)["gpu_peak_flop_per_s"] == 3958e12 / 2


def test_tensor_parallel_sums_the_held_gpus():
    one = cols(cfg("llama-3.1-8b"), gpu_names=["NVIDIA H100 80GB HBM3"])
    two = cols(cfg("llama-3.1-8b"), gpu_names=["NVIDIA H100 80GB HBM3"] * 2)
    assert two["gpu_peak_bandwidth_bytes_per_s"] == 2 * one["gpu_peak_bandwidth_bytes_per_s"]
    assert two["mbu"] == pytest.approx(one["mbu"] / 2)
    assert two["mfu"] == pytest.approx(one["mfu"] / 2)
    # NVML's list wins; without it the backend's device name counts once per GPU
    assert held_gpu_names("NVIDIA H200,NVIDIA H200", "ignored", 2) == ["NVIDIA H200", "NVIDIA H200"]
    assert held_gpu_names(None, "NVIDIA H200", 2) == ["NVIDIA H200", "NVIDIA H200"]
    assert held_gpu_names(None, None, 1) == []


# -- GPU names ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, key, bandwidth", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35e12),
    ("NVIDIA H100 PCIe", "H100 PCIe", 2.0e12),
    ("NVIDIA H100 NVL", "H100 NVL", 3.9e12),
    ("NVIDIA H200", "H200 SXM", 4.8e12),
    ("nvidia h200", "H200 SXM", 4.8e12),
    ("NVIDIA H200 NVL", "H200 NVL", 4.8e12),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 2039e9),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM 40GB", 1555e9),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", 1555e9),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 1935e9),
    ("NVIDIA L4", "L4", 300e9),
    ("NVIDIA L40S", "L40S", 864e9),
    ("NVIDIA A10G", "A10G", 600e9),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 1008e9),
])
def test_known_gpu_names(name, key, bandwidth):
    gpu = match_gpu(name)
    assert gpu is GPUS[key]
    assert gpu.bandwidth_bytes_per_s == bandwidth
    assert gpu.source.startswith("https://")


@pytest.mark.parametrize("name", [
    # a MIG slice holds a fraction of the SMs and memory that its name does not pin down exactly
    "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
    "NVIDIA L40", "NVIDIA A10", "NVIDIA GeForce RTX 4090 Laptop GPU", "NVIDIA GeForce RTX 4080",
    "Tesla T4", "Intel(R) Xeon(R) Platinum 8480+", "", None,
])
def test_unknown_gpu_names(name):
    assert match_gpu(name) is None


def test_every_table_entry_has_a_source_and_dense_rates_below_sparse_marketing():
    for gpu in GPUS.values():
        assert gpu.source.startswith("https://") and gpu.bandwidth_bytes_per_s > 0
        rates = gpu.flop_per_s
        if rates["bf16"] is not None:
            assert rates["fp16"] == rates["bf16"] and rates["fp32"] < rates["bf16"] <= 1000e12


# -- null paths ------------------------------------------------------------------------------

def test_unknown_gpu_keeps_the_analytic_columns_and_nulls_the_rest():
    got = cols(cfg("llama-3.1-8b"), gpu_names=["NVIDIA H100 80GB HBM3 MIG 1g.10gb"])
    assert got["flops_per_token"] and got["weight_bytes_per_token"] and got["kv_bytes_per_token"]
    assert got["mfu"] is got["mbu"] is got["gpu_peak_flop_per_s"] is got["gpu_peak_bandwidth_bytes_per_s"] is None
    # one unknown GPU among known ones: no partial sum
    assert cols(cfg("llama-3.1-8b"), gpu_names=["NVIDIA H200", "NVIDIA L40"])["mbu"] is None
    assert cols(cfg("llama-3.1-8b"), gpu_names=[])["mfu"] is None


def test_a100_has_no_fp8_rate_but_its_bandwidth_still_gives_mbu():
    got = cols(cfg("llama-3.1-8b"), "fp8", gpu_names=["NVIDIA A100-SXM4-80GB"])
    assert got["gpu_peak_flop_per_s"] is None and got["mfu"] is None
    assert got["gpu_peak_bandwidth_bytes_per_s"] == 2039e9 and got["mbu"] is not None


def test_no_decode_step_means_no_kv_per_token_and_no_mbu():
    got = cols(cfg("llama-3.1-8b"), output_len=1, tpot_s=None)
    assert got["kv_bytes_per_token"] is None and got["mbu"] is None
    # one generated token carries the whole prefill
    assert got["flops_per_token"] == 2 * L8B_BLOCKS * 128 + 2 * L8B_VD + 32 * 4 * 32 * 128 * (128 * 129 // 2)
    assert got["mfu"] is not None


def test_unknown_architecture_gives_all_nulls():
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 512}
    with pytest.raises(UnsupportedArchitectureError, match="gpt2"):
        Architecture.from_config(gpt2)
    assert roofline(gpt2, PRECISIONS["bf16"], batch_size=1, input_len=128, output_len=64, gpu_names=[],
                    throughput_tok_s=100.0, tpot_s=0.01) == Roofline()


# -- a real trial ------------------------------------------------------------------------------

def test_a_real_cpu_trial_row_carries_flops_and_null_mbu():
    from actors.backends import create_backend
    from actors.backends.base import ModelSpec
    from actors.measure import measure_trial
    from actors.telemetry import NullTelemetry
    from sweeper.core.axes import BackendChoice, ModelRef
    from sweeper.core.backends import BACKENDS
    from sweeper.core.settings import MeasureSettings
    from sweeper.core.trial import Trial

    options = BACKENDS["transformers"].default_options()
    backend = create_backend("transformers")
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", options))
    try:
        trial = Trial.at(sweep="t", model=ModelRef("tiny-llama", "synthetic", "tiny-llama"),
                         backend=BackendChoice("transformers", options), precision="fp32", batch_size=2,
                         input_len=8, output_len=4, dataset="random", seed=0, repeat=0,
                         measure=MeasureSettings(warmup_iters=1, min_iters=2, min_duration_s=0.0, idle_s=0.0))
        row = measure_trial(backend, trial, load, NullTelemetry(reason="CPU test")).row
    finally:
        backend.close()
    # tiny-llama: hidden 128, MLP 384, 2 layers, 4 heads of 32, 2 KV heads, vocab 2048, untied
    blocks = 2 * (128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 384)
    positions = 8 + 4 - 1
    expected = (2 * blocks * positions + 2 * 2048 * 128 * 4 + 2 * 4 * 4 * 32 * positions * (positions + 1) // 2) / 4
    assert row["flops_per_token"] == expected
    assert row["weight_bytes_per_token"] == ((blocks + 2048 * 128) * 4 + (5 * 128 + 2 * 128) * 4) / 2
    assert row["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 4 * (8 + 2)  # contexts 9, 10, 11: mean 10
    assert row["mfu"] is None and row["mbu"] is None  # a CPU: no peak rates
    assert row["gpu_peak_flop_per_s"] is None and row["gpu_peak_bandwidth_bytes_per_s"] is None
