"""The precision registry: one declarative entry per numeric format.

Which devices can run a precision, which library it needs and how its weights
are stored is decided here and only here; the planner asks
``Precision.unsupported_reason`` and never branches on names. Which *backends*
run a precision is the backend registry's business (``sweeper.core.backends``).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split(".")[:3]:
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


@dataclass(frozen=True)
class Precision:
    name: str
    # dtype of activations (and of weights unless quantized)
    torch_dtype: str
    # devices where a measurement of it means something
    devices: frozenset[str]
    why_not_elsewhere: str = ""
    # Quantization scheme, or None for a plain dtype. Backends map it to their
    # own mechanism (transformers: BitsAndBytesConfig; vLLM: ``quantization=``).
    quantization: str | None = None
    # Bits per stored weight of a quantized linear layer, scales included
    # (roofline bytes); a plain dtype's bits follow from torch_dtype.
    weight_bits: float | None = None
    # Whether the output projection (lm_head) is quantized too. bitsandbytes
    # keeps it in the compute dtype by default, which matters for bytes/token.
    quantizes_lm_head: bool = False
    # The Python distribution that implements it and, per device, the oldest
    # version that runs it there ({} = any version).
    library: str | None = None
    min_library_version: tuple[tuple[str, str], ...] = ()
    # Quantized formats need real weight tensors on disk to quantize while
    # loading; dtype precisions can load a synthetic model with no weight file.
    needs_weights: bool = False
    # Bits per stored weight with double quantization (the scales quantized
    # too), for schemes that offer it; None: the option changes nothing.
    weight_bits_double_quant: float | None = None
    # Number format the matmuls run in, which picks the GPU's peak rate for MFU
    # (sweeper.core.gpus.FORMATS); None: the compute dtype's own format.
    compute_format: str | None = None

    @property
    def bits_per_weight(self) -> float:
        if self.weight_bits is not None:
            return self.weight_bits
        return {"float32": 32.0, "float16": 16.0, "bfloat16": 16.0}[self.torch_dtype]

    def storage_bits(self, double_quant: bool = False) -> float:
        """Bits per stored weight of a quantized linear layer, scales included."""
        if double_quant and self.weight_bits_double_quant is not None:
            return self.weight_bits_double_quant
        return self.bits_per_weight

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of the compute dtype (activations, KV cache, unquantized weights)."""
        return {"float32": 4, "float16": 2, "bfloat16": 2}[self.torch_dtype]

    @property
    def peak_format(self) -> str:
        """The format whose peak rate bounds this precision's matmuls."""
        return self.compute_format or {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[self.torch_dtype]

    def unsupported_reason(self, device: str, installed_version: str | None = None) -> str | None:
        """Why this precision cannot run on ``device``, or None.

        ``installed_version`` is the version of ``library`` where the trial
        will run, when known (None: unknown, so not a reason to skip; a
        worker without the library fails that trial with a clear error).
        """
        if device not in self.devices:
            return f"precision {self.name} on {device}: {self.why_not_elsewhere}"
        needed = dict(self.min_library_version).get(device)
        if needed and installed_version and _version_tuple(installed_version) < _version_tuple(needed):
            return (f"precision {self.name} on {device} needs {self.library}>={needed}; "
                    f"{installed_version} is installed")
        return None

    def library_version(self) -> str | None:
        """The installed version of ``library`` in this process, or None."""
        if self.library is None:
            return None
        try:
            return importlib.metadata.version(self.library)
        except importlib.metadata.PackageNotFoundError:
            return None


PRECISIONS: dict[str, Precision] = {
    p.name: p
    for p in [
        Precision("fp32", "float32", frozenset({"cuda", "cpu"})),
        Precision(
            "fp16", "float16", frozenset({"cuda"}),
            why_not_elsewhere="CPUs emulate half-precision matmuls; the numbers would "
            "measure the emulation, not the format",
        ),
        Precision("bf16", "bfloat16", frozenset({"cuda", "cpu"})),
        # LLM.int8 (Dettmers et al. 2022): int8 weights with a per-row fp32 scale
        # (32/in_features bits/weight, ~0 for LLM shapes; counted as 8.0).
        Precision(
            "int8", "float16", frozenset({"cuda", "cpu"}), quantization="bnb_int8",
            weight_bits=8.0, library="bitsandbytes",
            # The multi-backend CPU kernels landed in bitsandbytes 0.46.
            min_library_version=(("cpu", "0.46"),), needs_weights=True,
            # int8 x int8 tensor-core matmuls (outlier columns in fp16 aside).
            compute_format="int8",
        ),
        # 4-bit NormalFloat / FP4 with a blocksize-64 absmax: 4 bits + 32/64 bits of fp32
        # scale. Double quantization (QLoRA, Dettmers et al. 2023, §3) stores the absmax
        # in 8 bits with one fp32 constant per 256 blocks: 4 + 8/64 + 32/(64*256) bits.
        # The matmuls dequantize to the bf16 compute dtype: its peak rate applies.
        Precision(
            "nf4", "bfloat16", frozenset({"cuda", "cpu"}), quantization="bnb_nf4",
            weight_bits=4.5, weight_bits_double_quant=4 + 8 / 64 + 32 / (64 * 256), library="bitsandbytes",
            min_library_version=(("cpu", "0.46"),), needs_weights=True,
        ),
        Precision(
            "fp4", "bfloat16", frozenset({"cuda", "cpu"}), quantization="bnb_fp4",
            weight_bits=4.5, weight_bits_double_quant=4 + 8 / 64 + 32 / (64 * 256), library="bitsandbytes",
            min_library_version=(("cpu", "0.46"),), needs_weights=True,
        ),
        # FP8 (E4M3) weights with per-tensor scales, as vLLM's ``quantization="fp8"``
        # quantizes them dynamically at load: needs Ada/Hopper tensor cores.
        Precision(
            "fp8", "bfloat16", frozenset({"cuda"}), quantization="fp8", weight_bits=8.0,
            compute_format="fp8",
            why_not_elsewhere="FP8 matmuls need a GPU with FP8 tensor cores (Ada, Hopper or newer)",
        ),
    ]
}
