"""The compiled decode path of the transformers backend (``compile: true``).

Transformers' supported recipe for fast static decoding: a ``StaticCache`` and
``torch.compile`` of the one-token decode step (in mode ``reduce-overhead``
inductor's kernels replay as CUDA graphs). The prompt is prefilled eager (its
shape is not decode's); every later token is one call of the compiled step,
which runs the model's forward on the static cache, forbids EOS (outputs have
exactly ``output_len`` tokens, as on the eager path) and takes the argmax.

The loop is ours rather than ``generate``'s because ``generate`` checks its
stopping criteria on the host after every token: one device synchronize per
step, so the host's per-step work (input preparation, the compiled call's
guards, graph launch) never overlaps the GPU's. With lengths fixed and EOS
forbidden nothing needs checking; the loop queues step after step and
synchronizes twice per call, after prefill (time to first token) and at the
end. Measured on an H200 (llama-3.1-8b bf16, batch 1): compiled through
``generate`` reached 46 % MBU; see docs/BENCHMARKS.md §7 for this loop.

The backend owns one ``StaticCache`` of the shape it runs and resets it in
place before every call, so the cache keeps its addresses: graphs are
captured once per shape and replayed by every later call.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from sweeper.core.results import Compile

# Devices the compiled path runs on unless a backend is given its own list: CUDA
# graphs are the point of it (on a CPU the backend falls back to eager).
COMPILE_DEVICES: tuple[str, ...] = ("cuda",)
# Shapes a sweep group may run on one actor (batch sizes x lengths); dynamo's
# default limit (8) would quietly drop further shapes to eager.
RECOMPILE_LIMIT = 64
# Generate calls that prepare a new shape: the first compiles and starts graph
# capture, the second completes it (cudagraph trees warm up, then record).
PREPARE_CALLS = 2


class RecompiledError(RuntimeError):
    """torch.compile compiled new graphs during a call of an already-prepared shape."""


def _counters() -> Any:
    from torch._dynamo.utils import counters

    return counters


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (each recompile adds one)."""
    return int(_counters()["stats"]["unique_graphs"])


def _graph_breaks() -> int:
    return int(sum(_counters()["graph_break"].values()))


def _cudagraph_skips() -> int:
    return int(_counters()["inductor"]["cudagraph_skips"])


def unsupported_reason(model: Any, device: str, compile_devices: tuple[str, ...]) -> str | None:
    """Why the compiled path cannot run this loaded model here; None when it can."""
    if device not in compile_devices:
        return (f"{device.upper()}: the decode step is compiled on GPUs only (CUDA graphs); "
                f"this trial runs eager")
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None and not quantizer.is_compileable:
        method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", "quantized")
        method = getattr(method, "value", method)
        return f"{method} layers do not compile (transformers marks the quantizer not compileable); this trial runs eager"
    return None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class CompiledDecode:
    """The compiled path's state on one loaded model: status, cache, prepared shapes."""

    def __init__(self, model: Any, device: str, compile: bool, mode: str,
                 compile_devices: tuple[str, ...] | None = None) -> None:
        self.model = model
        self.device = device
        self.requested = compile
        self.mode = mode
        devices = compile_devices or COMPILE_DEVICES
        self.fallback = unsupported_reason(model, device, devices) if compile else None
        self._cache: Any = None
        self._cache_shape: tuple[int, int] | None = None
        self._step: Callable[..., Any] | None = None
        self._bias: Any = None
        self._bias_key: tuple | None = None
        parameters = inspect.signature(model.forward).parameters
        # Prefill needs only the last position's logits (generate asks the same).
        self._keep_last = {"logits_to_keep": 1} if "logits_to_keep" in parameters else {}
        # The cache's argument: ``cache`` from transformers 5.24 on, where ``past_key_values``
        # is deprecated (to go in 5.40); before, only ``past_key_values``.
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"
        self._prepared: dict[tuple[int, int], Compile] = {}
        # Hooked modules (the layer-profiling pass) must run eager: a hook inside a
        # CUDA graph fires once at capture, never at replay.
        self._modules = list(model.modules())
        if self.active:
            import torch._dynamo

            cfg = torch._dynamo.config
            cfg.recompile_limit = max(cfg.recompile_limit, RECOMPILE_LIMIT)
            # A model compiles from a clean slate: dynamo could otherwise serve it graphs
            # compiled for an earlier, identical model of this process (then nothing would
            # compile, and prepare could not tell compiled from eager). An actor holds one
            # model, so this drops nothing there.
            torch._dynamo.reset()

    @property
    def active(self) -> bool:
        return self.requested and self.fallback is None

    def status(self) -> str:
        if not self.requested:
            return "eager"
        return f"fallback: {self.fallback}" if self.fallback else "compiled"

    def applies(self) -> bool:
        """Whether the next generate call takes the compiled path."""
        return self.active and not any(m._forward_hooks or m._forward_pre_hooks for m in self._modules)

    @staticmethod
    def _greedy(logits: Any, eos_bias: Any) -> Any:
        """The next token of every sequence from its last position's logits. As generate
        does: processors and argmax in float32, EOS at -inf until output_len."""
        return (logits[:, -1, :].float() + eos_bias).argmax(dim=-1, keepdim=True)

    def _decode_step(self, token: Any, position: Any, cache: Any, eos_bias: Any) -> Any:
        """One greedy decode step on the static cache: the next token of every sequence."""
        logits = self.model(input_ids=token, cache_position=position, use_cache=True, **{self._cache_arg: cache}).logits
        return self._greedy(logits, eos_bias)

    def _compiled_step(self) -> Callable[..., Any]:
        if self._step is None:
            import torch

            # dynamic=False: each (batch, cache length) gets a graph specialized to it, as
            # a server compiled for one shape would; a new shape compiles anew (in prepare).
            self._step = torch.compile(self._decode_step, mode=self.mode, dynamic=False, fullgraph=False)
        return self._step

    def _eos_bias(self, eos_token_id: Any, vocab_size: int) -> Any:
        import torch

        ids = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        key = (tuple(ids), vocab_size)
        if self._bias_key != key:
            bias = torch.zeros(vocab_size, dtype=torch.float32, device=self.model.device)
            bias[[i for i in ids if 0 <= i < vocab_size]] = float("-inf")
            # One tensor for the model's life: CUDA graphs read it in place, no copy per step.
            torch._dynamo.mark_static_address(bias)
            self._bias, self._bias_key = bias, key
        return self._bias

    def generate(self, ids: Any, output_len: int, eos_token_id: Any,
                 sync: Callable[[], None], clock: Callable[[], float]) -> tuple[Any, float]:
        """Prompt + ``output_len`` greedy tokens, and the instant prefill's token existed.

        Runs in inference mode. Synchronizes after prefill and returns without the
        final synchronize (the caller's, which ends the request)."""
        import torch

        batch_size, input_len = ids.shape
        total = input_len + output_len
        cache = self.cache(batch_size, total)
        eos_bias = self._eos_bias(eos_token_id, int(self.model.config.vocab_size))
        out = torch.empty((batch_size, total), dtype=ids.dtype, device=ids.device)
        out[:, :input_len] = ids
        positions = torch.arange(total, device=ids.device)
        logits = self.model(input_ids=ids, cache_position=positions[:input_len], use_cache=True,
                            **{self._cache_arg: cache}, **self._keep_last).logits
        token = self._greedy(logits, eos_bias)
        out[:, input_len:input_len + 1] = token
        sync()
        t_first = clock()
        step = self._compiled_step()
        # One position tensor advanced in place: the compiled step sees the same input every call.
        position = positions[input_len:input_len + 1].clone()
        for i in range(input_len + 1, total):
            # A CUDA graph's output is overwritten by its next replay: the next step's
            # input must be a copy, not the graph's own output buffer.
            token = step(token, position, cache, eos_bias).clone()
            out[:, i:i + 1] = token
            position.add_(1)
        return out, t_first

    def cache(self, batch_size: int, cache_len: int) -> Any:
        """The static cache for this shape, reset in place (same addresses every call)."""
        if self._cache_shape != (batch_size, cache_len):
            from transformers import StaticCache

            self._cache = None  # free the old shape's cache before allocating the new one
            self._cache = StaticCache(config=self.model.config, max_cache_len=cache_len)
            self._cache_shape = (batch_size, cache_len)
        else:
            self._cache.reset()
        return self._cache

    def check_no_recompile(self, batch_size: int, cache_len: int, graphs_before: int) -> None:
        """Raise when a prepared shape compiled again: its call timed compilation, not decoding."""
        new = compiled_graphs() - graphs_before
        if new and (batch_size, cache_len) in self._prepared:
            raise RecompiledError(
                f"torch.compile compiled {new} new graph(s) during a generate call of the prepared shape "
                f"batch {batch_size}, cache length {cache_len}: the call's time includes compilation")

    def prepare(self, generate: Callable[[np.ndarray, int], Any], sync: Callable[[], None],
                is_out_of_memory: Callable[[BaseException], bool], vocab_size: int,
                batch_size: int, input_len: int, output_len: int,
                clock: Callable[[], float] = time.monotonic) -> Compile:
        """Compile and capture graphs for the shape; time it against a steady-state call.

        ``compile_s`` = (time of the preparing calls) - (as many steady-state
        calls): what the first calls of a new shape cost beyond decoding.
        """
        if not self.active:
            return Compile(None, self.status())
        if output_len < 2:
            return Compile(None, "fallback: output_len 1 has no decode step to compile (prefill runs eager)")
        key = (batch_size, input_len + output_len)
        rng = np.random.default_rng([batch_size, input_len, output_len])

        def prompts() -> np.ndarray:
            return rng.integers(0, vocab_size, size=(batch_size, input_len), dtype=np.int64)

        if key in self._prepared:
            # Compiled by an earlier trial. One call re-captures graphs if the cache
            # moved (another shape ran in between); compile_s is the first compile's.
            generate(prompts(), output_len)
            return self._prepared[key]
        graphs0, breaks0, skips0 = compiled_graphs(), _graph_breaks(), _cudagraph_skips()
        try:
            sync()
            t0 = clock()
            for _ in range(PREPARE_CALLS):
                generate(prompts(), output_len)
            t1 = clock()
            graphs1 = compiled_graphs()
            generate(prompts(), output_len)
            steady_s = clock() - t1
        except Exception as exc:
            if is_out_of_memory(exc):
                raise
            return self._fall_back(f"torch.compile failed: {_one_line(exc)}; this trial runs eager")
        # No new graph: dynamo skipped the frame (e.g. its recompile limit, or the
        # model's forward cannot be traced): nothing ran compiled.
        if graphs1 == graphs0:
            return self._fall_back("torch.compile did not compile the decode step (dynamo skipped it); "
                                   "this trial runs eager")
        notes = []
        if (late := compiled_graphs() - graphs1):
            notes.append(f"{late} graph(s) compiled after {PREPARE_CALLS} calls")
        if (breaks := _graph_breaks() - breaks0):
            notes.append(f"{breaks} graph break(s)")
        if self.mode == "reduce-overhead" and (skips := _cudagraph_skips() - skips0):
            notes.append(f"CUDA graphs skipped {skips} time(s)")
        status = "; ".join(["compiled", *notes])
        info = Compile(max((t1 - t0) - PREPARE_CALLS * steady_s, 0.0), status)
        self._prepared[key] = info
        return info

    def _fall_back(self, reason: str) -> Compile:
        import torch._dynamo

        self.fallback = reason
        self._cache = self._cache_shape = self._step = None
        torch._dynamo.reset()  # drop what was compiled; every later call runs eager
        return Compile(None, self.status())
