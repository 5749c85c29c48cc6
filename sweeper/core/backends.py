"""The backend registry: the one place that knows backends by name.

Each entry says which precisions and devices the backend runs, which Python
modules its worker needs, how its sweep-file options are validated, and where
its data-plane implementation lives (imported inside the actor only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from sweeper.core.precisions import PRECISIONS
from sweeper.core.servers import ServerOptions


class TransformersOptions(BaseModel):
    """Options of the ``transformers`` backend (``backend_options.transformers``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    # The fast path: a static KV cache and torch.compile of the decode
    # step; compile time is recorded as compile_s, outside the measured window.
    compile: bool = False
    compile_mode: Literal["reduce-overhead", "max-autotune", "default"] = "reduce-overhead"
    # bitsandbytes 4-bit: quantize the quantization constants too (QLoRA's
    # double quantization, ~0.37 bits/weight less).
    bnb_double_quant: bool = False
    # Serving mode: most requests transformers' continuous-batching manager runs in one
    # step (None: its own default, sized from free memory).
    max_batch_requests: int | None = Field(None, gt=0, le=65536, strict=True)

    def unsupported_workload(self, varied_prompts: bool, varied_outputs: bool) -> str | None:
        if self.compile and (varied_prompts or varied_outputs):
            return ("compile: true compiles the decode step of one batch shape (every prompt input_len, "
                    "every reply exactly output_len); a dataset's prompts and natural or reference lengths "
                    "vary (run them eager)")
        return None

    def unsupported_serving(self) -> str | None:
        if self.compile:
            return ("compile: true compiles model.generate's static-cache decode step; serving mode runs "
                    "transformers' continuous-batching manager, which that does not apply to")
        return None


class NoopOptions(BaseModel):
    """Options of the ``noop`` backend (``backend_options.noop``): simulated costs, no model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Seconds per generated token after the first (one decode step of the whole batch).
    step_s: float = Field(0.01, ge=0)
    # Seconds until the first token (prefill); None: one step_s.
    prefill_s: float | None = Field(None, ge=0)
    # Each offline generate call's step times scaled by a factor drawn uniformly from
    # [1 - step_jitter, 1 + step_jitter] (seeded): a noisy trial, on any machine.
    step_jitter: float = Field(0.0, ge=0, lt=1)
    # Seconds a model load takes (sleeps), to measure what loads cost a sweep.
    load_s: float = Field(0.0, ge=0)
    # Batch sizes at or above this fail as out of memory, to exercise OOM handling.
    oom_batch_size: int | None = Field(None, gt=0)
    # Serving mode's simulated engine: most requests in one step (a step admits waiting
    # requests up to this, prefills them in prefill_s, then each running request gets a
    # token per step_s).
    max_batch: int = Field(256, gt=0, le=65536, strict=True)
    # Serving mode's simulated prefix cache, in blocks of this many tokens (None: none): each
    # request's cached_tokens are the leading blocks an earlier prompt held, and a step that
    # admits requests lasts prefill_s times the share of their prompt tokens not cached (at
    # least step_s): what prefix caching saves, on any machine.
    prefix_block: int | None = Field(None, gt=0, le=4096, strict=True)
    # Every generate call waits until this file exists: holds a trial mid-run until a
    # test (or an operator) releases it, so interrupts and node losses land mid-trial
    # by construction rather than by timing.
    gate_file: str | None = None


class SpeculativeOptions(BaseModel):
    """Speculative decoding (``backend_options.vllm.speculative``): a drafter proposes tokens
    that the model checks in one step, accepting the longest run it would have produced itself.
    n-gram prompt lookup needs no draft model: it proposes what followed the last n tokens
    where they occurred earlier in the sequence. Its acceptance depends on the text, so on a
    synthetic (random-weight) model it means nothing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Literal["ngram"] = "ngram"
    # Tokens proposed per step (and at most accepted per step, besides the model's own).
    num_speculative_tokens: int = Field(gt=0, le=32, strict=True)
    # The longest and shortest n-gram looked up in the sequence so far.
    prompt_lookup_max: int = Field(4, gt=0, le=64, strict=True)
    prompt_lookup_min: int | None = Field(None, gt=0, le=64, strict=True)

    @field_validator("prompt_lookup_min")
    @classmethod
    def _at_most_max(cls, value: int | None, info: ValidationInfo) -> int | None:
        high = info.data.get("prompt_lookup_max")
        if value is not None and high is not None and value > high:
            raise ValueError(f"must be at most prompt_lookup_max ({high})")
        return value

    def engine_config(self) -> dict[str, Any]:
        """vLLM's ``speculative_config`` (``LLM(speculative_config=...)``, ``--speculative-config``)."""
        return self.model_dump(exclude_none=True)


class VllmOptions(BaseModel):
    """Options of the ``vllm`` backend (``backend_options.vllm``): engine arguments of ``vllm.LLM``.

    None leaves vLLM's own default, which depends on the GPU and the vLLM version.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Share of each GPU's memory the engine may take (weights, activations, KV cache).
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    # Most sequences in one engine step; a trial's batch above it queues.
    max_num_seqs: int | None = Field(None, gt=0, le=65536, strict=True)
    # Most tokens in one engine step (prefill chunks included).
    max_num_batched_tokens: int | None = Field(None, gt=0, strict=True)
    # Context limit; None: the model's (the KV cache must hold one such sequence).
    max_model_len: int | None = Field(None, gt=0, strict=True)
    # True: no CUDA graphs and no torch.compile (slower decode, faster start).
    enforce_eager: bool = False
    # Off for measurement: random prompts share no prefix, but the cache's
    # bookkeeping is still work the numbers should not carry unless asked.
    enable_prefix_caching: bool = False
    enable_chunked_prefill: bool | None = None
    kv_cache_dtype: Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2"] = "auto"
    block_size: Literal[8, 16, 32, 64, 128] | None = None
    # The step sizes (tokens per engine step) the engine captures CUDA graphs for at start:
    # "engine": vLLM's own list (1, 2, 4, 8, 16 ... 512, about 50 sizes); "trials": the
    # steps the group's offline trials run (each batch's decode steps and its prefill),
    # where they are known in advance, else vLLM's list; or the sizes themselves. A step of
    # another size runs on the next larger captured graph, above the largest without one.
    # "engine" by default: on an H200 "trials" saved 1-2 s of a 40-80 s start, and one of
    # three paired runs measured its batch-32 throughput 21 % lower (docs/BENCHMARKS.md §17).
    cudagraph_capture_sizes: Literal["engine", "trials"] | tuple[Annotated[int, Field(gt=0)], ...] = "engine"
    # Where the offline engine's core (its scheduler and step loop) runs: "process", a process of
    # its own that the actor talks to over sockets (vLLM's default), or "actor", in the actor's
    # own process (VLLM_ENABLE_V1_MULTIPROCESSING=0), which saves spawning and connecting that
    # process at every engine start. Offline mode only: vLLM's AsyncLLM always runs it apart.
    engine_core: Literal["process", "actor"] = "process"
    # Speculative decoding (None: off). The row records its acceptance from vLLM's own counters.
    speculative: SpeculativeOptions | None = None

    def speculates(self) -> bool:
        return self.speculative is not None

    def releases_gpu_on_close(self) -> bool:
        """Whether closing the engine leaves the actor's process holding nothing on its GPUs:
        only when the engine core and workers run in processes of their own, which end with
        it; in the actor's process they leave a CUDA context behind."""
        return self.engine_core == "process"

    def unsupported_serving(self) -> str | None:
        if self.engine_core == "actor":
            return ("engine_core: actor runs the offline engine's core in the actor's process; serving mode's "
                    "AsyncLLM always runs it in a process of its own")
        return None

    def unsupported_shape(self, input_len: int, output_len: int) -> str | None:
        """Why a trial of this shape cannot run with these options, or None."""
        if self.max_model_len is not None and input_len + output_len > self.max_model_len:
            return (f"input_len + output_len = {input_len + output_len} exceeds "
                    f"backend_options.vllm.max_model_len = {self.max_model_len}")
        return None

    @field_validator("max_num_batched_tokens")
    @classmethod
    def _holds_a_step(cls, value: int | None, info: ValidationInfo) -> int | None:
        seqs = info.data.get("max_num_seqs")
        if value is not None and seqs is not None and value < seqs:
            raise ValueError(f"must be at least max_num_seqs ({seqs}): each running sequence "
                             "needs a token in every step")
        return value


@dataclass(frozen=True)
class BackendSpec:
    name: str
    impl: str  # "module:Class" of the data-plane implementation
    precisions: frozenset[str]
    devices: frozenset[str]
    requires: tuple[str, ...]  # modules the worker must be able to import
    options: type[BaseModel]
    layer_hooks: bool  # whether per-layer forward hooks can observe its model
    # Largest tensor-parallel degree it runs (1: one GPU per trial).
    max_tensor_parallel: int = 1
    # Whether it runs serving mode (requests arriving over time, its own batching).
    serving: bool = False
    # Why a precision it lacks is missing, where that helps the reader: (precision, why).
    precision_notes: tuple[tuple[str, str], ...] = ()
    # Whether it runs the model (noop simulates one: its replies end where it draws them to).
    runs_model: bool = True
    # Whether it returns full next-token distributions for the fidelity pass (else top-k only).
    full_logprobs: bool = False
    # Whether an actor that has closed this backend may load the next group in the same
    # process (imports done, its GPU already held): the backend's close() must give back
    # every byte of device memory and every child process it made.
    reuses_actor: bool = False
    # Whether its model runs in the actor's own process, which then holds a CUDA context on its
    # GPU for as long as the process lives.
    context_in_actor: bool = False
    # Whether its engine runs in processes of its own that read the GPU's memory as theirs (vLLM
    # sizes its KV cache from what is free): such a group is never loaded by an actor that holds
    # a context from an earlier group, which would sit on the GPU beside the engine.
    engine_in_processes: bool = False
    # Whether it runs offline mode (static batches of generate calls); a server does not.
    offline: bool = True
    # Whether its load starts an engine or a server (a minute or more on a GPU: processes,
    # compilation, CUDA graphs) rather than reading weights (seconds). Such groups are started
    # first, so that quick groups fill the GPUs around them instead of delaying them to the end
    # of the sweep (docs/BENCHMARKS.md §20: a packed grid's last vLLM group queued behind two
    # quick transformers groups while three GPUs were free).
    slow_start: bool = False

    def default_options(self) -> BaseModel:
        return self.options()

    def reuses_actor_with(self, options: BaseModel | None) -> bool:
        """Whether an actor that closed this backend, run with these options, may load the next
        group: the backend allows it and the options leave nothing on the GPU (options models
        that can keep the GPU define ``releases_gpu_on_close``)."""
        release = getattr(options, "releases_gpu_on_close", None)
        return self.reuses_actor and (release is None or release())

    def unsupported_shape(self, options: BaseModel, input_len: int, output_len: int) -> str | None:
        """Why a trial of this shape cannot run with these options (options models that
        know their limits define ``unsupported_shape``), or None."""
        check = getattr(options, "unsupported_shape", None)
        return check(input_len, output_len) if check is not None else None

    def unsupported_workload(self, options: BaseModel, *, varied_prompts: bool, varied_outputs: bool,
                             stops_at_eos: bool, synthetic_model: bool) -> str | None:
        """Why prompts of varying length (a dataset) or replies of varying length (natural,
        reference) cannot run with these options, or None."""
        if stops_at_eos and synthetic_model and self.runs_model:
            return ("output_len: natural stops where the model ends its reply, and a synthetic "
                    "(random-weight) model never does: every reply would be max_output_len long; use a real "
                    "model, output_len: reference, or an exact length")
        check = getattr(options, "unsupported_workload", None)
        return check(varied_prompts, varied_outputs) if check is not None else None

    def unsupported_serving(self, options: BaseModel) -> str | None:
        """Why a serving-mode trial cannot run on this backend with these options, or None."""
        if not self.serving:
            return f"backend {self.name} has no serving mode"
        check = getattr(options, "unsupported_serving", None)
        return check() if check is not None else None

    def required_modules(self, options: BaseModel) -> tuple[str, ...]:
        """Modules the worker must import for these options (options models that launch
        something define ``required_modules``)."""
        extra = getattr(options, "required_modules", None)
        return self.requires + (extra() if extra is not None else ())

    def install_hint(self, options: BaseModel) -> str | None:
        """How to install the modules these options need beyond the backend's own, if they say."""
        hint = getattr(options, "install_hint", None)
        return hint() if hint is not None else None

    def holds_gpus(self, options: BaseModel) -> bool:
        """Whether the trial's actor holds GPUs (a client of an external server does not)."""
        return bool(getattr(options, "holds_gpus", True))

    def actor_env(self, options: BaseModel) -> tuple[str, ...]:
        """Names of the driver's environment variables the trial's actor needs (passed with its
        load call, never stored or logged): an external server's key."""
        names = getattr(options, "actor_env", None)
        return names() if names is not None else ()

    def secret_values(self, options: BaseModel | None) -> tuple[str, ...]:
        """Values in these options that no text may show (a launched server's ``--hf-token``):
        the actor redacts them from every error it reports or logs, whatever raised it."""
        values = getattr(options, "secret_flag_values", None)
        return values() if values is not None else ()

    def ray_resources(self, options: BaseModel) -> dict[str, float]:
        """Extra Ray resources the trial's actor needs (e.g. a node to run on)."""
        extra = getattr(options, "ray_resources", None)
        return extra() if extra is not None else {}

    def unsupported_reason(self, precision: str, device: str, tensor_parallel: int = 1,
                           options: BaseModel | None = None) -> str | None:
        check = getattr(options, "unsupported_precision", None)
        if check is not None and (reason := check(precision, device, tensor_parallel)):
            return reason
        if precision not in self.precisions:
            why = dict(self.precision_notes).get(precision)
            return f"backend {self.name} does not support precision {precision}" + (f": {why}" if why else "")
        if device not in self.devices:
            return f"backend {self.name} does not run on {device}"
        if tensor_parallel > self.max_tensor_parallel:
            return (f"backend {self.name} runs tensor_parallel <= {self.max_tensor_parallel}, "
                    f"not {tensor_parallel}")
        if tensor_parallel > 1 and device != "cuda":
            return f"tensor_parallel {tensor_parallel} needs GPUs"
        return None


# vLLM 0.26 quantizes bitsandbytes 4-bit only while reading real weight files
# (its bitsandbytes loader; load_format="dummy" gives it none) and runs 8-bit only
# from pre-quantized checkpoints, so neither is the in-flight format sweeper
# compares across backends.
_VLLM_NO_BNB = ("vLLM quantizes bitsandbytes formats only while reading real weight files "
                "(4-bit) or from pre-quantized checkpoints (8-bit), not in flight from a synthetic model")


BACKENDS: dict[str, BackendSpec] = {
    b.name: b
    for b in [
        BackendSpec(
            name="transformers",
            impl="actors.backends.transformers.eager:TransformersBackend",
            precisions=frozenset({"fp32", "fp16", "bf16", "int8", "nf4", "fp4"}),
            devices=frozenset({"cuda", "cpu"}),
            requires=("torch", "transformers"),
            options=TransformersOptions,
            layer_hooks=True,
            serving=True,
            full_logprobs=True,
            reuses_actor=True,
            context_in_actor=True,
        ),
        # No model: generate sleeps. Measures the harness and scheduler themselves.
        BackendSpec(
            name="noop",
            impl="actors.backends.noop:NoopBackend",
            precisions=frozenset(p.name for p in PRECISIONS.values() if p.quantization is None),
            devices=frozenset({"cuda", "cpu"}),
            requires=(),
            options=NoopOptions,
            layer_hooks=False,
            max_tensor_parallel=8,
            serving=True,
            runs_model=False,
            reuses_actor=True,
        ),
        # vLLM's offline engine; its model runs in engine processes, out of reach of hooks.
        BackendSpec(
            name="vllm",
            impl="actors.backends.vllm.backend:VllmBackend",
            precisions=frozenset({"fp16", "bf16", "fp8"}),
            devices=frozenset({"cuda"}),
            requires=("vllm",),
            options=VllmOptions,
            layer_hooks=False,
            max_tensor_parallel=8,
            serving=True,
            slow_start=True,
            # close() ends the engine's processes and waits until they are gone; the actor's
            # own process never touches the GPU unless engine_core: actor (releases_gpu_on_close).
            reuses_actor=True,
            engine_in_processes=True,
            precision_notes=tuple((p, _VLLM_NO_BNB) for p in ("int8", "nf4", "fp4")) + (
                ("fp32", "its fast attention kernels (FlashAttention, FlashInfer) have no fp32 path, "
                         "so an fp32 number would measure a fallback"),),
        ),
        # An OpenAI-compatible HTTP server, launched on the actor's GPUs or already running
        # (sweeper.core.servers); serving mode only. Which precisions and devices it runs
        # is its engine's business (ServerOptions.unsupported_precision).
        BackendSpec(
            name="server",
            impl="actors.backends.server.backend:ServerBackend",
            precisions=frozenset(PRECISIONS),
            devices=frozenset({"cuda", "cpu"}),
            requires=("aiohttp",),
            options=ServerOptions,
            layer_hooks=False,
            max_tensor_parallel=8,
            serving=True,
            offline=False,
            slow_start=True,
        ),
    ]
}
