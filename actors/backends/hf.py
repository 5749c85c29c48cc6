"""Hugging Face transformers backend: ``model.generate`` with exact output lengths.

Per-token times come from a logits processor that synchronizes the device and
reads the clock when each step's logits exist: the first call marks the end of
prefill (time to first token), later calls mark decode steps. Greedy generation
already synchronizes every step (its stopping check reads a device value), so
the extra synchronize costs next to nothing.
"""

from __future__ import annotations

import gc
import importlib.metadata
import platform
import resource
import time
from typing import Any

import numpy as np

from actors.backends.base import Backend, Generation, LoadInfo, ModelSpec, RequestTiming
from sweeper.backends import TransformersOptions
from sweeper.precisions import PRECISIONS


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _dtype_kwarg() -> str:
    # transformers 4.56 renamed ``torch_dtype`` to ``dtype``.
    major, minor = (int(x) for x in importlib.metadata.version("transformers").split(".")[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


class TransformersBackend(Backend):
    def __init__(self) -> None:
        self.model: Any = None
        self.device = "cpu"
        self.clock = time.monotonic
        self._setup: dict[int, tuple[Any, Any]] = {}

    def load(self, spec: ModelSpec) -> LoadInfo:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        transformers.logging.set_verbosity_error()
        options = TransformersOptions.model_validate_json(spec.options_json)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype = getattr(torch, PRECISIONS[spec.precision].torch_dtype)
        path = spec.location
        if spec.source == "synthetic":
            from actors.models import materialize_synthetic

            path = str(materialize_synthetic(spec.location))
        # Random (missing) weights are drawn from the global RNG: seed it so a
        # synthetic model is the same model in every trial and on every worker.
        torch.manual_seed(spec.seed)
        self.model = AutoModelForCausalLM.from_pretrained(
            path, device_map=self.device, attn_implementation=options.attn_implementation,
            **{_dtype_kwarg(): dtype},
        )
        self.model.eval()
        self._setup.clear()
        self.model.generation_config.pad_token_id = self.model.generation_config.pad_token_id or 0
        self.sync()
        name = torch.cuda.get_device_name() if self.device == "cuda" else _cpu_name()
        return LoadInfo(
            device=self.device, device_name=name,
            weight_memory_bytes=int(self.model.get_memory_footprint()),
            vocab_size=int(self.model.config.vocab_size),
        )

    def sync(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()

    def _generation_setup(self, output_len: int) -> tuple[Any, Any]:
        """The config and step clock for one output length, built once.

        Building a GenerationConfig costs milliseconds of host time; inside the
        loop that time would sit between generate calls, outside both phases.
        """
        cached = self._setup.get(output_len)
        if cached is not None:
            return cached
        from transformers import GenerationConfig, LogitsProcessor

        backend = self

        class StepClock(LogitsProcessor):
            def __init__(self) -> None:
                self.times: list[float] = []

            def __call__(self, input_ids, scores):
                backend.sync()
                self.times.append(backend.clock())
                return scores

        config = GenerationConfig(
            max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False,
            num_beams=1, use_cache=True,
            pad_token_id=self.model.generation_config.pad_token_id,
            eos_token_id=self.model.generation_config.eos_token_id,
        )
        self._setup[output_len] = (config, StepClock())
        return self._setup[output_len]

    def generate(self, prompt_ids: np.ndarray, output_len: int) -> Generation:
        import torch
        from transformers import LogitsProcessorList

        config, steps = self._generation_setup(output_len)
        # The eos id is read per call: a caller may change the model's generation config.
        config.eos_token_id = self.model.generation_config.eos_token_id
        steps.times = []
        self.sync()
        # The request starts before its inputs are built: moving them to the device
        # is part of serving it, and it keeps the gaps between calls near zero.
        t_start = self.clock()
        ids = torch.from_numpy(prompt_ids).to(self.device)
        mask = torch.ones_like(ids)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, generation_config=config,
                                      logits_processor=LogitsProcessorList([steps]))
        self.sync()
        t_end = self.clock()
        new_tokens = out.shape[1] - ids.shape[1]
        if new_tokens != output_len or len(steps.times) != output_len:
            raise RuntimeError(f"generate produced {new_tokens} tokens ({len(steps.times)} steps), expected {output_len}")
        t_first = steps.times[0]
        req = RequestTiming(t_start, t_first, t_end, output_len)
        return Generation(
            t_start_s=t_start, t_end_s=t_end, requests=(req,) * ids.shape[0],
            marks=(("prefill", t_start, t_first), ("decode", t_first, t_end)),
        )

    def reset_peak_memory(self) -> None:
        if self.device == "cuda":
            import torch

            torch.cuda.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int | None:
        if self.device == "cuda":
            import torch

            return int(torch.cuda.max_memory_allocated())
        # No resettable peak exists for host memory: this is the process's peak.
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def recover(self) -> None:
        gc.collect()
        if self.device == "cuda":
            import torch

            torch.cuda.empty_cache()

    def close(self) -> None:
        self.model = None
        self.recover()

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        import torch

        return isinstance(exc, torch.OutOfMemoryError)
