"""A trial's run: its outcome, what its group's model load gave it, what preparing its shape
cost, and where it ran."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sweeper.core.results.part import Part, column


@dataclass(frozen=True)
class Outcome(Part):
    """Whether the trial produced its numbers, why not, and when it ran."""

    status: str | None = column("ok | failed | skipped")
    reason: str | None = column(
        "machine-readable cause for failed/skipped (null when ok): unsupported | predicted_oom | oom | "
        "exception | load_failed | load_timeout | actor_died | timeout | layer_profile_failed | "
        "invalid_row (sweeper.core.status.Reason says when each is used)")
    error: str | None = column("error text for failed/skipped trials")
    started_at: datetime | None = column("trial start (UTC)")
    finished_at: datetime | None = column("trial end (UTC)")


@dataclass(frozen=True)
class Setup(Part):
    """What the group's model load gave every trial of the group: its time, its weights' memory
    and the GPUs' idle power before it."""

    load_s: float | None = column("model load time of the trial's group (shared by its trials, not in duration_s)")
    weight_memory_bytes: int | None = column(
        "model footprint after loading and quantizing: parameters, buffers and quantization state (int8 "
        "row scales, 4-bit absmax)")
    pre_load_idle_power_w: float | None = column(
        "the same GPUs' settled idle power before the group's model loaded (no context of ours on them): "
        "the untouched GPU, for comparison with idle_power_w")


@dataclass(frozen=True)
class ServerSetup(Part):
    """The server a ``server`` backend's load launched or reached, the same for every trial of
    the load (null throughout for in-process backends)."""

    server_engine: str | None = column(
        "server backend: the server measured (vllm | sglang | transformers: launched by sweeper; a "
        "command's program; an external server's base_url); null for in-process backends")
    server_version: str | None = column(
        "server backend: the engine's version as the server reports it (vLLM: GET /version), else the "
        "installed engine's")
    server_command: str | None = column(
        "server backend: the command line sweeper launched the server with (null: base_url)")
    server_url: str | None = column("server backend: the OpenAI-compatible base URL requests went to")
    server_log: str | None = column("server backend: the launched server's log file, on the node that ran it")
    server_ready_s: float | None = column(
        "server backend: seconds from the launch until the server first answered GET /v1/models (part of "
        "load_s)")


@dataclass(frozen=True)
class Compile(Part):
    """What preparing the trial's shape cost, outside the measured window."""

    compile_s: float | None = column(
        "one-time compilation for the trial's shape (torch.compile of the decode step, CUDA-graph "
        "capture): what the first generate calls took beyond as many steady-state calls, outside "
        "duration_s; a shape an earlier trial on the same actor compiled repeats that value; null: "
        "nothing compiled for the trial")
    compile_status: str | None = column(
        "compiled (with notes: graph breaks, skipped CUDA graphs) | eager (not requested) | fallback: why "
        "the trial ran eager instead; null: the backend has no compiled path")


@dataclass(frozen=True)
class Environment(Part):
    """Where the trial ran: the device, the held GPUs, the software and the node."""

    device: str | None = column("cuda | cpu")
    device_name: str | None = column("GPU (or CPU) model name")
    gpu_uuids: str | None = column("UUIDs of the GPUs the trial held, comma-separated")
    gpu_names: str | None = column("names of the GPUs the trial held, comma-separated")
    gpu_power_limit_w: float | None = column("sum of the held GPUs' power limits")
    driver_version: str | None = column("NVIDIA driver version")
    cuda_version: str | None = column("CUDA version torch was built with")
    torch_version: str | None = column("torch version on the worker")
    transformers_version: str | None = column("transformers version on the worker")
    accelerate_version: str | None = column("accelerate version on the worker")
    bitsandbytes_version: str | None = column("bitsandbytes version on the worker")
    vllm_version: str | None = column("vllm version on the worker")
    ray_version: str | None = column("ray version on the worker")
    python_version: str | None = column("Python version on the worker")
    sweeper_version: str | None = column("sweeper version on the worker")
    hostname: str | None = column("worker host name")
    ray_node_id: str | None = column("Ray node id of the worker")
    ray_gpu_ids: str | None = column(
        "GPU ids Ray assigned the trial's actor on its node (ray.get_gpu_ids()), comma-separated; null: "
        "none")
    energy_unmetered_reason: str | None = column(
        "why every energy column is null (no GPU; an external server whose GPUs the sweep does not "
        "locate); null where energy was metered")
