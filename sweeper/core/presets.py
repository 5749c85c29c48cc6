"""Bundled architecture presets for synthetic (random-weight) models.

A preset is the ``config.json`` of a real checkpoint, reduced to the fields
that decide cost: width, depth, heads, vocabulary. Synthetic models built from
them have the real architecture and random weights, so a sweep needs no
download, and every cost (FLOPs, bytes, KV cache, kernels) is the real one.
Output quality is meaningless, which is fine for measuring cost.

RoPE is plain (``rope_theta`` only): Llama 3's frequency scaling changes the
values of the position embedding, not its cost, and keeps the configs valid
across transformers 4.x and 5.x.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ModelPreset:
    name: str
    mirrors: str | None  # the hub checkpoint whose shape this reproduces
    config: MappingProxyType = field(repr=False)  # transformers config kwargs, incl. model_type

    @property
    def model_type(self) -> str:
        return self.config["model_type"]

    def config_dict(self) -> dict[str, Any]:
        return dict(self.config)


def _preset(name: str, mirrors: str | None, **config: Any) -> ModelPreset:
    return ModelPreset(name, mirrors, MappingProxyType(config))


_LLAMA3 = dict(model_type="llama", vocab_size=128256, rope_theta=500000.0, rms_norm_eps=1e-5,
               max_position_embeddings=131072, bos_token_id=128000, eos_token_id=128001,
               hidden_act="silu", attention_bias=False, mlp_bias=False)
_QWEN25 = dict(model_type="qwen2", rope_theta=1000000.0, rms_norm_eps=1e-6,
               max_position_embeddings=32768, bos_token_id=151643, eos_token_id=151643,
               hidden_act="silu", use_sliding_window=False)
_MISTRAL = dict(model_type="mistral", vocab_size=32768, rope_theta=1000000.0, rms_norm_eps=1e-5,
                max_position_embeddings=32768, bos_token_id=1, eos_token_id=2, hidden_act="silu",
                sliding_window=None)

PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in [
        _preset("llama-3.2-1b", "meta-llama/Llama-3.2-1B", **_LLAMA3, hidden_size=2048,
                intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
        _preset("llama-3.2-3b", "meta-llama/Llama-3.2-3B", **_LLAMA3, hidden_size=3072,
                intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
                num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
        _preset("llama-3.1-8b", "meta-llama/Llama-3.1-8B", **_LLAMA3, hidden_size=4096,
                intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
        # 70.6 B parameters: 141 GB of bf16 weights, so tensor parallel 2 at the least on 80 GB GPUs.
        _preset("llama-3.1-70b", "meta-llama/Llama-3.1-70B", **_LLAMA3, hidden_size=8192,
                intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
        _preset("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B", **_QWEN25, vocab_size=151936,
                hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True),
        _preset("qwen2.5-7b", "Qwen/Qwen2.5-7B", **_QWEN25, vocab_size=152064,
                hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, tie_word_embeddings=False),
        _preset("mistral-7b", "mistralai/Mistral-7B-v0.3", **_MISTRAL, hidden_size=4096,
                intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
        # Tiny presets: a 2-core CPU runs a whole sweep of them in seconds. Every
        # matrix dimension is a multiple of 128 so that 4-bit block quantization
        # (which needs dimensions divisible by its block) works on them too.
        _preset("tiny-llama", None, **{**_LLAMA3, "vocab_size": 2048, "bos_token_id": 1,
                "eos_token_id": 2, "max_position_embeddings": 2048}, hidden_size=128,
                intermediate_size=384, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=32, tie_word_embeddings=False),
        _preset("tiny-qwen2", None, **{**_QWEN25, "bos_token_id": 1, "eos_token_id": 2,
                "max_position_embeddings": 2048}, vocab_size=2048, hidden_size=128,
                intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, tie_word_embeddings=True),
        _preset("tiny-mistral", None, **{**_MISTRAL, "vocab_size": 2048,
                "max_position_embeddings": 2048}, hidden_size=128, intermediate_size=256,
                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                tie_word_embeddings=False),
    ]
}
