"""The precision registry: one declarative entry per numeric format.

Which backends and devices can run a precision is decided here and only here;
the planner asks ``Precision.unsupported_reason`` and never branches on names.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    name: str
    torch_dtype: str  # dtype of activations (and of weights unless quantized)
    devices: frozenset[str]  # devices where a measurement of it means something
    why_not_elsewhere: str = ""
    # Quantized formats need real weight tensors on disk to quantize while
    # loading; dtype precisions can load a synthetic model with no weight file.
    needs_weights: bool = False

    def unsupported_reason(self, device: str) -> str | None:
        if device not in self.devices:
            return f"precision {self.name} on {device}: {self.why_not_elsewhere}"
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
    ]
}
