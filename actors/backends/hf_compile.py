"""The compiled decode path of the transformers backend (``compile: true``).

What runs compiled is transformers' own auto-compile of the decoding forward:
``generate`` given a compilable cache (a ``StaticCache``) and a ``CompileConfig``
sends every decode step through ``torch.compile(model.__call__)``; in mode
``reduce-overhead`` inductor's kernels are replayed as CUDA graphs. Prefill
stays eager (its shape is not decode's, and transformers compiles it only for
chunked prefill, which we do not use); so does everything ``generate`` does
between forwards (logits processors, argmax, stopping checks).

The backend owns one ``StaticCache`` of the shape it runs and resets it in
place before every call, so the cache keeps its addresses: graphs are
captured once per shape and replayed by every later call. (With
``cache_implementation="static"`` generate allocates a fresh cache per call,
and graph replay then depends on the allocator handing back the same
addresses; where it does not, CUDA graphs are silently re-recorded.)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from actors.backends.base import PrepareInfo

# Devices the compiled path runs on unless a backend is given its own list: CUDA
# graphs are the point of it (issue 8: fall back on CPU).
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
        self._prepared: dict[tuple[int, int], PrepareInfo] = {}
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

    def config_kwargs(self) -> dict[str, Any]:
        """GenerationConfig fields that turn on transformers' auto-compile of the decode step."""
        from transformers import CompileConfig

        # dynamic=False: each (batch, cache length) gets a graph specialized to it, as
        # a server compiled for one shape would; a new shape compiles anew (in prepare).
        config = CompileConfig(fullgraph=False, dynamic=False, mode=self.mode)
        if self.device != "cuda":
            # transformers' switch for compiling off-GPU (its tests use it); only
            # reached when compile_devices lets this device compile.
            config._compile_all_devices = True
        return {"compile_config": config}

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
                clock: Callable[[], float] = time.monotonic) -> PrepareInfo:
        """Compile and capture graphs for the shape; time it against a steady-state call.

        ``compile_s`` = (time of the preparing calls) - (as many steady-state
        calls): what the first calls of a new shape cost beyond decoding.
        """
        if not self.active:
            return PrepareInfo(None, self.status())
        if output_len < 2:
            return PrepareInfo(None, "fallback: output_len 1 has no decode step to compile (prefill runs eager)")
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
        # No new graph: generate took its eager path, or dynamo skipped the frame
        # (e.g. its recompile limit): either way nothing ran compiled.
        if graphs1 == graphs0:
            return self._fall_back("transformers did not compile the decode step (its auto-compile "
                                   "criteria were not met); this trial runs eager")
        notes = []
        if (late := compiled_graphs() - graphs1):
            notes.append(f"{late} graph(s) compiled after {PREPARE_CALLS} calls")
        if (breaks := _graph_breaks() - breaks0):
            notes.append(f"{breaks} graph break(s)")
        if self.mode == "reduce-overhead" and (skips := _cudagraph_skips() - skips0):
            notes.append(f"CUDA graphs skipped {skips} time(s)")
        status = "; ".join(["compiled", *notes])
        info = PrepareInfo(max((t1 - t0) - PREPARE_CALLS * steady_s, 0.0), status)
        self._prepared[key] = info
        return info

    def _fall_back(self, reason: str) -> PrepareInfo:
        import torch._dynamo

        self.fallback = reason
        self._cache = self._cache_shape = None
        torch._dynamo.reset()  # drop what was compiled; every later call runs eager
        return PrepareInfo(None, self.status())
