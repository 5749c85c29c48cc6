"""Prompts and replies of varying length through the measurement loops (noop backend, virtual
time): what static batches waste, reply-length statistics, per-request energy shares."""

from __future__ import annotations

import numpy as np
import pytest

from actors.backends.base import ModelSpec
from actors.backends.noop import NoopBackend, simulated_reply_len
from actors.backends.transformers.eager import eos_reply_lengths
from actors.measure import call_request_energies, lengths, measure_trial, request_records
from actors.records import Generation, PromptBatch, RequestTiming
from actors.serving_measure import measure_serving_trial
from actors.telemetry import NullTelemetry
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.actors.test_measure import FakeClock


def trial_of(workload: dict, **top):
    sweep = parse_sweep({"name": "v", "models": "tiny-llama", "backends": "noop", "precisions": "bf16",
                         "workload": {"dataset": "bundled", **workload},
                         "backend_options": {"noop": {"step_s": 0.01}},
                         "measure": {"warmup_iters": 1, "min_iters": 4, "min_duration_s": 0, "idle_s": 0,
                                     "min_window_s": 0}, **top})
    return expand(sweep)[0][0]


def run(trial, serving: bool = False):
    backend, clock = NoopBackend(), FakeClock()
    backend.clock, backend.sleep = clock, clock.sleep
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "bf16", trial.backend_options))
    measure = measure_serving_trial if serving else measure_trial
    return measure(backend, trial, load, NullTelemetry(reason="test"), clock=clock)


def test_natural_replies_vary_and_the_batch_waits_for_its_longest():
    m = run(trial_of({"output_len": "natural", "max_output_len": 32, "num_prompts": 16}, batch_sizes=4))
    outputs = [r.output_tokens for r in m.requests]
    assert len(set(outputs)) > 3 and max(outputs) <= 32 and min(outputs) >= 1
    row = m.row
    assert row["output_tokens"] == sum(outputs)  # per-token figures divide by tokens produced
    assert row["output_len_mean"] == pytest.approx(np.mean(outputs))
    assert 0 < row["decode_idle_slot_share"] < 1 and 0 < row["prompt_pad_share"] < 1
    assert len({r.input_len for r in m.requests}) > 3
    # Iterations differ in work by design: their CV is recorded, and judges nothing (not even
    # noisy_host); the window is judged by its interval alone.
    assert row["iteration_throughput_cv"] > 0.05 and row["noisy_host"] is None
    assert "CV" not in (row["unstable_reason"] or "")


def test_reference_lengths_are_the_bundled_set_s():
    m = run(trial_of({"output_len": "reference", "max_output_len": 1000, "num_prompts": 8}, batch_sizes=2))
    from sweeper.core.datasets import BUNDLED_FILE, read_records

    stated = {r.output_len for r in read_records(BUNDLED_FILE)}
    assert {r.output_tokens for r in m.requests} <= stated


def test_the_waste_of_a_static_batch_by_hand():
    def gen(prompts, outputs):
        reqs = tuple(RequestTiming(0.0, 0.1, 1.0, o, p) for p, o in zip(prompts, outputs, strict=True))
        return Generation(0.0, 1.0, reqs)

    gens = [gen([4, 2], [3, 1]), gen([5, 5], [2, 2])]
    got = lengths(gens, request_records("t", gens, 0.0, None))
    # prompts padded to 4 and 5: 2 pads of 18 slots; replies run 3 and 2 steps: 2 idle of 10 slots.
    assert got.prompt_pad_share == pytest.approx(2 / 18)
    assert got.decode_idle_slot_share == pytest.approx(2 / 10)
    assert got.output_len_mean == 2.0 and got.input_len_mean == 4.0
    # An engine that batches continuously inside the call (vLLM) pads nothing: no waste to report.
    continuous = [Generation(g.t_start_s, g.t_end_s, g.requests, static_batch=False) for g in gens]
    got = lengths(continuous, request_records("t", continuous, 0.0, None))
    assert got.prompt_pad_share is None and got.decode_idle_slot_share is None


def test_request_energies_split_each_call_by_tokens_and_sum_to_the_window():
    def gen(prompts, outputs):
        return Generation(0.0, 1.0, tuple(RequestTiming(0.0, 0.1, 1.0, o, p) for p, o in zip(prompts, outputs,
                                                                                            strict=True)))
    gens = [gen([3, 1], [1, 3]), gen([6, 2], [2, 2])]
    energies = call_request_energies(gens, None, energy_j=30.0, call_energies_j=[8.0, 16.0])
    assert sum(energies) == pytest.approx(30.0)
    # call 1: 4 and 4 tokens -> 4 J each; call 2: 8 and 4 tokens -> 32/3 and 16/3; the 6 J between
    # calls by tokens over all 20: 1.2, 1.2, 2.4, 1.2.
    assert energies == pytest.approx([5.2, 5.2, 32 / 3 + 2.4, 16 / 3 + 1.2])


def test_serving_requests_end_at_their_simulated_eos():
    trial = trial_of({"mode": "serving", "output_len": "natural", "max_output_len": 24, "num_prompts": 30,
                      "request_rate": 50})
    m = run(trial, serving=True)
    outputs = [r.output_tokens for r in m.requests]
    assert len(set(outputs)) > 5 and max(outputs) <= 24
    assert m.row["output_len_mean"] == pytest.approx(np.mean(outputs))


def test_reply_lengths_count_the_first_eos_and_cap_the_rest():
    new = np.array([[5, 2, 0, 0], [5, 6, 7, 8], [2, 0, 0, 0]])
    assert eos_reply_lengths(new, 2, caps=(4, 4, 4)) == [2, 4, 1]
    assert eos_reply_lengths(new, [2, 7], caps=(4, 4, 4)) == [2, 3, 1]
    assert eos_reply_lengths(new, None, caps=(4, 3, 4)) == [4, 3, 4]


def test_the_simulated_reply_is_a_function_of_the_prompt():
    ids = np.arange(10, 30, dtype=np.int64)
    assert simulated_reply_len(ids, 50) == simulated_reply_len(ids.copy(), 50)
    assert 1 <= simulated_reply_len(ids, 5) <= 5
    batch = PromptBatch((ids, ids[:5]), (8, 8), stop_at_eos=True)
    assert batch.as_uniform() is None and batch.prompt_tokens == 25
