"""What a result row must say about where it was measured."""

from __future__ import annotations

import importlib.metadata
import platform
import socket


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def capture() -> dict[str, str | None]:
    env: dict[str, str | None] = {
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "accelerate_version": _version("accelerate"),
        "bitsandbytes_version": _version("bitsandbytes"),
        "vllm_version": _version("vllm"),
        "ray_version": _version("ray"),
        "python_version": platform.python_version(),
        "sweeper_version": _version("sweeper"),
        "hostname": socket.gethostname(),
        "cuda_version": None,
        "ray_node_id": None,
        "ray_gpu_ids": None,
    }
    try:
        import torch

        env["cuda_version"] = torch.version.cuda
    except ImportError:
        pass
    try:
        import ray

        if ray.is_initialized():
            env["ray_node_id"] = ray.get_runtime_context().get_node_id()
            # Node-local ids, logical or real: what proves no two trials shared a GPU.
            env["ray_gpu_ids"] = ",".join(str(i) for i in ray.get_gpu_ids()) or None
    except ImportError:
        pass
    if env["sweeper_version"] is None:
        import sweeper

        env["sweeper_version"] = sweeper.__version__
    return env
