"""Serving requests rendered for vLLM's engine core before a run's clock starts.

Why. ``AsyncLLM.add_request`` turns a prompt into an ``EngineCoreRequest`` inline, on the
event loop that also dispatches the run's arrivals: it validates the request, clones the
sampling parameters and applies the model's generation-config defaults before handing it
to the engine core. At ``request_rate: inf`` every request is due at once, so the k-th one
leaves after k such renderings: on an H100 (vLLM 0.26, 240 requests) the in-process
client's send lateness reached p99 30 ms where an HTTP client of ``vllm serve`` (whose
server renders after the client has sent) kept 5 ms. Rendering every request before the
clock leaves the loop only the hand-over itself (the output processor's state and the
message to the engine core), as an HTTP client is left only its send.

Versions. vLLM 0.26's and 0.34's ``generate`` take an ``EngineCoreRequest`` (with a deprecation
warning, in favour of a renderer's ``EngineInput``, which it still processes inline). An
engine that no longer takes one, or has no ``input_processor``, is given the token prompt to
render inline as before: slower to send, and the lateness rule then says so.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from typing import Any


async def async_llm(engine_kwargs: dict[str, Any]) -> Any:
    """vLLM's V1 async engine, made on the loop that will serve it."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs))


def streaming_params(output_len: int, stop_at_eos: bool) -> Any:
    """Greedy, streamed as deltas; exactly ``output_len`` tokens (EOS ignored), or up to it."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    exact = {} if stop_at_eos else {"min_tokens": output_len, "ignore_eos": True}
    return SamplingParams(max_tokens=output_len, temperature=0.0, detokenize=False,
                          output_kind=RequestOutputKind.DELTA, **exact)


def takes_rendered(engine: Any) -> bool:
    """Whether ``engine.generate`` accepts a pre-built ``EngineCoreRequest`` (a feature check:
    the prompt parameter's annotation names it, as in vLLM 0.26 and 0.34)."""
    if getattr(engine, "input_processor", None) is None:
        return False
    try:
        prompt = inspect.signature(engine.generate).parameters.get("prompt")
    except (TypeError, ValueError):
        return False
    return prompt is not None and "EngineCoreRequest" in str(prompt.annotation)


class PromptRenderer:
    """Makes each request's prompt in the form ``engine.generate`` takes fastest."""

    def __init__(self, engine: Any, supported_tasks: Sequence[str] | None) -> None:
        self.engine = engine
        self.supported_tasks = tuple(supported_tasks) if supported_tasks is not None else None
        self.rendered = self.supported_tasks is not None and takes_rendered(engine)

    def render(self, request_id: str, prompt_ids: list[int], params: Any) -> Any:
        """The prompt to hand ``generate``: an ``EngineCoreRequest`` where the engine takes one,
        else the token prompt (rendered inline at the send)."""
        prompt = {"prompt_token_ids": prompt_ids}
        if not self.rendered:
            return prompt
        try:
            return self.engine.input_processor.process_inputs(
                request_id, prompt, params, supported_tasks=self.supported_tasks)
        except Exception:  # noqa: BLE001 - refused (too long, ...): the send then fails, as one request's error
            return prompt

    @staticmethod
    def stamp(prompt: Any) -> Any:
        """At the send: a rendered request's arrival is now (vLLM's own queueing and latency
        figures count from it), not when it was rendered."""
        if not isinstance(prompt, dict):
            prompt.arrival_time = time.time()
        return prompt
