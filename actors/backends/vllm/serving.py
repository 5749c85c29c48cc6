"""Serving mode on vLLM: the V1 async engine (``AsyncLLM``) inside the trial actor.

The engine lives on one event loop, run by a thread of the actor for the
engine's whole life: ``AsyncLLM`` binds its output handler to the loop of its
first request, so every run must use that same loop. The actor's thread hands
each run to it and waits for the result with a bound.

Every request is rendered to what the engine core takes before the clock starts
(``actors.backends.vllm.inputs``: the loop is left only the hand-over). Each request is a
task started when it arrives (``actors.serving.schedule``: one
dispatcher, not a task per request created up front), that waits for a
concurrency slot if ``max_concurrency`` is set, then streams its tokens
(``RequestOutputKind.DELTA``) and stamps each delta with ``time.monotonic()`` as
it reaches the task, as vLLM's own ``bench serve`` stamps streamed chunks. A
delta may carry several tokens when the loop falls behind the engine: they share
its stamp. When the request finishes, the engine's own ``scheduled_ts`` (engine
core, CLOCK_MONOTONIC, the same clock on one host) gives its queueing time,
when it lies within the request's life. A run past its deadline cancels the
tasks still going, which aborts their requests in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from actors.backends.vllm.inputs import PromptRenderer, async_llm, streaming_params
from actors.serving.client import Follow
from actors.serving.records import UNFINISHED, InFlight, ServedRun, ServingRequest, served_run
from actors.serving.schedule import play

T = TypeVar("T")

# Engine stamps this far outside a request's life are on another clock: not used.
CLOCK_TOLERANCE_S = 1e-3
# Beyond the run's own deadline, how long the actor waits for the loop to hand it back.
HANDBACK_S = 60.0


class AsyncEngineRunner:
    """An ``AsyncLLM`` and the event-loop thread that owns it."""

    _ids = itertools.count()

    def __init__(self, engine_kwargs: dict[str, Any], start_timeout_s: float,
                 create: Callable[[dict[str, Any]], Coroutine[Any, Any, Any]] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sweeper-vllm-loop", daemon=True)
        self.thread.start()
        self.engine: Any = self.call((create or async_llm)(engine_kwargs), timeout_s=start_timeout_s)

    def call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=timeout_s)

    @property
    def model_config(self) -> Any:
        return getattr(self.engine, "model_config", None) or self.engine.vllm_config.model_config

    def weight_memory_bytes(self) -> list[int]:
        return list(self.call(self.engine.collective_rpc("sweeper_weight_memory_bytes", timeout=60), 90))

    def serve(self, requests: Sequence[ServingRequest], *, max_concurrency: int | None, deadline_s: float,
              follow: Follow | None = None) -> ServedRun:
        budget_s = max(deadline_s - time.monotonic(), 0.0) + HANDBACK_S
        return self.call(self._serve(requests, max_concurrency, deadline_s, follow), timeout_s=budget_s)

    async def _serve(self, requests: Sequence[ServingRequest], max_concurrency: int | None,
                     deadline_s: float, follow: Follow | None = None) -> ServedRun:
        # Ready before the clock starts: every request's sampling parameters and its prompt
        # rendered for the engine core (a conversation's later turns: as the turn before ends).
        ordered = sorted(requests, key=lambda r: (r.arrival_offset_s, r.index))
        params: dict[tuple[int, bool], Any] = {}
        prompts: dict[int, tuple[str, Any]] = {}
        supported = getattr(self.engine, "get_supported_tasks", None)
        renderer = PromptRenderer(self.engine, await supported() if supported is not None else None)

        def prepare(r: ServingRequest) -> None:
            if (r.output_len, r.stop_at_eos) not in params:
                params[r.output_len, r.stop_at_eos] = streaming_params(r.output_len, r.stop_at_eos)
            request_id = f"sweeper-{next(self._ids)}"
            prompts[r.index] = request_id, renderer.render(
                request_id, r.prompt_ids.tolist(), params[r.output_len, r.stop_at_eos])

        for r in ordered:
            prepare(r)
        t0 = time.monotonic()
        progress = [InFlight(r, t0 + r.arrival_offset_s) for r in ordered]

        def following(p: InFlight) -> InFlight | None:
            nxt = follow(p.served(), t0) if follow is not None else None
            if nxt is None:
                return None
            prepare(nxt)
            progress.append(InFlight(nxt, t0 + nxt.arrival_offset_s))
            return progress[-1]

        async def one(p: InFlight) -> None:
            n, stop = p.request.output_len, p.request.stop_at_eos
            request_id, prompt = prompts.pop(p.request.index)
            p.submit_s = time.monotonic()
            metrics = None
            try:
                stream = self.engine.generate(renderer.stamp(prompt), params[n, stop], request_id=request_id)
                async for out in stream:
                    now = time.monotonic()
                    p.times.extend([now] * len(out.outputs[0].token_ids))
                    if p.reply_ids is not None:
                        p.reply_ids.extend(out.outputs[0].token_ids)
                    if out.finished:
                        metrics = out.metrics
                    # Set with the request's first output (prefill done): what its prefix cache held.
                    cached = getattr(out, "num_cached_tokens", None)
                    if isinstance(cached, int):
                        p.cached_tokens = cached
            except asyncio.CancelledError:
                p.error = UNFINISHED
                raise
            except Exception as exc:  # one request's failure is the run's data, not its end
                p.error = f"{type(exc).__name__}: {exc}"[:500]
                return
            p.finish_s = p.times[-1] if p.times else time.monotonic()
            if len(p.times) > n or (len(p.times) != n and not stop):
                p.error = f"produced {len(p.times)} tokens, expected {n}"
            scheduled = float(getattr(metrics, "scheduled_ts", 0.0) or 0.0)
            if p.submit_s - CLOCK_TOLERANCE_S <= scheduled <= p.finish_s + CLOCK_TOLERANCE_S:
                p.scheduled_s = min(max(scheduled, p.submit_s), p.finish_s)

        # Each request started as it comes due, at most max_concurrency at once (actors.serving.schedule).
        await play(list(progress), one, max_concurrency=max_concurrency or None, deadline_s=deadline_s,
                   clock=time.monotonic, follow=following if follow is not None else None)
        return served_run(t0, progress, time.monotonic())

    def close(self) -> None:
        engine, self.engine = self.engine, None
        if engine is not None:
            with contextlib.suppress(Exception):
                engine.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
