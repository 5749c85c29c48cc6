"""What a result row must say about where it was measured."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
import socket
import sys
from pathlib import Path

from sweeper.core.results import Environment
from sweeper.core.version import __version__


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


_CUDA_LINE = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*['"]([^'"]+)['"]""", re.M)


def parse_torch_cuda_version(version_py: str) -> str | None:
    """``torch.version.cuda`` from the text of torch/version.py (None: a CPU build)."""
    match = _CUDA_LINE.search(version_py)
    return match.group(1) if match else None


def torch_cuda_version() -> str | None:
    """The CUDA version torch was built with, without importing torch when it is not
    imported yet: that import costs a second or more of every actor's start, and
    backends that need no torch (noop) should not pay it."""
    if "torch" in sys.modules:
        return sys.modules["torch"].version.cuda
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    return parse_torch_cuda_version(text)


def cpu_model() -> str:
    """The host CPU's model name (``/proc/cpuinfo``), or what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def capture() -> Environment:
    """The process's node and software (the device and GPUs are the load's and telemetry's)."""
    node_id = gpu_ids = None
    try:
        import ray

        if ray.is_initialized():
            node_id = ray.get_runtime_context().get_node_id()
            # Node-local ids, logical or real: what proves no two trials shared a GPU.
            gpu_ids = ",".join(str(i) for i in ray.get_gpu_ids()) or None
    except ImportError:
        pass
    return Environment(
        torch_version=_version("torch"), transformers_version=_version("transformers"),
        accelerate_version=_version("accelerate"), bitsandbytes_version=_version("bitsandbytes"),
        vllm_version=_version("vllm"), ray_version=_version("ray"), python_version=platform.python_version(),
        # Our own version, not the index's: a distribution named "sweeper" there is another project.
        sweeper_version=__version__, hostname=socket.gethostname(), cuda_version=torch_cuda_version(),
        ray_node_id=node_id, ray_gpu_ids=gpu_ids,
    )
