"""A trial's prompts on the actor: a dataset's text tokenized, filtered and sampled; random ids."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from actors.workload import (
    BYTES_PER_TOKEN_FALLBACK,
    DatasetSource,
    NoPromptsLeft,
    RandomSource,
    dataset_prompts,
)
from sweeper.core.datasets import BUNDLED_FILE, read_records
from sweeper.plan.expand import dataset_settings
from sweeper.plan.spec import parse_sweep


def settings_for(path, **workload):
    sweep = parse_sweep({"name": "w", "models": "tiny-llama", "backends": "noop", "precisions": "bf16",
                         "batch_sizes": 2, "workload": {"dataset": str(path), "output_len": 16, **workload}})
    return dataset_settings(sweep)


def write(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_without_a_tokenizer_a_prompt_is_its_bytes_over_four_in_random_ids(tmp_path):
    texts = ["x" * 3, "y" * 40, "z" * 401]
    path = write(tmp_path / "p.jsonl", [{"prompt": t} for t in texts])
    prompts = dataset_prompts(settings_for(path), None, vocab_size=100, seed=0, output_lengths="fixed", cap=16)
    assert sorted(len(p.ids) for p in prompts) == [math.ceil(len(t) / BYTES_PER_TOKEN_FALLBACK) for t in texts]
    assert all(p.output_len == 16 and p.ids.min() >= 8 and p.ids.max() < 100 for p in prompts)


def test_length_bounds_filter_and_num_prompts_samples_with_the_seed(tmp_path):
    path = write(tmp_path / "p.jsonl", [{"prompt": "w" * (4 * n)} for n in range(1, 41)])  # 1..40 tokens
    settings = settings_for(path, min_input_len=10, max_input_len=20, num_prompts=5)
    draw = [len(p.ids) for p in dataset_prompts(settings, None, 100, seed=1, output_lengths="fixed", cap=4)]
    assert len(draw) == 5 and all(10 <= n <= 20 for n in draw)
    again = [len(p.ids) for p in dataset_prompts(settings, None, 100, seed=1, output_lengths="fixed", cap=4)]
    other = [len(p.ids) for p in dataset_prompts(settings, None, 100, seed=2, output_lengths="fixed", cap=4)]
    assert draw == again and draw != other
    # The model's context bounds them too: 20 prompt tokens + 4 output need 24 positions.
    short = dataset_prompts(settings_for(path, min_input_len=10), None, 100, 0, output_lengths="fixed", cap=4,
                            max_positions=18)
    assert max(len(p.ids) for p in short) == 14


def test_no_prompt_within_the_bounds_is_an_error_naming_them(tmp_path):
    path = write(tmp_path / "p.jsonl", [{"prompt": "short"}])
    with pytest.raises(NoPromptsLeft, match="none of its 1 prompts is within min_input_len 50"):
        dataset_prompts(settings_for(path, min_input_len=50), None, 100, 0, output_lengths="fixed", cap=4)


def test_reference_lengths_come_from_the_record_capped(tmp_path):
    path = write(tmp_path / "p.jsonl", [{"prompt": "a", "output_len": 3}, {"prompt": "b", "output_len": 300},
                                        {"prompt": "c", "completion": "r" * 22}])
    settings = settings_for(path, output_len="reference", max_output_len=64)
    lengths = [p.output_len for p in dataset_prompts(settings, None, 100, 0, output_lengths="reference", cap=64)]
    assert sorted(lengths) == [3, math.ceil(22 / BYTES_PER_TOKEN_FALLBACK), 64]


def test_a_node_with_another_file_refuses_it(tmp_path):
    path = write(tmp_path / "p.jsonl", [{"prompt": "a"}])
    settings = settings_for(path)
    write(path, [{"prompt": "b"}])
    with pytest.raises(FileNotFoundError, match="differs from the file the plan read"):
        dataset_prompts(settings, None, 100, 0, output_lengths="fixed", cap=4)


def test_batches_and_requests_cycle_through_the_sample():
    from actors.workload import Prompt

    prompts = [Prompt(np.arange(n, dtype=np.int64), 5) for n in (2, 3, 4)]
    source = DatasetSource(prompts, stop_at_eos=True)
    batch = source.batch(0, 2)
    assert [len(p) for p in batch.prompts] == [2, 3] and batch.stop_at_eos and batch.as_uniform() is None
    assert [len(p) for p in source.batch(1, 2).prompts] == [4, 2]
    assert [len(p) for p in source.batch(-1, 2).prompts] == [3, 4]  # warm-up: the tail
    assert [len(p.ids) for p in source.requests(4, stream=0)] == [2, 3, 4, 2]


def test_random_prompts_are_one_uniform_shape():
    source = RandomSource(vocab_size=50, input_len=6, output_len=3, seed=0)
    ids, n = source.batch(0, 4).as_uniform()
    assert ids.shape == (4, 6) and n == 3 and not source.varies()


def test_the_model_s_tokenizer_and_chat_template(tmp_path, smollm2_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    path = write(tmp_path / "p.jsonl", [{"prompt": "What is the capital of France?",
                                         "completion": "The capital of France is Paris."}])
    plain = dataset_prompts(settings_for(path), tokenizer, 49152, 0, output_lengths="reference", cap=64)[0]
    chat = dataset_prompts(settings_for(path, chat=True), tokenizer, 49152, 0, output_lengths="reference",
                           cap=64)[0]
    assert list(plain.ids) == tokenizer("What is the capital of France?")["input_ids"]
    # The template wraps it as a user turn (a system turn and role markers around it).
    assert len(chat.ids) > len(plain.ids) + 4 and tokenizer.decode(chat.ids).rstrip().endswith("assistant")
    assert plain.output_len == len(tokenizer("The capital of France is Paris.", add_special_tokens=False)["input_ids"])


def test_the_bundled_set_tokenizes_with_the_fallback():
    settings = settings_for(BUNDLED_FILE, num_prompts=50)
    prompts = dataset_prompts(settings, None, 2048, 0, output_lengths="fixed", cap=8)
    lengths = [len(p.ids) for p in prompts]
    assert len(prompts) == 50 and min(lengths) < 20 and max(lengths) > 60  # instructions and passages
    assert len(read_records(BUNDLED_FILE)) == settings.records
