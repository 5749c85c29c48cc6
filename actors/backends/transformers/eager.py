"""Hugging Face transformers backend: ``model.generate`` with exact output lengths.

Per-token times come from a logits processor that counts the steps and, at the
first, synchronizes the device and reads the clock: the end of prefill (time to
first token). Decode ends at generate's final synchronize. One synchronize per
call costs next to nothing; one per step would add a host stall to every step
(``python -m bench overhead`` measures both). ``compile: true`` runs the decode step compiled
(actors/backends/transformers/compiled.py).
"""

from __future__ import annotations

import gc
import importlib.metadata
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from actors.backends.base import Backend, LoadInfo, ModelSpec
from actors.backends.transformers import bnb
from actors.environment import cpu_model
from actors.errors import PrecisionUnavailable
from actors.host_memory import host_peak_bytes, reset_host_peak
from actors.records import Generation, PromptBatch, RequestTiming
from actors.serving.client import Follow, run_requests
from actors.serving.records import ServedRun, ServingRequest
from sweeper.core.backends import TransformersOptions
from sweeper.core.precisions import PRECISIONS
from sweeper.core.results import Compile


def _dtype_kwarg() -> str:
    # transformers 4.56 renamed ``torch_dtype`` to ``dtype``.
    major, minor = (int(x) for x in importlib.metadata.version("transformers").split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def eos_reply_lengths(new_tokens: np.ndarray, eos: int | list[int] | None, caps: Sequence[int]) -> list[int]:
    """Each row's reply length: up to and including its first end-of-sequence token (as
    vLLM counts it), else its cap."""
    stops = np.isin(new_tokens, [] if eos is None else ([eos] if isinstance(eos, int) else list(eos)))
    lengths = []
    for row, cap in zip(stops, caps, strict=True):
        hits = np.flatnonzero(row)
        lengths.append(min(int(hits[0]) + 1 if hits.size else new_tokens.shape[1], cap))
    return lengths


class TransformersBackend(Backend):
    def __init__(self, compile_devices: tuple[str, ...] | None = None) -> None:
        self.model: Any = None
        self.device = "cpu"
        self.clock = time.monotonic
        self._setup: dict[tuple[int, bool], tuple[Any, Any]] = {}
        # Devices the compiled path may run on (None: compiled.COMPILE_DEVICES, GPUs);
        # tests add "cpu" to check its outputs.
        self.compile_devices = compile_devices
        self._compiled: Any = None  # compiled.CompiledDecode of the loaded model
        self._serving: Any = None  # serving.ContinuousBatchingEngine, started by the first serve
        self._max_batch_requests: int | None = None
        self._host_peak_reset = False  # reset_peak_memory reset the process's resident peak (CPU)

    def load(self, spec: ModelSpec) -> LoadInfo:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        transformers.logging.set_verbosity_error()
        options = spec.options_as(TransformersOptions)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        precision = PRECISIONS[spec.precision]
        PrecisionUnavailable.check(precision)  # before any weights are written
        dtype = bnb.compute_dtype(precision, self.device)
        quantization = bnb.quantization_config(precision, self.device, double_quant=options.bnb_double_quant)
        from actors.models import materialize_weights, model_dir

        path = model_dir(spec.source, spec.location)
        if spec.source == "synthetic" and (precision.needs_weights or spec.weights_on_disk):
            # Quantizing needs weights in a file; a dtype precision initializes them in memory.
            path = str(materialize_weights(spec.location, spec.seed))
        # Random (missing) weights are drawn from the global RNG: seed it so a
        # synthetic model is the same model in every trial and on every worker.
        torch.manual_seed(spec.seed)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, device_map=self.device, attn_implementation=options.attn_implementation,
            **{_dtype_kwarg(): dtype},
            **({"quantization_config": quantization} if quantization is not None else {}),
        )
        self.model.eval()
        if quantization is not None:
            bnb.probe(self.model, precision, self.device)
        self._setup.clear()
        self.model.generation_config.pad_token_id = self.model.generation_config.pad_token_id or 0
        from actors.backends.transformers.compiled import CompiledDecode

        self._compiled = CompiledDecode(self.model, self.device, options.compile, options.compile_mode,
                                        self.compile_devices)
        self._max_batch_requests = options.max_batch_requests
        self.sync()
        name = torch.cuda.get_device_name() if self.device == "cuda" else cpu_model()
        return LoadInfo(
            device=self.device, device_name=name,
            weight_memory_bytes=bnb.weight_memory_bytes(self.model),
            vocab_size=int(self.model.config.vocab_size),
            architecture=self.model.config.to_dict(),
        )

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _generation_setup(self, output_len: int, stop_at_eos: bool = False) -> tuple[Any, Any]:
        """The config and step clock for one output length, built once.

        Building a GenerationConfig costs milliseconds of host time; inside the
        loop that time would sit between generate calls, outside both phases.
        ``stop_at_eos``: up to ``output_len`` tokens, ending at EOS (else exactly that many).
        """
        key = (output_len, stop_at_eos)
        cached = self._setup.get(key)
        if cached is not None:
            return cached
        from transformers import GenerationConfig, LogitsProcessor

        backend = self

        class StepClock(LogitsProcessor):
            """Counts steps and stamps the first, when prefill's logits exist.

            Only that stamp is used (time to first token); the decode phase ends at
            generate's own final synchronize. A synchronize at every step would make
            the host wait once more per step, before it launches argmax and the
            stopping check, instead of queueing them behind the forward.
            """

            def __init__(self) -> None:
                self.steps = 0
                self.t_first = 0.0

            def __call__(self, input_ids, scores):
                if self.steps == 0:
                    backend.sync()
                    self.t_first = backend.clock()
                self.steps += 1
                return scores

        config = GenerationConfig(
            max_new_tokens=output_len, min_new_tokens=None if stop_at_eos else output_len, do_sample=False,
            num_beams=1, use_cache=True,
            pad_token_id=self.model.generation_config.pad_token_id,
            eos_token_id=self.model.generation_config.eos_token_id,
        )
        self._setup[key] = (config, StepClock())
        return self._setup[key]

    def prepare(self, batch_size: int, input_len: int, output_len: int) -> Compile:
        """Compile the decode step for this shape and capture its graphs (compiled path only)."""
        if self._compiled is None:
            raise RuntimeError("prepare() before load()")
        return self._compiled.prepare(
            self.generate, self.sync, self.is_out_of_memory, int(self.model.config.vocab_size),
            batch_size, input_len, output_len, clock=self.clock)

    def generate(self, prompt_ids: np.ndarray, output_len: int) -> Generation:
        import torch
        from transformers import LogitsProcessorList

        compiled = self._compiled is not None and self._compiled.applies()
        eos_token_id = self.model.generation_config.eos_token_id
        batch_size, cache_len = prompt_ids.shape[0], prompt_ids.shape[1] + output_len
        if compiled:
            from actors.backends.transformers.compiled import compiled_graphs

            graphs_before = compiled_graphs()
        else:
            config, steps = self._generation_setup(output_len)
            # The eos id is read per call: a caller may change the model's generation config.
            config.eos_token_id = eos_token_id
            steps.steps = 0
        self.sync()
        # The request starts before its inputs are built: moving them to the device
        # is part of serving it, and it keeps the gaps between calls near zero.
        t_start = self.clock()
        ids = torch.from_numpy(prompt_ids).to(self.device)
        with torch.inference_mode():
            if compiled:
                out, t_first = self._compiled.generate(ids, output_len, eos_token_id, self.sync, self.clock)
            else:
                out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                          generation_config=config, logits_processor=LogitsProcessorList([steps]))
        self.sync()
        t_end = self.clock()
        if compiled:
            self._compiled.check_no_recompile(batch_size, cache_len, graphs_before)
        elif steps.steps != output_len:
            raise RuntimeError(f"generate ran {steps.steps} steps, expected {output_len}")
        else:
            t_first = steps.t_first
        new_tokens = out.shape[1] - ids.shape[1]
        if new_tokens != output_len:
            raise RuntimeError(f"generate produced {new_tokens} tokens, expected {output_len}")
        req = RequestTiming(t_start, t_first, t_end, output_len)
        return Generation(
            t_start_s=t_start, t_end_s=t_end, requests=(req,) * ids.shape[0],
            marks=(("prefill", t_start, t_first), ("decode", t_first, t_end)),
        )

    def generate_batch(self, batch: PromptBatch) -> Generation:
        """Prompts of varying lengths, left-padded into one static batch (what a static batch
        of mixed prompts costs: the pad share is measured per trial), generating until the
        longest reply is done: each sequence to its EOS (natural lengths, capped) or, EOS
        suppressed, to the batch's longest requested length, each counted to its own."""
        uniform = batch.as_uniform()
        if uniform is not None:
            return self.generate(*uniform)
        if self._compiled is not None and self._compiled.applies():
            raise NotImplementedError("the compiled decode runs one batch shape; varied lengths run eager")
        import torch
        from transformers import LogitsProcessorList

        n = max(batch.output_lens)
        config, steps = self._generation_setup(n, stop_at_eos=batch.stop_at_eos)
        eos = self.model.generation_config.eos_token_id
        config.eos_token_id = eos
        steps.steps = 0
        pad = int(self.model.generation_config.pad_token_id or 0)
        width = max(len(p) for p in batch.prompts)
        ids_np = np.full((len(batch.prompts), width), pad, dtype=np.int64)
        mask_np = np.zeros_like(ids_np)
        for i, p in enumerate(batch.prompts):
            ids_np[i, width - len(p):] = p
            mask_np[i, width - len(p):] = 1
        self.sync()
        t_start = self.clock()
        ids, mask = torch.from_numpy(ids_np).to(self.device), torch.from_numpy(mask_np).to(self.device)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                      logits_processor=LogitsProcessorList([steps]))
        self.sync()
        t_end = self.clock()
        new = out[:, width:].cpu().numpy()
        if batch.stop_at_eos:
            lengths = eos_reply_lengths(new, eos, caps=batch.output_lens)
        else:
            if new.shape[1] != n:
                raise RuntimeError(f"generate produced {new.shape[1]} tokens, expected {n}")
            lengths = list(batch.output_lens)
        requests = tuple(RequestTiming(t_start, steps.t_first, t_end, k, len(p),
                                       tuple(int(t) for t in new[i, :k]) if batch.keep_replies else None)
                         for i, (p, k) in enumerate(zip(batch.prompts, lengths, strict=True)))
        return Generation(t_start_s=t_start, t_end_s=t_end, requests=requests,
                          marks=(("prefill", t_start, steps.t_first), ("decode", steps.t_first, t_end)))

    def serve(self, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
              deadline_s: float, follow: Follow | None = None) -> ServedRun:
        """Serving mode through transformers' continuous-batching manager
        (actors/backends/transformers/serving.py), started once per loaded model."""
        if self._serving is None:
            import torch

            from actors.backends.transformers.serving import ContinuousBatchingEngine

            with torch.inference_mode():  # the manager's thread inherits the caller's inference mode
                self._serving = ContinuousBatchingEngine(self.model, self._max_batch_requests)
        return run_requests(self._serving, requests, max_concurrency=max_concurrency, deadline_s=deadline_s,
                            clock=self.clock, follow=follow)

    def reset_peak_memory(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()
        else:
            self._host_peak_reset = reset_host_peak()

    def peak_memory_bytes(self) -> int | None:
        if self.device == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated())
        # The process's resident peak since the trial's reset; where the kernel cannot reset
        # it, the process's peak over its life (earlier groups of a reused actor included),
        # which is no trial's figure.
        return host_peak_bytes() if self._host_peak_reset else None

    def recover(self) -> None:
        gc.collect()
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    def close(self) -> None:
        if self._serving is not None:
            self._serving.close()
            self._serving = None
        self.model = None
        self._compiled = None  # holds the model, its static cache and module list
        self.recover()

    # -- scoring (fidelity pass) ---------------------------------------------------
    def greedy_continuation(self, prompt_ids: np.ndarray, n: int) -> np.ndarray:
        import torch
        from transformers import GenerationConfig

        # min_new_tokens keeps every continuation n long (eos is never picked).
        config = GenerationConfig(
            max_new_tokens=n, min_new_tokens=n, do_sample=False, num_beams=1, use_cache=True,
            pad_token_id=self.model.generation_config.pad_token_id,
            eos_token_id=self.model.generation_config.eos_token_id,
        )
        ids = torch.from_numpy(np.ascontiguousarray(prompt_ids)).to(self.device)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        return out[:, ids.shape[1]:].cpu().numpy()

    def next_token_logprobs(self, token_ids: np.ndarray, last: int | None = None) -> np.ndarray:
        import torch

        ids = torch.from_numpy(np.ascontiguousarray(token_ids)).to(self.device)
        with torch.inference_mode():
            logits = self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
            if last is not None:
                logits = logits[:, -last:]
            return torch.log_softmax(logits.float(), dim=-1).cpu().numpy()

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        import torch

        return isinstance(exc, torch.OutOfMemoryError)
