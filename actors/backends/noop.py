"""The ``noop`` backend: no model, generate sleeps for the configured step times.

It measures the harness and the scheduler themselves (per-trial overhead,
GPU-busy fraction, model-load counts) on any machine, including a Ray
cluster whose GPUs are only logical resources. It imports no torch: an actor
that runs it starts in the time Ray and the harness take, nothing more.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np

from actors.backends.base import Backend, Generation, LoadInfo, ModelSpec, RequestTiming
from sweeper.core.backends import NoopOptions
from sweeper.core.presets import PRESETS


class SimulatedOutOfMemory(MemoryError):
    """Raised for batch sizes at or above ``oom_batch_size``, as a real backend's OOM would be."""


def _vocab_size(spec: ModelSpec) -> int:
    """The vocabulary size of the model entry, from its config alone (no weights are read)."""
    if spec.source == "synthetic":
        return int(PRESETS[spec.location].config["vocab_size"])
    config_path = Path(spec.location) / "config.json"
    if spec.source == "hub":
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(spec.location, "config.json")
        if not isinstance(cached, str):
            raise FileNotFoundError(f"noop backend: config.json of {spec.location!r} is not in the local hub cache")
        config_path = Path(cached)
    config = json.loads(config_path.read_text())
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size")
    if not vocab:
        raise ValueError(f"noop backend: {config_path} names no vocab_size")
    return int(vocab)


def _visible_gpus() -> str:
    # Ray sets CUDA_VISIBLE_DEVICES to the GPUs (logical or real) it assigned the actor.
    return os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()


class NoopBackend(Backend):
    def __init__(self) -> None:
        self.options = NoopOptions()
        self.clock = time.monotonic
        self.sleep = time.sleep

    def load(self, spec: ModelSpec) -> LoadInfo:
        self.options = spec.options_as(NoopOptions)
        vocab_size = _vocab_size(spec)
        self.sleep(self.options.load_s)
        gpus = _visible_gpus()
        device = "cuda" if gpus else "cpu"
        where = f"GPU {gpus}" if gpus else (platform.processor() or platform.machine() or "CPU")
        return LoadInfo(device=device, device_name=f"noop on {where}", weight_memory_bytes=0,
                        vocab_size=vocab_size)

    def generate(self, prompt_ids: np.ndarray, output_len: int) -> Generation:
        batch = int(prompt_ids.shape[0])
        o = self.options
        if o.oom_batch_size is not None and batch >= o.oom_batch_size:
            raise SimulatedOutOfMemory(f"simulated out of memory: batch {batch} >= oom_batch_size {o.oom_batch_size}")
        prefill_s = o.step_s if o.prefill_s is None else o.prefill_s
        while o.gate_file is not None and not os.path.exists(o.gate_file):
            self.sleep(0.02)
        t_start = self.clock()
        # Sleep to absolute deadlines: the sleeps' own overshoot does not accumulate.
        _sleep_until(t_start + prefill_s, self.clock, self.sleep)
        t_first = self.clock()
        _sleep_until(t_first + o.step_s * (output_len - 1), self.clock, self.sleep)
        t_end = self.clock()
        req = RequestTiming(t_start, t_first, t_end, output_len)
        return Generation(t_start_s=t_start, t_end_s=t_end, requests=(req,) * batch,
                          marks=(("prefill", t_start, t_first), ("decode", t_first, t_end)))

    def sync(self) -> None:
        pass

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        return isinstance(exc, SimulatedOutOfMemory)


def _sleep_until(deadline_s: float, clock, sleep) -> None:
    remaining = deadline_s - clock()
    if remaining > 0:
        sleep(remaining)
