"""GPU peak rates: datasheet FLOP/s per number format and memory bandwidth, per GPU model.

The roofline's MFU and MBU divide a measured rate by these peaks. A GPU is
looked up by the name NVML or torch reports for it, matched whole after
normalising; a name that is not exactly a known GPU (a MIG slice, a laptop part,
a CPU) gets no peaks, so its MFU and MBU stay null rather than wrong. Pure
Python: the control plane and the actor both import it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")


@dataclass(frozen=True)
class GpuPeak:
    """Datasheet peaks of one GPU model: dense (no 2:4 sparsity), at boost clock.

    ``flop_per_s`` by format: ``fp32`` is the non-tensor (CUDA core) rate, which
    is what fp32 matmuls get with torch's default (TF32 off for matmuls);
    ``tf32``, ``fp16``, ``bf16``, ``fp8`` are tensor-core rates with FP32
    accumulation; ``int8`` is tensor-core op/s. None: the GPU lacks the format.
    """

    name: str
    flop_per_s: Mapping[str, float | None]
    bandwidth_bytes_per_s: float
    source: str


def _gpu(name: str, source: str, *, fp32: float, tf32: float, bf16: float, fp8: float | None,
         int8: float, bandwidth_gb_s: float) -> GpuPeak:
    """Rates in TFLOPS (TOPS) and GB/s, decimal, as datasheets print them; fp16 = bf16 on all of these."""
    rates = {"fp32": fp32, "tf32": tf32, "fp16": bf16, "bf16": bf16, "fp8": fp8, "int8": int8}
    return GpuPeak(name, {k: None if v is None else v * 1e12 for k, v in rates.items()},
                   bandwidth_gb_s * 1e9, source)


# Datasheets print tensor rates "with sparsity" (marked *); dense is half of that,
# written below as x / 2 so each number can be checked against its page.
_HOPPER = "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
_H200 = "https://www.nvidia.com/en-us/data-center/h200/"
_A100 = ("https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
         "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf")
_ADA = "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf"

GPUS: dict[str, GpuPeak] = {g.name: g for g in [
    # H100 SXM5 80GB HBM3: FP32 67, TF32 989*, BF16/FP16 1979*, FP8 3958*, INT8 3958*, 3.35 TB/s.
    _gpu("H100 SXM", _HOPPER, fp32=67, tf32=989 / 2, bf16=1979 / 2, fp8=3958 / 2, int8=3958 / 2,
         bandwidth_gb_s=3350),
    # H100 PCIe 80GB HBM2e: FP32 51, TF32 756*, BF16 1513*, FP8 3026*, INT8 3026*, 2 TB/s.
    _gpu("H100 PCIe", _HOPPER, fp32=51, tf32=756 / 2, bf16=1513 / 2, fp8=3026 / 2, int8=3026 / 2,
         bandwidth_gb_s=2000),
    # H100 NVL 94GB HBM3 (per GPU): FP32 60, TF32 835*, BF16 1671*, FP8 3341*, INT8 3341*, 3.9 TB/s.
    _gpu("H100 NVL", _HOPPER, fp32=60, tf32=835 / 2, bf16=1671 / 2, fp8=3341 / 2, int8=3341 / 2,
         bandwidth_gb_s=3900),
    # H200 SXM 141GB HBM3e: the H100 SXM's compute, 4.8 TB/s.
    _gpu("H200 SXM", _H200, fp32=67, tf32=989 / 2, bf16=1979 / 2, fp8=3958 / 2, int8=3958 / 2,
         bandwidth_gb_s=4800),
    # H200 NVL 141GB HBM3e: FP32 60, TF32 835*, BF16 1671*, FP8 3341*, INT8 3341*, 4.8 TB/s.
    _gpu("H200 NVL", _H200, fp32=60, tf32=835 / 2, bf16=1671 / 2, fp8=3341 / 2, int8=3341 / 2,
         bandwidth_gb_s=4800),
    # A100, L4 and L40S figures were cross-checked on 2026-11-21 against public pages that
    # restate the datasheets (dense = half the "*" sparsity figure throughout).
    # A100 (every variant): FP32 19.5, TF32 156, BF16/FP16 312, INT8 624 dense; no FP8.
    # Bandwidth: 40GB 1,555 GB/s; 80GB PCIe 1,935 GB/s; 80GB SXM 2,039 GB/s.
    _gpu("A100 SXM 40GB", _A100, fp32=19.5, tf32=156, bf16=312, fp8=None, int8=624, bandwidth_gb_s=1555),
    _gpu("A100 SXM 80GB", _A100, fp32=19.5, tf32=156, bf16=312, fp8=None, int8=624, bandwidth_gb_s=2039),
    _gpu("A100 PCIe 40GB", _A100, fp32=19.5, tf32=156, bf16=312, fp8=None, int8=624, bandwidth_gb_s=1555),
    _gpu("A100 PCIe 80GB", _A100, fp32=19.5, tf32=156, bf16=312, fp8=None, int8=624, bandwidth_gb_s=1935),
    # L4: FP32 30.3, TF32 120*, BF16/FP16 242*, FP8 485*, INT8 485*, 300 GB/s.
    _gpu("L4", "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet",
         fp32=30.3, tf32=120 / 2, bf16=242 / 2, fp8=485 / 2, int8=485 / 2, bandwidth_gb_s=300),
    # L40S: FP32 91.6, TF32 183 | 366*, BF16/FP16 362.05 | 733*, FP8 733 | 1466*, INT8 733 | 1466*, 864 GB/s.
    _gpu("L40S", "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413",
         fp32=91.6, tf32=183, bf16=362.05, fp8=733, int8=733, bandwidth_gb_s=864),
    # GeForce RTX 4090 (Ada whitepaper, appendix): FP32 82.6; with FP32 accumulate (what
    # cuBLAS and vLLM's FP8 kernels use; GeForce runs it at half the FP16-accumulate rate)
    # BF16/FP16 165.2, FP8 330.3; TF32 82.6; INT8 660.6 TOPS; 1,008 GB/s.
    _gpu("RTX 4090", _ADA, fp32=82.6, tf32=82.6, bf16=165.2, fp8=330.3, int8=660.6, bandwidth_gb_s=1008),
]}
# A10G: AWS's variant of the A10 (G5 instances). NVIDIA publishes no datasheet for it and
# its tensor rates differ from the A10's, so it has no peak FLOP rate (mfu stays null).
# Its memory is the A10's, 24 GB GDDR6 at 600 GB/s (A10 datasheet,
# https://www.nvidia.com/en-us/data-center/products/a10-gpu/; same memory:
# https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/), so mbu is computed.
GPUS["A10G"] = GpuPeak("A10G", dict.fromkeys(FORMATS), 600e9,
                       "https://www.nvidia.com/en-us/data-center/products/a10-gpu/")

# NVML / torch device names, normalised (lower case, "nvidia"/"geforce" dropped,
# separators as single spaces), matched whole: a name that is not exactly one of
# these (a MIG slice such as "h100 80gb hbm3 mig 1g.10gb", an "L40" that is not an
# "L40S", a laptop part) is unknown and gets null peaks rather than a wrong one.
# A MIG instance holds a fraction of the SMs and memory slices that does not
# follow from its name exactly, so it is unknown on purpose.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"h100 (80gb )?hbm3|h100 sxm5?( 80gb)?|h100 80gb sxm5?", "H100 SXM"),
    (r"h100 (80gb )?pcie( 80gb)?", "H100 PCIe"),
    (r"h100 nvl( 94gb)?", "H100 NVL"),
    (r"h200( 141gb)?( hbm3e)?|h200 sxm( 141gb)?", "H200 SXM"),
    (r"h200 nvl( 141gb)?", "H200 NVL"),
    (r"a100 sxm4? 40gb", "A100 SXM 40GB"),
    (r"a100 sxm4? 80gb", "A100 SXM 80GB"),
    (r"a100 pcie( 40gb)?|a100 40gb pcie", "A100 PCIe 40GB"),
    (r"a100 80gb pcie|a100 pcie 80gb", "A100 PCIe 80GB"),
    (r"l4", "L4"),
    (r"l40s", "L40S"),
    (r"a10g", "A10G"),
    (r"rtx 4090", "RTX 4090"),
)


def _normalise(name: str) -> str:
    text = re.sub(r"\b(nvidia|geforce|tesla)\b", " ", name.lower())
    return " ".join(re.sub(r"[-_/,]", " ", text).split())


def match_gpu(name: str | None) -> GpuPeak | None:
    """The table entry for an NVML/torch device name, or None if it is not exactly a known GPU."""
    if not name:
        return None
    text = _normalise(name)
    for pattern, key in _NAME_PATTERNS:
        if re.fullmatch(pattern, text):
            return GPUS[key]
    return None


def held_gpu_names(gpu_names: str | None, device_name: str | None, count: int) -> list[str]:
    """Names of the GPUs a trial held: the telemetry's comma-separated list, else
    the backend's device name once per GPU (``count``: the tensor-parallel degree).

    On a CPU-only trial this is the CPU's name, which matches no GPU: null peaks.
    """
    if gpu_names:
        return [n.strip() for n in gpu_names.split(",") if n.strip()]
    return [device_name] * count if device_name else []


def peak_rates(gpu_names: Sequence[str], fmt: str) -> tuple[float | None, float | None]:
    """(FLOP/s at ``fmt``, bytes/s) summed over the GPUs; None where any GPU is unknown or lacks ``fmt``."""
    gpus = [g for g in (match_gpu(n) for n in gpu_names) if g is not None]
    if not gpus or len(gpus) != len(gpu_names):
        return None, None
    rates = [r for r in (g.flop_per_s[fmt] for g in gpus) if r is not None]
    flop = float(sum(rates)) if len(rates) == len(gpus) else None
    return flop, float(sum(g.bandwidth_bytes_per_s for g in gpus))
