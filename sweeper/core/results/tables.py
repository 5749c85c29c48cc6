"""The rows of the per-trial tables beside ``requests``: stages, layers and the timeline.

Each is a typed record whose fields are its table's columns (``sweeper.core.schema`` generates
the schema and docs/SCHEMA.md from them, as for trials and requests), made whole by its one
producer: ``StageRecord`` by the recorder from an actor's stage spans, ``LayerRecord`` by the
layer-profiling pass. ``TimelineSample`` only declares the stored timeline: the telemetry
sampler keeps its samples column-wise in a compact buffer of its own (``TIMELINE_SCHEMA``:
narrower integers, thousands of samples a trial, never one object each), which the results
directory casts to this schema when the shard is written (``sweeper.run.shards``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sweeper.core.results.part import Part, column
from sweeper.core.stages import STAGES, StageSpan


@dataclass(frozen=True, kw_only=True)
class StageRecord(Part):
    """A span of time an actor spent in one stage (``sweeper.core.stages``)."""

    trial_id: str = column("trial the span is recorded with (a group's stages: with the first trial recorded after "
                           "its load)", required=True)
    stage: str = column(" | ".join(STAGES) + " (sweeper/core/stages.py says what each holds and its scope)",
                        required=True)
    scope: str = column("group (once per loaded model) | trial", required=True)
    started_at: datetime = column("when the span began (the actor's clock, UTC)", required=True)
    duration_s: float = column("the span's length; stages are timed exclusively (a stage nested in another pauses "
                               "it), so one slot's spans never overlap", required=True)
    node: str | None = column("the node it ran on (host:ray-node-id prefix)")
    gpu_ids: str | None = column("node-local GPU ids the actor held, comma-separated; null: a CPU-only node")

    @classmethod
    def of_span(cls, span: StageSpan, trial_id: str, node: str | None, gpu_ids: str | None) -> StageRecord:
        """An actor's span as a row, placed where it ran."""
        return cls(trial_id=trial_id, stage=span.stage, scope=STAGES[span.stage].scope, started_at=span.started_at,
                   duration_s=span.duration_s, node=node, gpu_ids=gpu_ids)


@dataclass(frozen=True, kw_only=True)
class LayerRecord(Part):
    """One module's time and energy in one phase of the layer-profiling pass."""

    trial_id: str = column("trial the profiling pass belongs to", required=True)
    module: str = column("qualified module name in the model (e.g. model.layers.3.self_attn; the root model: '')",
                         required=True)
    module_type: str = column(
        "role: decoder_block | attention | mlp | norm | embedding | rotary_embedding | final_norm | lm_head | "
        "other (leaf modules: the role of the unit they sit in); <role>_rest (decoder_block_rest, model_rest, "
        "...): what a module holding profiled modules runs outside them (residual adds, mask set-up), so a "
        "phase's rows cover the whole forward", required=True)
    layer_index: int | None = column("decoder block index, null for modules outside the blocks")
    phase: str = column("prefill (forwards over the prompt) | decode (one-token forwards)", required=True)
    calls: int = column("forward calls of the module in this phase over the whole pass", required=True)
    gpu_time_s: float = column(
        "the module's time over the whole pass, as gpu_time_method says; on CUDA the summed duration of the GPU "
        "kernels (and memcpy/memset) launched inside its forward, idle gaps between them excluded", required=True)
    gpu_time_method: str | None = column(
        "cuda_kernel_time (torch.profiler/CUPTI kernel durations, the CUDA default) | host_clock (CPU runs: "
        "synchronous there) | cpu_op_time (the profiler's CPU op durations, a kernel-time pass run on a CPU)")
    time_share: float | None = column("gpu_time_s / the phase's summed gpu_time_s over all its rows (rests included)")
    energy_j: float | None = column("energy attributed to the module in this phase (null on CPU-only runs)")
    method: str | None = column(
        "energy attribution method: gpu_time_share_of_phase_energy | gpu_time_share_of_window_energy")


@dataclass(frozen=True, kw_only=True)
class TimelineSample(Part):
    """One NVML sample of one GPU during a trial (the sampler's table, column-wise)."""

    trial_id: str = column("trial the sample belongs to", required=True)
    t_s: float = column("seconds from the start of the measured window (negative: idle baseline)", required=True)
    gpu_index: int = column("NVML (physical) index of the GPU", required=True)
    gpu_uuid: str = column("GPU UUID", required=True)
    power_w: float | None = column("instantaneous power")
    energy_mj: float | None = column("NVML total-energy counter (raw, mJ since driver load)")
    util_gpu_pct: float | None = column("GPU utilisation")
    memory_used_bytes: int | None = column("device memory used (whole GPU)")
    sm_clock_mhz: float | None = column("SM clock")
    temperature_c: float | None = column("GPU temperature")
    phase: str | None = column(
        "offline: prefill | decode when the sample falls in a generate call's phase, else null; serving: ramp | "
        "steady | drain (the run's steady-state window and either side)")
