"""What every bench shares: the one result record, trials of one shape, the run's environment.

Every subcommand of ``python -m bench`` writes its JSON through :func:`write_record`, so
every result file says what produced it, from which commit, when and on what:

    {"bench": "energy", "command": ["python3", "-m", "bench", "energy", ...],
     "commit": "<git rev-parse HEAD>" | null, "dirty": true | false | null,
     "date": "<UTC ISO 8601, when the command started>",
     "device": {"gpus": ["NVIDIA H200", ...], "cpu": "<CPU model>"},
     "versions": {"python": ..., "torch": ..., "transformers": ..., "vllm": ..., "ray": ...,
                  "driver": ..., "cuda": ..., ...},
     "results": <what the bench measured; its own shape>}

:func:`read_results` reads the ``results`` of such a file (or the whole of a file written
before the record existed).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from actors.environment import cpu_model


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

    env: dict[str, Any] = {k: v for k, v in capture().items() if v is not None}
    env["date"] = time.strftime("%Y-%m-%d %H:%M:%S")
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


@contextlib.contextmanager
def sync_every_step(backend: Any) -> Iterator[None]:
    """Inside the block, the transformers backend's eager path synchronizes the device after
    every forward (every decode step), as its first per-token timing did, to show what that
    stall costs. The backend itself synchronizes once per call, after prefill. Where the
    compiled path takes the call, nothing changes: a hook would make it run eager instead."""
    compiled = backend._compiled
    if compiled is not None and compiled.applies():
        yield
        return
    handle = backend.model.register_forward_hook(lambda *_: backend.sync())
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def output_ids(backend: Any) -> Iterator[list[Any]]:
    """Inside the block, each ``generate`` call of the transformers backend appends its
    prompt + generated token ids (a device tensor, batch x (input_len + output_len)) to the
    list yielded, from whichever path ran it (eager ``model.generate`` or the compiled loop):
    to compare the tokens of two paths on the same prompts."""
    captured: list[Any] = []
    model, compiled = backend.model, backend._compiled
    model_generate, compiled_generate = model.generate, compiled.generate

    def eager(*args: Any, **kwargs: Any) -> Any:
        out = model_generate(*args, **kwargs)
        captured.append(out)
        return out

    def loop(*args: Any, **kwargs: Any) -> Any:
        out, t_first = compiled_generate(*args, **kwargs)
        captured.append(out)
        return out, t_first

    model.generate, compiled.generate = eager, loop  # on these instances only
    try:
        yield captured
    finally:
        del model.generate, compiled.generate


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def paired_ratio(values: list[float], reference: list[float]) -> dict[str, Any]:
    """Geometric mean of per-round ratios ``values / reference`` with a 95 % Student-t
    interval over the rounds (rounds run side by side, so drift between them cancels)."""
    import math

    from sweeper.core.intervals import t975

    logs = [math.log(v / r) for v, r in zip(values, reference, strict=True) if v and r]
    if len(logs) < 2:
        return {"geomean": math.exp(logs[0]) if logs else None, "ci95": None, "rounds": len(logs)}
    mean = statistics.fmean(logs)
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"geomean": math.exp(mean), "ci95": [math.exp(mean - half), math.exp(mean + half)], "rounds": len(logs)}


def row_subset(row: dict[str, Any], columns: tuple[str, ...]) -> dict[str, Any]:
    return {c: row.get(c) for c in columns}


ROW_COLUMNS = ("status", "error", "compile_s", "compile_status", "throughput_tok_s", "ttft_s", "tpot_s",
               "energy_per_token_j", "mbu", "mfu", "peak_memory_bytes", "n_iterations", "duration_s")


# -- the result record --------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]
# Where no git checkout is at hand (a device machine gets the working tree without .git),
# the commit can be passed in: SWEEPER_COMMIT=$(git rev-parse HEAD) where the tree came from.
COMMIT_ENV = "SWEEPER_COMMIT"
# Distributions whose versions a record carries (absent ones are null).
VERSIONED = ("torch", "transformers", "accelerate", "bitsandbytes", "vllm", "ray",
             "nvidia-ml-py", "zeus", "numpy", "matplotlib")

_command: list[str] | None = None
_started: str | None = None
_header: dict[str, Any] | None = None


def _utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def start_command(argv: list[str]) -> None:
    """Note the command line (``python -m bench`` and its arguments) and the time it started."""
    global _command, _started, _header
    _command = [Path(sys.executable).name, "-m", "bench", *argv]
    _started = _utc_now()
    _header = None


def git_commit(root: Path = ROOT) -> tuple[str | None, bool | None]:
    """``SWEEPER_COMMIT`` where set (dirty unknown): the lent GPU machines get a copy of the
    working tree whose git metadata may name an older commit than the one the tree is;
    else HEAD's commit and whether the working tree differs from it; (None, None) where
    neither says."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV], None
    try:
        top, head = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=root, capture_output=True,
                                   text=True, timeout=30, check=True).stdout.split()
        if Path(top).resolve() == root.resolve():  # not a checkout that merely contains this copy
            status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                    capture_output=True, text=True, timeout=60, check=True).stdout
            return head, bool(status.strip())
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return os.environ.get(COMMIT_ENV) or None, None


def gpu_names() -> list[str]:
    """The GPUs this process sees: through torch where it is imported (CUDA_VISIBLE_DEVICES
    applies), otherwise every GPU NVML lists; [] where there are none."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None:
            if not torch.cuda.is_available():
                return []
            return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        import pynvml

        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # no driver, no NVML: a CPU machine
        return []


def versions() -> dict[str, str | None]:
    from actors.environment import torch_cuda_version
    from sweeper.core.version import __version__

    out: dict[str, str | None] = {"python": platform.python_version(), "sweeper": __version__}
    out.update({name: version(name) for name in VERSIONED})
    out["driver"] = driver_version()
    out["cuda"] = torch_cuda_version()
    return out


def record_header(name: str) -> dict[str, Any]:
    """Everything a record says besides its results (the command's, built once per process)."""
    global _header
    if _header is None:
        commit, dirty = git_commit()
        _header = {"command": _command if _command is not None else [Path(sys.executable).name, *sys.argv],
                   "commit": commit, "dirty": dirty, "date": _started or _utc_now(),
                   "device": {"gpus": gpu_names(), "cpu": cpu_model()}, "versions": versions()}
    return {"bench": name, **_header}


def write_record(path: str | Path, name: str, results: Any, *, quiet: bool = False) -> None:
    """Write ``results`` of bench ``name`` to ``path`` as one record (see the module's docstring).

    Benches that save as they go call this after every step: each call rewrites the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**record_header(name), "results": results}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(path)  # a run cut mid-write keeps the previous, whole record
    if not quiet:
        print(f"wrote {path}", flush=True)


def read_results(path: str | Path) -> Any:
    """The results of a record written by :func:`write_record`; a file from before the
    record format (docs/data holds some) is returned whole."""
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict) and "bench" in data and "results" in data:
        return data["results"]
    return data
