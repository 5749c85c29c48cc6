"""bitsandbytes through transformers: quantization configs, load-time checks, true footprints.

Which scheme a precision uses is the precision registry's ``quantization``
field; this module maps schemes (never precision names) to
``BitsAndBytesConfig`` arguments.
"""

from __future__ import annotations

from typing import Any

from actors.errors import QuantizationShapeError
from sweeper.core.precisions import Precision

# Quantization scheme -> BitsAndBytesConfig kwargs (compute dtype and double
# quantization are added per load).
SCHEMES: dict[str, dict[str, Any]] = {
    "bnb_int8": {"load_in_8bit": True},
    "bnb_nf4": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
    "bnb_fp4": {"load_in_4bit": True, "bnb_4bit_quant_type": "fp4"},
}


def compute_dtype(precision: Precision, device: str) -> Any:
    """The torch dtype of activations and unquantized weights.

    A quantized precision asks for bf16 where the GPU has it and falls back to
    fp16 on one without (pre-Ampere), as bitsandbytes users do; a plain dtype
    precision is exactly its dtype.
    """
    import torch

    dtype = getattr(torch, precision.torch_dtype)
    if (precision.quantization is not None and dtype == torch.bfloat16 and device == "cuda"
            and not torch.cuda.is_bf16_supported()):
        return torch.float16
    return dtype


def quantization_config(precision: Precision, device: str, *, double_quant: bool) -> Any:
    """``BitsAndBytesConfig`` for ``precision``, or None for a plain dtype."""
    if precision.quantization is None:
        return None
    kwargs = SCHEMES.get(precision.quantization)
    if kwargs is None:
        raise ValueError(f"the transformers backend has no implementation of quantization "
                         f"{precision.quantization!r} (precision {precision.name})")
    from transformers import BitsAndBytesConfig

    kwargs = dict(kwargs)
    if kwargs.get("load_in_4bit"):
        kwargs["bnb_4bit_compute_dtype"] = compute_dtype(precision, device)
        kwargs["bnb_4bit_use_double_quant"] = double_quant
    return BitsAndBytesConfig(**kwargs)


def probe(model: Any, precision: Precision, device: str) -> None:
    """One single-token forward, so kernel limits surface at load with a clear message.

    On CPUs with AVX512-BF16, bitsandbytes repacks each 4-bit weight on its
    first forward for a kernel that needs the output dimension divisible by its
    block (``N must be divisible by block_n``); without the probe that would be
    an assertion deep inside a warm-up generate.
    """
    import torch

    ids = torch.full((1, 1), 1, dtype=torch.long, device=model.device)
    try:
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=torch.ones_like(ids))
    except (AssertionError, RuntimeError) as exc:
        explained = _shape_error(exc, model, precision, device)
        if explained is None:
            raise
        raise explained from exc


def _shape_error(exc: BaseException, model: Any, precision: Precision, device: str) -> QuantizationShapeError | None:
    """The exception restated with the layer, its dimensions and the constraint, when a
    quantized layer's forward raised it; None otherwise."""
    layer = None
    block_n = None
    tb = exc.__traceback__
    while tb is not None:
        frame_locals = tb.tb_frame.f_locals
        owner = frame_locals.get("self")
        if owner is not None and hasattr(getattr(owner, "weight", None), "quant_state"):
            layer = owner  # the innermost quantized layer on the stack
        if isinstance(frame_locals.get("block_n"), int):
            block_n = frame_locals["block_n"]
        tb = tb.tb_next
    if layer is None:
        return None
    name = next((n for n, m in model.named_modules() if m is layer), type(layer).__name__)
    n_out, k_in = int(layer.out_features), int(layer.in_features)
    blocksize = getattr(layer.weight, "blocksize", None) or getattr(layer.weight.quant_state, "blocksize", None)
    problems = []
    if block_n and n_out % block_n:
        problems.append(f"out_features {n_out} is not a multiple of the kernel's block_n {block_n}")
    if blocksize and k_in % blocksize:
        problems.append(f"in_features {k_in} is not a multiple of the quantization blocksize {blocksize}")
    why = "; ".join(problems) or "a dimension does not fit the kernel's blocks"
    return QuantizationShapeError(
        f"precision {precision.name} on {device}: bitsandbytes cannot run {name} "
        f"(in_features {k_in}, out_features {n_out}): {why} "
        f"(bitsandbytes: {str(exc) or type(exc).__name__}). Use a model whose layer widths are "
        f"multiples of {max(block_n or 1, blocksize or 1)}, or run on a GPU")


def weight_memory_bytes(model: Any) -> int:
    """Bytes the loaded model's weights occupy: parameters, buffers and quantization state.

    ``get_memory_footprint`` counts parameters and buffers only, which misses
    bitsandbytes' scales: LLM.int8's per-row ``SCB`` and the 4-bit absmax (one
    fp32 per 64 weights, ~11% on top of the 4-bit payload; with double
    quantization an 8-bit absmax plus its own constants). Each tensor counts
    once (tied embeddings share storage).
    """
    import torch

    seen: set[tuple[str, int]] = set()
    total = 0

    def add(t: Any) -> None:
        nonlocal total
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        key = (str(t.device), t.data_ptr())
        if key in seen:
            return
        seen.add(key)
        total += t.numel() * t.element_size()

    def add_quant_state(state: Any) -> None:
        if state is None:
            return
        for attr in ("absmax", "code", "offset"):
            add(getattr(state, attr, None))
        add_quant_state(getattr(state, "state2", None))

    for module in model.modules():
        for p in module.parameters(recurse=False):
            add(p)
            add(getattr(p, "SCB", None))
            add_quant_state(getattr(p, "quant_state", None))
        # LLM.int8 moves the row scales from the weight to the layer's matmul
        # state on its first forward (CB there is the weight itself: counted once).
        state = getattr(module, "state", None)
        add(getattr(state, "SCB", None))
        add(getattr(state, "CB", None))
        for b in module.buffers(recurse=False):
            add(b)
    return total
