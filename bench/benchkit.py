"""Helpers the compiled-path benches share: trials of one shape, the run's environment.

Imported by the GPU benches (bench/compile_check.py, overhead.py, backends.py, layers.py,
quant_check.py)
(``python bench/x.py`` puts this folder on sys.path).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any


def make_trial(model: str, *, batch: int, input_len: int, output_len: int, compile: bool,
               compile_mode: str = "reduce-overhead", precision: str = "bf16", window_s: float = 5.0,
               warmup_iters: int = 1, min_iters: int = 3, idle_s: float = 0.0) -> Any:
    """One transformers trial built by the real sweep parser and planner."""
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    sweep = parse_sweep({
        "name": "compile-bench", "models": model, "backends": "transformers", "precisions": precision,
        "backend_options": {"transformers": {"compile": compile, "compile_mode": compile_mode}},
        "batch_sizes": batch, "workload": {"input_len": input_len, "output_len": output_len},
        "measure": {"warmup_iters": warmup_iters, "min_iters": min_iters, "min_duration_s": window_s,
                    "idle_s": idle_s, "min_window_s": min(window_s, 1.0)},
    })
    (trial,) = expand(sweep, check_hub=False)[0]
    return trial


def version(package: str) -> str | None:
    """The installed version of ``package``, or None."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as _version

    try:
        return _version(package)
    except PackageNotFoundError:
        return None


def driver_version() -> str | None:
    """The NVIDIA driver's version, or None where NVML is unavailable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:
        return None


def environment() -> dict[str, Any]:
    """Device, driver and library versions of this process's GPU run."""
    from actors.environment import capture

    env: dict[str, Any] = {**capture(), "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import torch

        env["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except ImportError:
        env["device"] = None
    try:
        import pynvml

        pynvml.nvmlInit()
        env["driver_version"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception as exc:  # a CPU smoke run has no NVML
        env["driver_version"] = f"unavailable: {type(exc).__name__}"
    return env


def set_energy_read(sampler: Any, via: str) -> None:
    """Make the sampler read the energy counter through ``nvmlDeviceGetTotalEnergyConsumption``
    (``"call"``, the product's way) or the field-values API (``"field"``): the same
    counter by another driver path, which may cost less per read."""
    import pynvml as nv

    if via == "call":
        call = nv.nvmlDeviceGetTotalEnergyConsumption
    elif via == "field":
        fields = [nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]

        def call(handle: Any) -> int:
            value = nv.nvmlDeviceGetFieldValues(handle, fields)[0]
            if value.nvmlReturn != 0:
                raise nv.NVMLError(value.nvmlReturn)
            return value.value.ullVal
    else:
        raise ValueError(f"energy read via {via!r}: expected 'call' or 'field'")
    for reader in sampler._readers:
        reader._energy = call


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def row_subset(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    return {c: row.get(c) for c in columns}


def write_json(path: str, report: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(report, f, indent=2, default=str)
    print(f"wrote {path}")


ROW_COLUMNS = ("status", "error", "compile_s", "compile_status", "throughput_tok_s", "ttft_s", "tpot_s",
               "energy_per_token_j", "mbu", "mfu", "peak_memory_bytes", "n_iterations", "duration_s")
