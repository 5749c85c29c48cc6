"""Serving mode on transformers: its continuous-batching manager, fed at arrival times.

``model.init_continuous_batching`` returns a manager that runs the model on a
thread of its own, over a paged KV cache, admitting requests between steps. The
client loop (actors.serving.client) submits each request at its arrival time and
collects finished ones here. Each output carries the engine's own stamps, on
``time.perf_counter``: when the request left the queue (``lifespan[0]``, its
scheduling), one per generated token, and when it finished. They are moved onto
the actor's ``time.monotonic`` by one offset read at start-up (on Linux both read
CLOCK_MONOTONIC, and the offset is 0).

EOS is disabled (``eos_token_id = -1``), so every request produces exactly its
``output_len`` tokens, as offline trials do.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from actors.serving.records import UNFINISHED, ServedRequest, ServingRequest
from sweeper.core.continuous_batching import CPU_KV_CACHE_PAGES, CPU_MAX_BATCH_TOKENS

# How long submitting one request may block on the manager's input queue.
SUBMIT_TIMEOUT_S = 10.0


class ContinuousBatchingEngine:
    """A started continuous-batching manager, as a ``SteppedEngine``."""

    _runs = itertools.count()

    def __init__(self, model: Any, max_batch_requests: int | None) -> None:
        from transformers import ContinuousBatchingConfig, GenerationConfig

        config = GenerationConfig(do_sample=False, num_beams=1, eos_token_id=-1,
                                  pad_token_id=model.generation_config.pad_token_id or 0)
        # Block sharing off for measurement, as vLLM's prefix caching is: random prompts share
        # nothing, and a served request must cost what it costs alone.
        # On a CPU a bounded KV cache, not 60 % of the host's memory (sweeper.core.continuous_batching).
        on_cpu = model.device.type == "cpu"
        cb = ContinuousBatchingConfig(allow_block_sharing=False, max_requests_per_batch=max_batch_requests,
                                      num_blocks=CPU_KV_CACHE_PAGES if on_cpu else None,
                                      max_batch_tokens=CPU_MAX_BATCH_TOKENS if on_cpu else None)
        self.eos_token_id = model.generation_config.eos_token_id
        self.manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=cb)
        self.manager.start()
        self.offset_s = time.monotonic() - time.perf_counter()
        # Each live request: what was sent, its arrival, its submission and when it was due.
        self.live: dict[str, tuple[ServingRequest, float, float, float | None]] = {}

    def close(self) -> None:
        if self.manager.is_running():
            self.manager.stop(block=True, timeout=60)

    # -- SteppedEngine ---------------------------------------------------------------------------
    def submit(self, request: ServingRequest, arrival_s: float, submit_s: float, due_s: float | None) -> None:
        request_id = f"r{next(self._runs)}"
        # eos -1 (no token has it) keeps exact lengths; natural lengths stop at the model's EOS.
        eos = self.eos_token_id if request.stop_at_eos else -1
        eos = eos if isinstance(eos, int) or eos is None else eos[0]
        self.manager.add_request(request.prompt_ids.tolist(), request_id=request_id,
                                 max_new_tokens=request.output_len, record_timestamps=True, eos_token_id=eos)
        self.live[request_id] = (request, arrival_s, submit_s, due_s)

    def wait(self, until_s: float) -> list[ServedRequest]:
        first = self.manager.get_result(timeout=max(until_s - time.monotonic(), 0.0))
        if first is None:
            self._check_alive()
            return []
        out = [first]
        while (more := self.manager.get_result(timeout=0)) is not None:
            out.append(more)
        return [served for o in out if (served := self._served(o)) is not None]

    def abandon(self, now_s: float) -> list[ServedRequest]:
        left = []
        for request_id, (request, arrival_s, submit_s, due_s) in self.live.items():
            self.manager.cancel_request(request_id)
            left.append(ServedRequest(request.index, request.prompt_tokens, arrival_s, submit_s, None, (), None,
                                      error=UNFINISHED, due_s=due_s))
        self.live.clear()
        return left

    # -- conversion ----------------------------------------------------------------------------
    def _check_alive(self) -> None:
        error = self.manager.background_thread_status.fatal_error
        if error is not None or not self.manager.is_running():
            raise RuntimeError(f"transformers' continuous-batching loop stopped: {error!r}")

    def _served(self, output: Any) -> ServedRequest | None:
        entry = self.live.pop(output.request_id, None)
        if entry is None:  # a request of an earlier, abandoned run
            return None
        request, arrival_s, submit_s, due_s = entry
        times = tuple(t + self.offset_s for t in (output.timestamps or ()))
        scheduled, finished = (t + self.offset_s if t and t > 0 else None for t in output.lifespan)
        error = output.error
        wrong = len(times) > request.output_len if request.stop_at_eos else len(times) != request.output_len
        if error is None and wrong:
            error = f"produced {len(times)} tokens, expected {request.output_len}"
        reply = tuple(int(t) for t in output.generated_tokens or ()) if request.keeps_reply else None
        return ServedRequest(request.index, request.prompt_tokens, arrival_s, submit_s, scheduled, times,
                             times[-1] if times and error is None else None, error, due_s, reply_ids=reply)
