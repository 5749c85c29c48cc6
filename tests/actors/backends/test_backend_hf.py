"""The transformers backend on a real tiny model: exact lengths, timing order, seeded weights."""

from __future__ import annotations

import numpy as np
import pytest

from actors.backends import create_backend
from actors.backends.base import ModelSpec
from sweeper.core.backends import BACKENDS


@pytest.fixture(scope="module")
def backend():
    b = create_backend("transformers")
    b.load(ModelSpec("synthetic", "tiny-llama", "fp32", BACKENDS["transformers"].default_options(), seed=0))
    yield b
    b.close()


def test_load_reports_device_and_footprint(backend):
    assert backend.device == "cpu"
    info = backend.load(ModelSpec("synthetic", "tiny-llama", "bf16", BACKENDS["transformers"].default_options()))
    assert info.weight_memory_bytes > 0 and info.vocab_size == 2048
    import torch

    assert next(backend.model.parameters()).dtype == torch.bfloat16
    backend.load(ModelSpec("synthetic", "tiny-llama", "fp32", BACKENDS["transformers"].default_options()))


def test_exact_output_length_even_when_eos_is_the_greedy_choice(backend):
    prompts = np.random.default_rng(0).integers(8, 2048, size=(3, 12))
    import torch

    with torch.inference_mode():
        free = backend.model.generate(torch.from_numpy(prompts), attention_mask=torch.ones(3, 12, dtype=torch.long),
                                      max_new_tokens=1, do_sample=False)
    greedy_first = int(free[0, -1])
    old_eos = backend.model.generation_config.eos_token_id
    backend.model.generation_config.eos_token_id = greedy_first  # stopping would cut sequence 0 at once
    try:
        gen = backend.generate(prompts, output_len=7)
    finally:
        backend.model.generation_config.eos_token_id = old_eos
    assert gen.output_tokens == 3 * 7
    assert all(r.output_tokens == 7 for r in gen.requests)


def test_timing_marks_are_ordered(backend):
    gen = backend.generate(np.random.default_rng(1).integers(8, 2048, size=(2, 16)), output_len=5)
    r = gen.requests[0]
    assert gen.t_start_s == r.t_start_s < r.t_first_token_s < r.t_end_s == gen.t_end_s
    phases = dict((p, (a, b)) for p, a, b in gen.marks)
    assert phases["prefill"] == (r.t_start_s, r.t_first_token_s)
    assert phases["decode"] == (r.t_first_token_s, r.t_end_s)


def test_synthetic_weights_are_seeded():
    specs = [ModelSpec("synthetic", "tiny-qwen2", "fp32", BACKENDS["transformers"].default_options(), seed=s)
             for s in (3, 3, 4)]
    weights = []
    for spec in specs:
        b = create_backend("transformers")
        b.load(spec)
        weights.append(b.model.model.layers[0].mlp.up_proj.weight.detach().clone())
        b.close()
    assert (weights[0] == weights[1]).all()
    assert not (weights[0] == weights[2]).all()


def test_serving_on_a_cpu_holds_a_bounded_kv_cache(backend):
    """transformers' own sizing on a CPU takes 60 % of the host's free memory (13.7 GB on a
    24 GB machine) and zeroes it; on a CPU the engine gets sweeper's bound instead."""
    import time

    from actors.serving.records import ServingRequest
    from sweeper.core.continuous_batching import CPU_KV_CACHE_PAGES, CPU_MAX_BATCH_TOKENS

    requests = [ServingRequest(i, np.arange(8 + i, 16 + i), 4, 0.0) for i in range(3)]
    run = backend.serve(requests, max_concurrency=None, deadline_s=time.monotonic() + 120)
    assert [r.output_tokens for r in run.requests] == [4, 4, 4]
    cache = backend._serving.manager.batch_processor.cache
    assert (cache.num_blocks, cache.max_batch_tokens) == (CPU_KV_CACHE_PAGES, CPU_MAX_BATCH_TOKENS)
