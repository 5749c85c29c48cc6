"""vLLM backend: one offline ``vllm.LLM`` engine per trial group.

What is measured how
--------------------
- A generate call submits the whole batch at once (``LLM.generate`` with prompt
  token ids, greedy, ``ignore_eos``, exactly ``output_len`` tokens) and returns
  when every request has finished: outputs exist only after the engine's GPU
  work for them is done, so the call itself is the synchronization. The engine
  runs in other processes; ``torch.cuda.synchronize`` here would wait for
  nothing, and ``sync`` is a no-op.
- Per-request times come from ``RequestOutput.metrics`` (vLLM's
  ``RequestStateStats``, present with ``disable_log_stats=False``):
  ``first_token_ts`` / ``last_token_ts`` are stamped by the engine core with
  ``time.monotonic()`` when the step that produced the token returned. On Linux
  CLOCK_MONOTONIC is one clock for every process of a host, so those stamps are
  on this actor's clock; ``request_timing`` checks that each lies inside the
  generate call and, if not, derives the times from what needs no shared clock
  (``first_token_latency`` from the request's wall-clock arrival, and
  ``last_token_ts - first_token_ts``). A request starts when the call starts,
  as in the transformers backend: queueing inside the engine is part of TTFT.
- Phase marks for energy: prefill runs from the call's start until the last
  request of the batch has its first token; decode is the rest. A batched engine
  may mix a late prefill chunk with early decode steps; such mixed steps count
  as prefill.
- Memory: vLLM reserves its memory when the engine starts (weights, the
  profiled activation peak, CUDA graphs, then KV cache up to
  ``gpu_memory_utilization``) and holds it. ``peak_memory_bytes`` is NVML's
  memory used on the trial's GPUs, i.e. that reservation, summed over them.
  ``weight_memory_bytes`` is the workers' own count of what loading the model
  took, summed over the tensor-parallel ranks: asked through a worker extension
  method called by name (``actors.backends.vllm.worker``), so no function is pickled across and
  ``VLLM_ALLOW_INSECURE_SERIALIZATION`` stays off.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from actors.backends.base import Backend, LoadInfo, ModelSpec
from actors.backends.speculation import SpeculationCounts
from actors.backends.vllm import start as vllm_start
from actors.backends.vllm.worker import WORKER_EXTENSION
from actors.records import Generation, PromptBatch, RequestTiming, TopK
from actors.serving.client import Follow
from actors.serving.records import ServedRun, ServingRequest
from sweeper.core.backends import VllmOptions
from sweeper.core.precisions import PRECISIONS
from sweeper.core.results import Compile
from sweeper.core.servers import TRITON_CACHE_DIR, VLLM_CACHE_DIR

log = logging.getLogger(__name__)

# vLLM's ``quantization=`` method for each registry quantization scheme it runs.
VLLM_QUANTIZATION = {"fp8": "fp8"}
# Below this compute capability vLLM still "runs" the method, on a different kernel
# (fp8: Marlin weight-only, bf16 matmuls), which is not the format being measured.
MIN_COMPUTE_CAPABILITY = {"fp8": (8, 9)}
# Engine stamps this far outside the generate call mean they are on another clock.
CLOCK_TOLERANCE_S = 1e-3
# An async engine's start (weights, compilation, CUDA graphs) may take this long.
SERVING_START_TIMEOUT_S = 1800.0
# vLLM's largest default capture size: a step above it runs without a CUDA graph whatever
# the list, so capturing it would cost start time for nothing.
MAX_DEFAULT_CAPTURE_TOKENS = 512
# Option fields passed through to ``vllm.LLM`` only when set (None: vLLM's default).
_OPTIONAL_ENGINE_ARGS = ("max_num_seqs", "max_num_batched_tokens", "max_model_len",
                         "enable_chunked_prefill", "block_size")


class VllmMetricsError(RuntimeError):
    """A ``RequestOutput`` lacks the per-request timing sweeper needs."""


class VllmCapabilityError(RuntimeError):
    """The worker's GPUs cannot run the trial's precision as that format."""


# -- engine arguments (pure) ------------------------------------------------------------------


def capture_sizes(options: VllmOptions, step_tokens: tuple[int, ...] | None) -> list[int] | None:
    """The CUDA-graph sizes the engine captures, or None: vLLM's own list.

    "trials" captures the steps the group runs (each batch's decode and its prefill, up to
    vLLM's largest default size): every step runs on a graph of its own size, exactly as
    under vLLM's list, without capturing the ~50 sizes the group never runs.
    """
    chosen = options.cudagraph_capture_sizes
    if options.enforce_eager or chosen == "engine":
        return None
    if chosen != "trials":
        return sorted(set(chosen))
    sizes = sorted({n for n in step_tokens or () if n <= MAX_DEFAULT_CAPTURE_TOKENS})
    return sizes or None


def engine_kwargs(*, model_path: str, precision: str, options: VllmOptions, tensor_parallel: int,
                  seed: int, dummy_weights: bool, hf_overrides: dict[str, Any] | None = None,
                  step_tokens: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments of one trial group."""
    p = PRECISIONS[precision]
    kwargs: dict[str, Any] = {
        "model": model_path, "dtype": p.torch_dtype, "seed": seed,
        "tensor_parallel_size": tensor_parallel,
        "gpu_memory_utilization": options.gpu_memory_utilization,
        "enforce_eager": options.enforce_eager,
        "enable_prefix_caching": options.enable_prefix_caching,
        "kv_cache_dtype": options.kv_cache_dtype,
        # Prompts are token ids and outputs are never detokenized: no tokenizer needed.
        "skip_tokenizer_init": True,
        # Per-request stats (RequestOutput.metrics) exist only with stats on.
        "disable_log_stats": False,
        # Methods the actor calls in each worker by name (weight memory).
        "worker_extension_cls": WORKER_EXTENSION,
    }
    if p.quantization is not None:
        if p.quantization not in VLLM_QUANTIZATION:
            raise ValueError(f"vLLM has no in-flight method for precision {precision} ({p.quantization})")
        kwargs["quantization"] = VLLM_QUANTIZATION[p.quantization]
    if dummy_weights:
        kwargs["load_format"] = "dummy"
    if tensor_parallel > 1:
        # Inside a Ray actor vLLM would otherwise pick its Ray executor and ask
        # Ray for GPUs this actor already holds; the mp executor uses them.
        kwargs["distributed_executor_backend"] = "mp"
    for name in _OPTIONAL_ENGINE_ARGS:
        value = getattr(options, name)
        if value is not None:
            kwargs[name] = value
    if options.speculative is not None:
        kwargs["speculative_config"] = options.speculative.engine_config()
    if hf_overrides:
        kwargs["hf_overrides"] = hf_overrides
    sizes = capture_sizes(options, step_tokens)
    if sizes is not None:
        kwargs["compilation_config"] = {"cudagraph_capture_sizes": sizes}
    return kwargs


def architecture_overrides(config: dict[str, Any]) -> dict[str, Any] | None:
    """``hf_overrides`` naming the model class when ``config.json`` names none.

    Synthetic presets are saved from ``AutoConfig.for_model``, which leaves
    ``architectures`` unset; vLLM picks its model class from that field.
    """
    if config.get("architectures"):
        return None
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type", ""))
    if arch is None:
        raise ValueError(f"config.json names no architectures and model_type {config.get('model_type')!r} "
                         "has no causal-LM class")
    return {"architectures": [arch]}


def capability_problem(precision: str, capabilities: Sequence[tuple[str, tuple[int, int]]]) -> str | None:
    """Why GPUs of these (name, compute capability) cannot run ``precision`` as itself, or None."""
    method = PRECISIONS[precision].quantization
    needed = MIN_COMPUTE_CAPABILITY.get(method) if method else None
    if needed is None:
        return None
    for name, cc in capabilities:
        if tuple(cc) < needed:
            return (f"precision {precision} needs compute capability >= {needed[0]}.{needed[1]} for "
                    f"{method} matmuls; {name} has {cc[0]}.{cc[1]} (vLLM would fall back to a "
                    "weight-only kernel, a different format)")
    return None


# -- result conversion (pure) ------------------------------------------------------------------


def request_timing(output: Any, *, t_start_s: float, t_end_s: float, output_len: int,
                   wall_minus_monotonic_s: float, stop_at_eos: bool = False,
                   keep_reply: bool = False) -> tuple[RequestTiming, str]:
    """One ``RequestOutput`` as a ``RequestTiming`` on this process's monotonic clock.

    Returns the timing and how it was placed on the clock: ``engine_clock``
    (the engine's monotonic stamps, checked to lie inside the call) or
    ``latency`` (wall-clock arrival + first-token latency, plus the engine's
    first-to-last interval). ``wall_minus_monotonic_s`` converts the former.
    """
    tokens = len(output.outputs[0].token_ids)
    reply = tuple(int(t) for t in output.outputs[0].token_ids) if keep_reply else None
    if tokens > output_len or (tokens != output_len and not stop_at_eos):
        raise RuntimeError(f"vLLM request {output.request_id} produced {tokens} tokens, expected {output_len}")
    prompt = getattr(output, "prompt_token_ids", None)
    prompt_tokens = len(prompt) if prompt is not None else None
    m = output.metrics
    if m is None:
        raise VllmMetricsError("RequestOutput.metrics is None: the engine must run with "
                               "disable_log_stats=False (vllm>=0.11 V1 engine)")
    first = float(getattr(m, "first_token_ts", 0.0) or 0.0)
    last = float(getattr(m, "last_token_ts", 0.0) or 0.0)
    lo, hi = t_start_s - CLOCK_TOLERANCE_S, t_end_s + CLOCK_TOLERANCE_S
    if 0.0 < first <= last and lo <= first and last <= hi:
        return RequestTiming(t_start_s, min(max(first, t_start_s), t_end_s),
                             min(max(last, t_start_s), t_end_s), tokens, prompt_tokens, reply), "engine_clock"
    latency = float(getattr(m, "first_token_latency", 0.0) or 0.0)
    arrival = float(getattr(m, "arrival_time", 0.0) or 0.0)
    if latency <= 0.0 or arrival <= 0.0:
        raise VllmMetricsError(f"vLLM request {output.request_id} has no first-token time "
                               f"(first_token_ts={first}, first_token_latency={latency})")
    t_first = min(max(arrival - wall_minus_monotonic_s + latency, t_start_s), t_end_s)
    t_last = t_first + (last - first) if 0.0 < first <= last else t_end_s
    return RequestTiming(t_start_s, t_first, min(max(t_last, t_first), t_end_s), tokens, prompt_tokens,
                         reply), "latency"


def generation_from_outputs(outputs: Sequence[Any], *, t_start_s: float, t_end_s: float,
                            output_len: int | Sequence[int], wall_minus_monotonic_s: float,
                            stop_at_eos: bool = False, keep_replies: bool = False) -> tuple[Generation, set[str]]:
    """The ``Generation`` of one ``LLM.generate`` call, and the clock placements used.
    ``output_len``: every request's, or one per request in order."""
    if not outputs:
        raise RuntimeError("vLLM returned no outputs")
    lens = [output_len] * len(outputs) if isinstance(output_len, int) else list(output_len)
    timed = [request_timing(o, t_start_s=t_start_s, t_end_s=t_end_s, output_len=n, stop_at_eos=stop_at_eos,
                            wall_minus_monotonic_s=wall_minus_monotonic_s, keep_reply=keep_replies)
             for o, n in zip(outputs, lens, strict=True)]
    requests = tuple(t for t, _ in timed)
    prefill_end = max(r.t_first_token_s for r in requests)
    return Generation(
        t_start_s=t_start_s, t_end_s=t_end_s, requests=requests,
        marks=(("prefill", t_start_s, prefill_end), ("decode", prefill_end, t_end_s)), static_batch=False,
    ), {how for _, how in timed}


def sampling_params(output_len: int, stop_at_eos: bool) -> Any:
    """Greedy; exactly ``output_len`` tokens (EOS ignored), or up to it, ending at EOS."""
    from vllm import SamplingParams

    if stop_at_eos:
        return SamplingParams(max_tokens=output_len, temperature=0.0, detokenize=False)
    return SamplingParams(max_tokens=output_len, min_tokens=output_len, ignore_eos=True,
                          temperature=0.0, detokenize=False)


# -- the backend ----------------------------------------------------------------------------


def _architecture(model_config: Any) -> dict[str, Any] | None:
    try:
        return model_config.hf_config.to_dict()
    except Exception as exc:  # the roofline columns are then null, the trial stands
        log.info("no architecture from vLLM's model config (%s: %s)", type(exc).__name__, exc)
        return None


def share_compile_cache() -> str:
    """Point vLLM's cache (its torch.compile artefacts, keyed by vLLM on the model, dtype,
    quantization and compilation settings) and Triton's kernel cache at one directory each per
    node under sweeper's cache, so that every group's engine on the node finds what an earlier
    one compiled (a warm start then rebuilds no kernel either), and wiping sweeper's cache wipes
    them too. A ``VLLM_CACHE_ROOT`` or ``TRITON_CACHE_DIR`` the user set is kept. The engine's
    processes inherit the environment, so it is set before the engine starts. Returns vLLM's."""
    from actors.models import cache_root

    os.environ.setdefault("TRITON_CACHE_DIR", str(cache_root() / TRITON_CACHE_DIR))
    return os.environ.setdefault("VLLM_CACHE_ROOT", str(cache_root() / VLLM_CACHE_DIR))


@contextlib.contextmanager
def engine_core_in(where: str) -> Iterator[None]:
    """vLLM's offline engine reads ``VLLM_ENABLE_V1_MULTIPROCESSING`` as it is built: set for the
    group's ``engine_core`` (actor: 0, process: 1) while it is, then as it was, since an actor
    handed on to another group must not carry this one's choice."""
    before = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if where == "actor" else "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = before


class VllmBackend(Backend):
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.llm: Any = None
        self.serving: Any = None  # serving.AsyncEngineRunner, in serving mode (instead of llm)
        self.clock = clock
        self.options = VllmOptions()
        self.max_model_len: int | None = None
        self._params: dict[tuple[int, bool], Any] = {}
        self._readers: list[Any] = []
        self._warned_clock = False

    def load(self, spec: ModelSpec) -> LoadInfo:
        share_compile_cache()
        # Before vLLM's first import in this process: every vLLM process reads it then.
        timing = vllm_start.install(vllm_start.engine_log_dir(), f"engine-{os.getpid()}")
        import vllm

        self.options = spec.options_as(VllmOptions)
        gpus = self._open_gpus()
        if spec.tensor_parallel > len(gpus):
            raise RuntimeError(f"tensor_parallel {spec.tensor_parallel} needs {spec.tensor_parallel} GPUs; "
                               f"this worker sees {len(gpus)}")
        problem = capability_problem(spec.precision, [(g.name, _compute_capability(g.uuid)) for g in gpus])
        if problem:
            raise VllmCapabilityError(problem)
        path, overrides = self._model_path(spec)
        dummy = spec.source == "synthetic"
        if dummy and spec.weights_on_disk:
            # The fidelity pass compares backends and precisions on one set of weights: the
            # seeded ones transformers reads too, not vLLM's own random ones.
            from actors.models import materialize_weights

            path, dummy = str(materialize_weights(spec.location, spec.seed)), False
        kwargs = engine_kwargs(
            model_path=path, precision=spec.precision, options=self.options,
            tensor_parallel=spec.tensor_parallel, seed=spec.seed,
            dummy_weights=dummy, hf_overrides=overrides, step_tokens=None if spec.serving else spec.step_tokens,
        )
        offset, started_s = vllm_start.size(timing), time.time()
        if spec.serving:
            from actors.backends.vllm.serving import AsyncEngineRunner

            log.info("AsyncLLM(%s)", kwargs)
            self.serving = AsyncEngineRunner(kwargs, start_timeout_s=SERVING_START_TIMEOUT_S)
            model_config = self.serving.model_config
        else:
            log.info("vllm.LLM(%s), engine core in the %s", kwargs, self.options.engine_core)
            with engine_core_in(self.options.engine_core):
                self.llm = vllm.LLM(**kwargs)
            engine = self.llm.llm_engine
            model_config = getattr(engine, "model_config", None) or engine.vllm_config.model_config
        vllm_start.carve_phases(vllm_start.read_phases(timing, offset, started_s, time.time()))
        self.max_model_len = int(model_config.max_model_len)
        self._params.clear()
        return LoadInfo(
            device="cuda", device_name=gpus[0].name, weight_memory_bytes=self._weight_memory_bytes(),
            vocab_size=int(model_config.get_vocab_size()),
            # The architecture the engine built, for the analytic roofline (mfu, mbu).
            architecture=_architecture(model_config),
            extra={"vllm_version": vllm.__version__, "engine_kwargs": kwargs},
        )

    def _open_gpus(self) -> list[Any]:
        from actors.telemetry.nvml import DeviceReader, resolve_gpus

        gpus = resolve_gpus()
        if not gpus:
            raise RuntimeError("the vllm backend needs a GPU and this worker sees none")
        self._readers = [DeviceReader(g) for g in gpus]
        return gpus

    @staticmethod
    def _model_path(spec: ModelSpec) -> tuple[str, dict[str, Any] | None]:
        if spec.source == "hub":
            return spec.location, None
        from actors.models import model_dir

        path = Path(model_dir(spec.source, spec.location))
        config = json.loads((path / "config.json").read_text())
        return str(path), architecture_overrides(config)

    def _weight_memory_bytes(self) -> int | None:
        try:
            per_rank = (self.serving.weight_memory_bytes() if self.serving is not None
                        else self.llm.collective_rpc("sweeper_weight_memory_bytes", timeout=60))
            return int(sum(per_rank))
        except Exception as exc:  # an engine without the extension's method: not a load failure
            log.warning("vLLM did not report its weight memory, weight_memory_bytes is null (%s: %s)",
                        type(exc).__name__, exc)
            return None

    def prepare(self, batch_size: int, input_len: int, output_len: int) -> Compile:
        # The engine compiles and captures CUDA graphs once, while loading (in load_s).
        return Compile(compile_status="eager (enforce_eager)" if self.options.enforce_eager
                           else "compiled (at engine start, in load_s)")

    def _sampling_params(self, output_len: int, stop_at_eos: bool = False) -> Any:
        key = (output_len, stop_at_eos)
        params = self._params.get(key)
        if params is None:
            params = sampling_params(output_len, stop_at_eos)
            self._params[key] = params
        return params

    def generate_batch(self, batch: PromptBatch) -> Generation:
        """Prompts of varying lengths and per-request output lengths in one ``LLM.generate``
        call (the engine batches them continuously: no padding, early finishers leave)."""
        uniform = batch.as_uniform()
        if uniform is not None:
            return self.generate(*uniform)
        params = [self._sampling_params(n, batch.stop_at_eos) for n in batch.output_lens]
        offset = time.time() - time.monotonic()
        t_start = self.clock()
        prompts = [{"prompt_token_ids": p.tolist()} for p in batch.prompts]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        t_end = self.clock()
        generation, _ = generation_from_outputs(outputs, t_start_s=t_start, t_end_s=t_end,
                                                output_len=batch.output_lens, stop_at_eos=batch.stop_at_eos,
                                                wall_minus_monotonic_s=offset, keep_replies=batch.keep_replies)
        return generation

    def generate(self, prompt_ids: np.ndarray, output_len: int) -> Generation:
        input_len = prompt_ids.shape[1]
        if self.max_model_len is not None and input_len + output_len > self.max_model_len:
            raise ValueError(f"input_len {input_len} + output_len {output_len} exceeds the engine's "
                             f"max_model_len {self.max_model_len} (backend_options.vllm.max_model_len)")
        params = self._sampling_params(output_len)
        offset = time.time() - time.monotonic()
        # As in the transformers backend, the requests start before their inputs are built.
        t_start = self.clock()
        # TokensPrompt is a TypedDict: a plain dict is the same object at runtime.
        prompts = [{"prompt_token_ids": row} for row in prompt_ids.tolist()]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        t_end = self.clock()
        generation, placements = generation_from_outputs(
            outputs, t_start_s=t_start, t_end_s=t_end, output_len=output_len, wall_minus_monotonic_s=offset)
        if "latency" in placements and not self._warned_clock:
            self._warned_clock = True
            log.warning("vLLM engine timestamps fell outside the generate call; request times are "
                        "derived from first-token latencies instead")
        return generation

    def sync(self) -> None:
        """Nothing to wait for: ``generate`` returns only once every output exists."""

    # -- scoring (fidelity pass): vLLM returns top-k log-probabilities, never full ones ---------
    def greedy_continuation(self, prompt_ids: np.ndarray, n: int) -> np.ndarray:
        if self.llm is None:
            raise NotImplementedError("vLLM's serving engine does not score (run fidelity offline)")
        outputs = self.llm.generate([{"prompt_token_ids": row} for row in prompt_ids.tolist()],
                                    self._sampling_params(n), use_tqdm=False)
        return np.asarray([list(o.outputs[0].token_ids) for o in outputs], dtype=np.int64)

    def sequence_logprobs(self, token_ids: np.ndarray, last: int | None = None) -> np.ndarray:
        """``prompt_logprobs=0``: each prompt token's own log-probability after the ones before it."""
        if self.llm is None:
            raise NotImplementedError("vLLM's serving engine does not score (run perplexity offline)")
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        out = self.llm.generate([{"prompt_token_ids": [int(t) for t in token_ids]}], params, use_tqdm=False)[0]
        values = np.asarray([dist[int(t)].logprob for dist, t in zip(out.prompt_logprobs[1:], token_ids[1:],
                                                                       strict=True)], dtype=np.float64)
        return values if last is None else values[len(values) - min(last, len(values)):]

    def continuation_logprobs(self, prompt_ids: np.ndarray, continuations: Sequence[Sequence[int]]) -> list[float]:
        """Each continuation's own ``prompt_logprobs`` pass (the engine's prefix cache holds the
        shared prompt after the first)."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        return [float(self.sequence_logprobs(np.concatenate([prompt, np.asarray(c, dtype=np.int64)]), last=len(c)).sum())
                for c in continuations]

    def topk_logprobs(self, token_ids: np.ndarray, last: int, k: int) -> TopK:
        """One prefill per row: ``prompt_logprobs`` gives the distribution of each prompt token
        after the ones before it (positions 1..len-1), and the one sampled token's
        ``logprobs`` the distribution after the last; the last ``last`` of those."""
        if self.llm is None:
            raise NotImplementedError("vLLM's serving engine does not score (run fidelity offline)")
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=k, logprobs=k, detokenize=False)
        outputs = self.llm.generate([{"prompt_token_ids": row} for row in token_ids.tolist()], params,
                                    use_tqdm=False)
        length = token_ids.shape[1]
        ids = np.zeros((len(outputs), last, k), dtype=np.int64)
        values = np.zeros((len(outputs), last, k), dtype=np.float32)
        for b, out in enumerate(outputs):
            # Entry j predicts token j + 1: prompt_logprobs[j + 1] for j < length - 1, the sample's after.
            dists = list(out.prompt_logprobs[1:]) + [out.outputs[0].logprobs[0]]
            for pos, dist in enumerate(dists[length - last:]):
                ranked = sorted((e.rank, t, e.logprob) for t, e in dist.items() if e.rank is not None and e.rank <= k)
                if len(ranked) < k:
                    raise RuntimeError(f"vLLM returned {len(ranked)} of the top {k} log-probabilities")
                ids[b, pos] = [t for _, t, _ in ranked[:k]]
                values[b, pos] = [lp for _, _, lp in ranked[:k]]
        return TopK(ids, values)

    def serve(self, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
              deadline_s: float, follow: Follow | None = None) -> ServedRun:
        if self.serving is None:
            raise RuntimeError("serve() needs the engine loaded for serving mode (ModelSpec.serving)")
        return self.serving.serve(requests, max_concurrency=max_concurrency, deadline_s=deadline_s, follow=follow)

    def speculation_counts(self) -> SpeculationCounts | None:
        # The engine's stat loggers record into this process's Prometheus registry (offline LLM
        # and AsyncLLM alike; disable_log_stats=False), whichever process runs its core.
        if self.options.speculative is None:
            return None
        from vllm.v1.metrics.reader import get_metrics_snapshot

        return SpeculationCounts.from_metrics(get_metrics_snapshot())

    def peak_memory_bytes(self) -> int | None:
        used = [r.memory_used_bytes() for r in self._readers]
        return int(sum(used)) if used and all(u is not None for u in used) else None

    def close(self) -> None:
        serving, self.serving = self.serving, None
        if serving is not None:
            serving.close()
            gc.collect()
        self._shut_down_llm()
        if self._readers:
            from actors.telemetry.nvml import TelemetryError, gpu_processes

            uuids = [r.gpu.uuid for r in self._readers]
            try:
                release_gpus(lambda: {pid for pid, _ in gpu_processes(uuids)}, GPU_RELEASE_TIMEOUT_S)
            except TelemetryError as exc:  # NVML cannot list them: the shutdown's own wait stands
                log.warning("could not check that the engine let go of its GPUs: %s", exc)

    def _shut_down_llm(self) -> None:
        llm, self.llm = self.llm, None
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        # The engine core (and its workers) are processes: ending them frees the GPUs.
        for owner in (llm, engine, getattr(engine, "engine_core", None)):
            shutdown = getattr(owner, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception as exc:
                    log.warning("vLLM shutdown: %s: %s", type(exc).__name__, exc)
                break
        del llm, engine
        gc.collect()

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        if type(exc).__name__ == "OutOfMemoryError":
            return True
        text = str(exc)
        # vLLM's KV-cache sizing refusals (0.26 v1/core/kv_cache_utils.py, 0.34 kv_cache_planning.py).
        return any(marker in text for marker in (
            "out of memory", "No available memory for the cache blocks",
            "which is larger than the available KV cache memory"))


# How long close() waits for the engine's processes to let go of the GPUs before it kills them.
GPU_RELEASE_TIMEOUT_S = 30.0


def release_gpus(holders: Callable[[], set[int]], timeout_s: float, poll_s: float = 0.1) -> list[int]:
    """Wait until no process this one started holds a GPU (``holders()``: the pids NVML lists
    on the engine's GPUs), killing those that still do after ``timeout_s``; returns their pids.

    vLLM's shutdown asks its engine core and workers to end, and a GPU is free only once they
    have: an actor handed on to the next group starts its engine right after close(), and the
    new engine would find the old one's memory taken. Only holders count: a child that never
    touched the GPU (multiprocessing's resource tracker lives as long as its parent) is none
    of the next engine's business and is left alone."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        ours = {p.pid: p for p in psutil.Process().children(recursive=True)}
        holding = [ours[pid] for pid in holders() if pid in ours]
        if not holding:
            return []
        if time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    for proc in holding:
        log.warning("vLLM process %d still held its GPU %.0f s after the engine's shutdown: killed",
                    proc.pid, timeout_s)
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    psutil.wait_procs(holding, timeout=5.0)
    return [p.pid for p in holding]


def _compute_capability(uuid: str) -> tuple[int, int]:
    from actors.telemetry.nvml import ensure_initialized

    nv = ensure_initialized()
    major, minor = nv.nvmlDeviceGetCudaComputeCapability(nv.nvmlDeviceGetHandleByUUID(uuid))
    return int(major), int(minor)
