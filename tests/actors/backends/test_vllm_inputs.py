"""The in-process vLLM serving path renders every request before its clock starts.

vLLM cannot run on a CPU machine, so the engine here is a scripted stand-in with the
surface ``AsyncEngineRunner`` uses (``get_supported_tasks``, ``input_processor``,
``generate``); the H100 evidence (send lateness at ``request_rate: inf``) is in
BENCHMARKS. What is checked here is the order of events, not anyone's speed.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import actors.backends.vllm.serving as serving
from actors.backends.vllm.inputs import PromptRenderer, takes_rendered
from actors.serving.records import ServingRequest


class Rendered:
    """What the scripted engine's input processor makes of a prompt (vLLM: EngineCoreRequest)."""

    def __init__(self, request_id: str, prompt_ids: list[int], at_s: float) -> None:
        self.request_id, self.prompt_ids, self.rendered_s = request_id, prompt_ids, at_s
        self.arrival_time: float | None = None


class ScriptedEngine:
    """An async engine that logs each rendering and each send, and streams ``output_len`` tokens."""

    def __init__(self, renders: bool) -> None:
        self.log: list[tuple[str, Any]] = []
        if renders:
            self.input_processor = SimpleNamespace(process_inputs=self._process_inputs)

    async def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def _process_inputs(self, request_id: str, prompt: dict[str, list[int]], params: Any, *,
                        supported_tasks: tuple[str, ...]) -> Rendered:
        assert supported_tasks == ("generate",)
        if len(prompt["prompt_token_ids"]) > 16:
            raise ValueError("prompt longer than the model's context")
        self.log.append(("render", request_id))
        return Rendered(request_id, prompt["prompt_token_ids"], time.time())

    async def generate(self, prompt: EngineCoreRequest | dict[str, list[int]], sampling_params: Any,  # noqa: F821
                       request_id: str):
        self.log.append(("send", prompt))
        if isinstance(prompt, dict) and len(prompt["prompt_token_ids"]) > 16:
            raise ValueError("prompt longer than the model's context")
        n = sampling_params["max_tokens"]
        for k in range(n):
            yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[k])], finished=k == n - 1,
                                  metrics=None, num_cached_tokens=0)

    def shutdown(self) -> None:
        pass


@pytest.fixture
def runner_for(monkeypatch):
    monkeypatch.setattr(serving, "streaming_params", lambda n, stop: {"max_tokens": n})
    made = []

    def make(engine: ScriptedEngine) -> serving.AsyncEngineRunner:
        async def create(kwargs: dict[str, Any]) -> ScriptedEngine:
            return engine
        made.append(serving.AsyncEngineRunner({}, start_timeout_s=10, create=create))
        return made[-1]

    yield make
    for runner in made:
        runner.close()


def burst(n: int, prompt_len: int = 8) -> list[ServingRequest]:
    return [ServingRequest(i, np.arange(prompt_len), 3, 0.0) for i in range(n)]


def test_every_request_is_rendered_before_the_first_send(runner_for):
    engine = ScriptedEngine(renders=True)
    run = runner_for(engine).serve(burst(40), max_concurrency=None, deadline_s=time.monotonic() + 30)
    kinds = [kind for kind, _ in engine.log]
    assert kinds == ["render"] * 40 + ["send"] * 40
    sent = [prompt for kind, prompt in engine.log if kind == "send"]
    assert all(isinstance(p, Rendered) for p in sent)
    # Its arrival is the send, not the rendering (vLLM's own figures count from it).
    assert all(p.arrival_time is not None and p.arrival_time >= p.rendered_s for p in sent)
    assert len({p.request_id for p in sent}) == 40
    assert all(r.ok and r.output_tokens == 3 for r in run.requests)


def test_a_request_the_renderer_refuses_fails_alone_at_its_send(runner_for):
    engine = ScriptedEngine(renders=True)
    requests = burst(3) + [ServingRequest(3, np.arange(32), 3, 0.0)]
    run = runner_for(engine).serve(requests, max_concurrency=None, deadline_s=time.monotonic() + 30)
    by_index = {r.index: r for r in run.requests}
    assert [by_index[i].ok for i in range(4)] == [True, True, True, False]
    assert "longer than the model's context" in by_index[3].error


def test_an_engine_that_takes_no_rendered_request_gets_token_prompts(runner_for):
    engine = ScriptedEngine(renders=False)
    run = runner_for(engine).serve(burst(5), max_concurrency=2, deadline_s=time.monotonic() + 30)
    assert [kind for kind, _ in engine.log] == ["send"] * 5
    assert all(p == {"prompt_token_ids": list(range(8))} for _, p in engine.log)
    assert all(r.ok for r in run.requests)


def test_rendering_is_a_feature_check_on_generate_s_prompt_type():
    class Untyped:
        input_processor = object()

        async def generate(self, prompt, sampling_params, request_id):
            yield None

    assert takes_rendered(ScriptedEngine(renders=True))
    assert not takes_rendered(ScriptedEngine(renders=False))  # no input processor
    assert not takes_rendered(Untyped())  # generate does not say it takes EngineCoreRequest
    assert not PromptRenderer(ScriptedEngine(renders=True), supported_tasks=None).rendered
