"""Analytic FLOPs and bytes per generated token, MFU and MBU.

Everything here follows from the model's architecture (its HF ``config.json``
as a dict) and the precision registry; nothing is measured or hard-coded per
model. The GPUs' peak rates that MFU and MBU divide by are in
``sweeper.core.gpus``. Pure Python: the control plane and the actor both import it.

Conventions (docs/METHOD.md, "Roofline: MFU and MBU"):

- A multiply-add is 2 FLOPs. Counted: every matmul with a weight (q, k, v, o,
  gate, up, down, lm_head) at 2 FLOPs per weight per token, and attention's
  two matmuls (QK^T and AV) at 2 x 2 x head_dim FLOPs per head per
  (query, key) pair, causal: a query at 1-based position t attends to
  min(t, window) keys. Not counted: softmax, norms, rotary embeddings,
  activations, bias adds, residual adds and the embedding lookup (no
  multiply-adds, or a vanishing share of them).
- The lm_head runs once per generated token: for the prompt only its last
  position's logits are needed (transformers' ``logits_to_keep=1``, vLLM).
- A request of P prompt tokens and n generated tokens runs T = P + n - 1
  positions through the blocks: P in prefill, then n - 1 decode steps (the
  last generated token is never fed back).
- Quantized models do the same math as full precision: the weights are
  stored in fewer bits, but every matmul still multiplies the same shapes
  (bitsandbytes and FP8 kernels dequantize or rescale, they do not skip
  multiply-adds). FLOPs do not depend on the precision, bytes do.
- Bytes are what one decode step must read at least: every matmul weight at
  its stored size (``Precision.storage_bits``; lm_head in the compute dtype
  unless ``quantizes_lm_head``), biases and norm weights and the B embedding
  rows in the compute dtype, and each sequence's K and V for all positions its
  query attends to, in the compute dtype. Activations and the write of the
  new KV entry are left out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.core.errors import SweeperError
from sweeper.core.gpus import peak_rates
from sweeper.core.precisions import Precision
from sweeper.core.results import Roofline


class UnsupportedArchitectureError(SweeperError):
    """A model family whose cost this module has no formulas for."""


# Which projections carry a bias, per family: (q/k/v, o, mlp). A bias adds bytes, no
# multiply-adds. Qwen2 hard-codes q/k/v biases in its modeling code; Llama reads
# its config; Mistral has none.
_BIASES: dict[str, Callable[[Mapping[str, Any]], tuple[bool, bool, bool]]] = {
    "llama": lambda c: (bool(c.get("attention_bias")), bool(c.get("attention_bias")), bool(c.get("mlp_bias"))),
    "qwen2": lambda c: (True, False, False),
    "mistral": lambda c: (False, False, False),
}


@dataclass(frozen=True)
class Architecture:
    """The shapes that decide a decoder-only model's cost (SwiGLU MLP, GQA attention)."""

    model_type: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    # Per layer: the sliding-window length, or None for full causal attention.
    windows: tuple[int | None, ...] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> Architecture:
        """From ``PretrainedConfig.to_dict()`` (or a preset's config) of a llama/qwen2/mistral model."""
        model_type = config.get("model_type")
        if model_type not in _BIASES:
            raise UnsupportedArchitectureError(
                f"no FLOPs/bytes formulas for model_type {model_type!r} (known: {', '.join(sorted(_BIASES))})")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        layers = int(config["num_hidden_layers"])
        qkv_bias, o_bias, mlp_bias = _BIASES[model_type](config)
        return cls(
            model_type=model_type, hidden_size=hidden,
            intermediate_size=int(config["intermediate_size"]), num_layers=layers,
            num_heads=heads, num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab_size=int(config["vocab_size"]),
            # transformers' default is tied, so a config that omits the key ties.
            tied_embeddings=bool(config.get("tie_word_embeddings", True)),
            qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias,
            windows=_layer_windows(config, layers),
        )

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params_per_layer(self) -> int:
        """q, k, v and o projection weights of one block."""
        d = self.hidden_size
        return d * self.q_dim + 2 * d * self.kv_dim + self.q_dim * d

    @property
    def mlp_params_per_layer(self) -> int:
        """gate, up and down projection weights of one block."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def block_matmul_params(self) -> int:
        return self.num_layers * (self.attention_params_per_layer + self.mlp_params_per_layer)

    @property
    def lm_head_params(self) -> int:
        """The output projection, a matmul whether or not it shares the embedding's storage."""
        return self.vocab_size * self.hidden_size

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def bias_params(self) -> int:
        per_layer = (self.qkv_bias * (self.q_dim + 2 * self.kv_dim) + self.o_bias * self.hidden_size
                     + self.mlp_bias * (2 * self.intermediate_size + self.hidden_size))
        return self.num_layers * per_layer

    @property
    def norm_params(self) -> int:
        """Two RMSNorm weights per block and the final norm."""
        return (2 * self.num_layers + 1) * self.hidden_size

    @property
    def total_params(self) -> int:
        """Stored parameters: a tied lm_head is the embedding, counted once."""
        return (self.block_matmul_params + self.embedding_params + self.bias_params + self.norm_params
                + (0 if self.tied_embeddings else self.lm_head_params))


def _layer_windows(config: Mapping[str, Any], layers: int) -> tuple[int | None, ...]:
    window = config.get("sliding_window")
    types = config.get("layer_types")
    if types:  # transformers >= 4.5x writes the per-layer kind out (Qwen2: max_window_layers)
        return tuple(int(window) if t == "sliding_attention" and window else None for t in types)
    if window and config.get("use_sliding_window", True):  # Mistral: every layer, when set
        return (int(window),) * layers
    return (None,) * layers


def _keys_attended(first: int, last: int, window: int | None) -> int:
    """Sum over 1-based query positions t in [first, last] of min(t, window)."""
    def upto(n: int) -> int:
        if n <= 0:
            return 0
        if window is None or n <= window:
            return n * (n + 1) // 2
        return window * (window + 1) // 2 + (n - window) * window
    return upto(last) - upto(first - 1)


def request_flops(arch: Architecture, input_len: int, output_len: int) -> int:
    """Forward FLOPs of one request: prefill of ``input_len`` tokens, then ``output_len`` - 1 decode steps."""
    positions = input_len + output_len - 1
    pairs = sum(_keys_attended(1, positions, w) for w in arch.windows)
    return (2 * arch.block_matmul_params * positions + 2 * arch.lm_head_params * output_len
            + 4 * arch.num_heads * arch.head_dim * pairs)


def flops_per_token(arch: Architecture, input_len: int, output_len: int) -> float:
    """``request_flops`` per generated token (the prompt's prefill amortised over the output)."""
    return request_flops(arch, input_len, output_len) / output_len


def weight_bytes_per_step(arch: Architecture, precision: Precision, batch_size: int,
                          double_quant: bool = False) -> float:
    """Weight bytes one decode step of ``batch_size`` sequences reads."""
    matmul_bytes = precision.storage_bits(double_quant) / 8
    lm_head_bytes = matmul_bytes if precision.quantizes_lm_head else precision.compute_bytes
    unquantized = arch.bias_params + arch.norm_params + batch_size * arch.hidden_size  # + B embedding rows
    return (arch.block_matmul_params * matmul_bytes + arch.lm_head_params * lm_head_bytes
            + unquantized * precision.compute_bytes)


def kv_bytes_per_token(arch: Architecture, precision: Precision, input_len: int, output_len: int) -> float | None:
    """K and V bytes one sequence reads per decode step, averaged over its ``output_len`` - 1 steps.

    Decode step j (1..n-1) feeds the query at position P + j, which attends to
    min(P + j, window) keys per layer; the mean context is P + n/2 with no
    window. None when there is no decode step (``output_len`` 1).
    """
    steps = output_len - 1
    if steps < 1:
        return None
    keys = sum(_keys_attended(input_len + 1, input_len + steps, w) for w in arch.windows)
    return 2 * arch.kv_dim * precision.compute_bytes * keys / steps


def _double_quant_from(config: Mapping[str, Any]) -> bool:
    # How the model was actually loaded: transformers keeps its BitsAndBytesConfig in the config.
    quant = config.get("quantization_config") or {}
    return bool(quant.get("bnb_4bit_use_double_quant", False)) if isinstance(quant, Mapping) else False


def roofline(config: Mapping[str, Any], precision: Precision, *, batch_size: int, input_len: int,
             output_len: int, gpu_names: Sequence[str], throughput_tok_s: float | None,
             tpot_s: float | None, double_quant: bool | None = None) -> Roofline:
    """The roofline part of one measured window's result.

    - ``flops_per_token`` = ``request_flops`` / output_len: every FLOP of the
      window (all prefills and decode steps) per generated token, so
      mfu = flops_per_token x throughput_tok_s / peak FLOP/s exactly, i.e. the
      window's FLOPs / duration_s / peak.
    - ``weight_bytes_per_token`` = ``weight_bytes_per_step`` / batch_size;
      ``kv_bytes_per_token`` per sequence at the decode steps' contexts (mean).
    - mbu = (weight_bytes_per_token + kv_bytes_per_token) x batch_size / tpot_s
      / peak bytes/s: the bytes of one decode step over the measured time of
      one decode step (tpot_s, each request's (e2e - ttft) / (n - 1), mean).
    - Peaks are summed over ``gpu_names``, at ``precision.peak_format``.

    Unknown architecture: all null. Unknown GPU (or a CPU): mfu, mbu and the
    peaks null. ``double_quant`` None: read from the config's
    ``quantization_config`` (how transformers loaded it).
    """
    try:
        arch = Architecture.from_config(config)
    except UnsupportedArchitectureError:
        return Roofline()
    if double_quant is None:
        double_quant = _double_quant_from(config)
    step_bytes = weight_bytes_per_step(arch, precision, batch_size, double_quant)
    kv = kv_bytes_per_token(arch, precision, input_len, output_len)
    flops = flops_per_token(arch, input_len, output_len)
    peak_flop, peak_bw = peak_rates(gpu_names, precision.peak_format)
    return Roofline(
        flops_per_token=flops, weight_bytes_per_token=step_bytes / batch_size, kv_bytes_per_token=kv,
        mfu=flops * throughput_tok_s / peak_flop if peak_flop and throughput_tok_s is not None else None,
        mbu=(step_bytes + batch_size * kv) / tpot_s / peak_bw if peak_bw and tpot_s and kv is not None else None,
        gpu_peak_flop_per_s=peak_flop, gpu_peak_bandwidth_bytes_per_s=peak_bw,
    )
