"""The backend registry: the one place that knows backends by name.

Each entry says which precisions and devices the backend runs, which Python
modules its worker needs, how its sweep-file options are validated, and where
its data-plane implementation lives (imported inside the actor only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict


class TransformersOptions(BaseModel):
    """Options of the ``transformers`` backend (``backend_options.transformers``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    # The fast path (issue 8): a static KV cache and torch.compile of the decode
    # step; compile time is recorded as compile_s, outside the measured window.
    compile: bool = False
    compile_mode: Literal["reduce-overhead", "max-autotune", "default"] = "reduce-overhead"
    # bitsandbytes 4-bit: quantize the quantization constants too (QLoRA's
    # double quantization, ~0.37 bits/weight less).
    bnb_double_quant: bool = False


@dataclass(frozen=True)
class BackendSpec:
    name: str
    impl: str  # "module:Class" of the data-plane implementation
    precisions: frozenset[str]
    devices: frozenset[str]
    requires: tuple[str, ...]  # modules the worker must be able to import
    options: type[BaseModel]
    layer_hooks: bool  # whether per-layer forward hooks can observe its model
    # Largest tensor-parallel degree it runs (1: one GPU per trial).
    max_tensor_parallel: int = 1

    def default_options_json(self) -> str:
        return canonical_options(self.options())

    def unsupported_reason(self, precision: str, device: str, tensor_parallel: int = 1) -> str | None:
        if precision not in self.precisions:
            return f"backend {self.name} does not support precision {precision}"
        if device not in self.devices:
            return f"backend {self.name} does not run on {device}"
        if tensor_parallel > self.max_tensor_parallel:
            return (f"backend {self.name} runs tensor_parallel <= {self.max_tensor_parallel}, "
                    f"not {tensor_parallel}")
        if tensor_parallel > 1 and device != "cuda":
            return f"tensor_parallel {tensor_parallel} needs GPUs"
        return None


def canonical_options(options: BaseModel) -> str:
    return json.dumps(options.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


BACKENDS: dict[str, BackendSpec] = {
    b.name: b
    for b in [
        BackendSpec(
            name="transformers",
            impl="actors.backends.hf:TransformersBackend",
            precisions=frozenset({"fp32", "fp16", "bf16", "int8", "nf4", "fp4"}),
            devices=frozenset({"cuda", "cpu"}),
            requires=("torch", "transformers"),
            options=TransformersOptions,
            layer_hooks=True,
        ),
    ]
}
