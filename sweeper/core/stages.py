"""Where a sweep's time goes: the stages an actor passes through, one registry.

An actor times each stage on its own clock and sends the spans back with its
load and with each trial (``StageSpan``); the driver writes them to the
``stages`` table with the placement they ran on. Stages are timed exclusively:
a stage inside another (weights materialised inside a load) pauses the outer
one, so a placement's spans never overlap and their sum is the time its GPU
(or, CPU-only, its node) was held for that work. What is left of the slots'
wall time is ``idle``: an actor queued or starting, the driver's round trips,
a slot with no group left to run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

Scope = Literal["group", "trial"]


@dataclass(frozen=True)
class Stage:
    name: str
    scope: Scope  # group: once per loaded model (recorded with the group's first trial); trial: every trial
    doc: str


_STAGES = (
    Stage("actor_start", "group", "the actor's process started and imported the data plane (before its first call)"),
    Stage("close", "group", "an actor handed on from the previous group releasing that group's model first "
                            "(a vLLM engine: its processes ended and gone)"),
    Stage("pre_load_idle", "group", "the untouched GPU's idle power, measured before the model loads"),
    Stage("reference", "group", "the fidelity reference step (its own model, loaded and released)"),
    Stage("materialize", "group", "weights or a checkpoint built on the node's disk (synthetic weights, the "
                                  "bundled model's conversion), or waiting for another actor building them"),
    Stage("load", "group", "the backend's model load (engine start, weights to the device), materialisation and "
                           "the engine phases below apart"),
    # A vLLM engine's start, read from its log (actors/backends/vllm/start.py), in the load:
    Stage("engine_start", "group", "vLLM: engine processes spawned, imports, device and distributed init"),
    Stage("weights", "group", "vLLM: the model built and its weights loaded (or dummy-initialised)"),
    Stage("engine_compile", "group", "vLLM: torch.compile (Dynamo and Inductor, or graphs loaded from the "
                                     "compile cache) in the engine's first profiling run"),
    Stage("kv_cache", "group", "vLLM: the rest of the memory-profiling run, the KV cache sized and allocated"),
    Stage("cuda_graphs", "group", "vLLM: CUDA-graph capture for the captured step sizes"),
    Stage("engine_warmup", "group", "vLLM: the engine's warm-up after capture (kernels compiled or autotuned on "
                                    "first use), until it reports ready"),
    Stage("compile", "trial", "compilation or graph capture for the trial's shape"),
    Stage("warmup", "trial", "unrecorded warm-up calls"),
    Stage("idle_baseline", "trial", "the GPU settling after the warm-up, then its idle baseline window"),
    Stage("measure", "trial", "the measured window (serving: the whole request schedule)"),
    Stage("fidelity", "trial", "the group's fidelity and perplexity pass (once per loaded model)"),
    Stage("layer_pass", "trial", "the layer-profiling pass, after the window"),
    Stage("likelihood", "trial", "multiple choice scored by each choice's likelihood (once per loaded model and "
          "prompt set), after the window"),
    Stage("harness", "trial", "the rest of the actor's trial call: prompts, rows, energy attribution"),
)
STAGES: dict[str, Stage] = {s.name: s for s in _STAGES}

# The time a slot held nothing the stages name: not a stage anyone times, the remainder.
IDLE = "idle"
IDLE_DOC = ("slot time no stage accounts for: an actor queued for its GPU or starting up, the driver's "
            "round trips between trials, a slot with no group left to run")


@dataclass(frozen=True)
class StageSpan:
    """One uninterrupted piece of a stage on an actor (a stage paused by a nested one is two pieces)."""

    stage: str
    started_at: datetime  # wall clock, UTC
    duration_s: float

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise KeyError(f"unknown stage {self.stage!r}; known: {', '.join(STAGES)}")


def stage_seconds(spans: list[StageSpan]) -> dict[str, float]:
    """Seconds per stage, in the registry's order (stages with no span left out)."""
    totals: dict[str, float] = {}
    for span in spans:
        totals[span.stage] = totals.get(span.stage, 0.0) + span.duration_s
    return {name: totals[name] for name in STAGES if name in totals}
