"""The bundled real model on the transformers backend: replies that end where the model ends
them, in static batches and through the continuous-batching engine of serving mode.

What is tested is the backend's stopping, not the model's arithmetic, so the model runs in
fp32 and the short prompts are judged by a majority: where a reply ends rests on which token
wins a greedy pick, and bf16's rounding differs between torch builds and CPUs (issue #30: on
a newcomer's torch 2.14.1 one bf16 reply ran to the cap; alone rather than in the batch, the
bf16 reply to "Reply with only the word yes." takes 30 tokens, not 3). In fp32 the three end
after 8, 3 and 8 tokens on torch 2.13.0+cpu and 2.14.1+cu130 alike. CI runs this file
against the newest torch as well (``.ci/run``)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from actors.backends.base import ModelSpec
from actors.backends.transformers.eager import TransformersBackend
from actors.records import PromptBatch
from actors.serving.records import ServingRequest
from sweeper.core.backends import TransformersOptions

# One worker loads the real model once for the module (pytest-xdist).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("bundled-model")]

SHORT = ["What is the capital of France? Answer in one word.", "Reply with only the word yes.",
         "What is 2 + 2? Give just the number."]
LONG = ["Write a long story about a dragon who learns to paint.", "Explain in detail how a steam engine works."]
CAP = 24


def most_short_replies_end_early(lengths: list[int]) -> bool:
    """Most short replies (in fp32 here: 8, 3 and 8 tokens) end at their EOS, at most half the
    cap; with the long ones at the cap in the same run, each sequence stopped on its own."""
    return sum(n <= CAP // 2 for n in lengths[:len(SHORT)]) * 2 > len(SHORT)


@pytest.fixture(scope="module")
def loaded(smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    backend = TransformersBackend()
    info = backend.load(ModelSpec("bundled", "smollm2-135m", "fp32", TransformersOptions()))
    prompts = [np.asarray(tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                        tokenize=True, return_dict=True)["input_ids"], dtype=np.int64)
               for p in SHORT + LONG]
    yield backend, info, prompts
    backend.close()


def test_a_static_batch_stops_each_reply_at_its_eos(loaded):
    backend, info, prompts = loaded
    gen = backend.generate_batch(PromptBatch(tuple(prompts), (CAP,) * len(prompts), stop_at_eos=True))
    lengths = [r.output_tokens for r in gen.requests]
    assert most_short_replies_end_early(lengths) and all(n == CAP for n in lengths[3:]), lengths
    assert [r.prompt_tokens for r in gen.requests] == [len(p) for p in prompts]
    # Exact lengths on the same prompts: EOS suppressed, every reply to its own requested length.
    exact = backend.generate_batch(PromptBatch(tuple(prompts), (3, 5, 7, 9, 11)))
    assert [r.output_tokens for r in exact.requests] == [3, 5, 7, 9, 11]


def test_serving_requests_end_at_their_eos(loaded):
    backend, _, prompts = loaded
    requests = [ServingRequest(i, p, CAP, 0.0, stop_at_eos=True) for i, p in enumerate(prompts)]
    run = backend.serve(requests, max_concurrency=None, deadline_s=time.monotonic() + 600)
    by_index = {r.index: r for r in run.requests}
    assert all(r.ok for r in run.requests), [r.error for r in run.requests]
    lengths = [by_index[i].output_tokens for i in range(len(prompts))]
    assert most_short_replies_end_early(lengths) and max(lengths[3:]) == CAP, lengths
