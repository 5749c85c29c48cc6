"""Perplexity on the bundled public-domain text, with a real local checkpoint and its tokenizer."""

from __future__ import annotations

import json
import math

import duckdb
import numpy as np
import pytest

from actors.backends import create_backend
from actors.backends.base import LoadInfo, ModelSpec
from actors.quality.corpus import PUBLIC_DOMAIN_TEXT
from actors.quality.perplexity import (
    MAX_WINDOW_TOKENS,
    context_tokens,
    perplexity_columns,
    perplexity_of,
    windows,
)
from sweeper.core.backends import BACKENDS
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def checkpoint_with_tokenizer(tmp_path_factory):
    """A real checkpoint directory: a word-level tokenizer trained on the corpus (offline),
    and a 2-layer GPT-2 config sized to it whose weights transformers initializes."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    d = tmp_path_factory.mktemp("ckpt")
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([PUBLIC_DOMAIN_TEXT], trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="[EOS]")
    fast.save_pretrained(d)
    (d / "config.json").write_text(json.dumps({
        "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": tok.get_vocab_size(),
        "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 2, "eos_token_id": 1, "bos_token_id": 1,
    }))
    from safetensors.numpy import save_file

    save_file({}, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d, fast


def test_uniform_model_has_perplexity_equal_to_its_vocabulary():
    from actors.backends.noop import NoopBackend
    from actors.quality.perplexity import perplexity_of

    class Uniform(NoopBackend):
        """The arithmetic only: every next token equally likely, slightly off normalization."""

        def next_token_logprobs(self, token_ids, last=None):
            return np.full((*token_ids.shape, 50), -math.log(50) + 1e-4, dtype=np.float32)

    value, tokens = perplexity_of(Uniform(), list(range(10)), window_tokens=4)
    assert value == pytest.approx(50, rel=1e-6) and tokens == 3 + 3 + 1


def test_windows_fit_the_context_and_drop_what_predicts_nothing():
    assert windows(list(range(10)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert windows(list(range(9)), 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]  # [8] alone predicts nothing
    assert context_tokens({"n_positions": 64}) == 64
    assert context_tokens({"max_position_embeddings": 131072}) == MAX_WINDOW_TOKENS
    assert context_tokens(None) == MAX_WINDOW_TOKENS


def test_real_checkpoint_gets_a_perplexity_and_a_synthetic_one_says_why(checkpoint_with_tokenizer):
    path, tokenizer = checkpoint_with_tokenizer
    backend = create_backend("transformers")
    load = backend.load(ModelSpec(source="path", location=str(path), precision="fp32",
                                  options=BACKENDS["transformers"].default_options(), seed=0))
    ids = tokenizer(PUBLIC_DOMAIN_TEXT)["input_ids"]
    value, tokens = perplexity_of(backend, ids, context_tokens(load.architecture))
    # Every token after the first of each 64-token window is scored.
    assert tokens == sum(len(w) - 1 for w in windows(ids, 64)) and tokens > 300
    # Random weights: about the vocabulary size (uniform), never below 1.
    vocab = tokenizer.vocab_size
    assert 0.3 * vocab < value < 3 * vocab

    (trial,) = expand(parse_sweep({"name": "p", "models": str(path), "precisions": "fp32", "batch_sizes": 1,
                                   "workload": {"input_len": 8, "output_len": 4},
                                   "fidelity": {"reference": "fp32", "perplexity": True}}),
                      check_hub=False)[0]
    cols = perplexity_columns(trial, backend, load)
    assert cols.perplexity_status == "ok" and cols.perplexity == pytest.approx(value)

    (synthetic,) = expand(parse_sweep({"name": "p", "models": "tiny-llama", "precisions": "fp32",
                                       "batch_sizes": 1, "workload": {"input_len": 8, "output_len": 4}}))[0]
    cols = perplexity_columns(synthetic, backend, LoadInfo("cpu", "cpu", None, 512))
    assert cols.perplexity is None and cols.perplexity_status is not None
    assert cols.perplexity_status.startswith("not applicable: a synthetic")


@pytest.mark.slow
def test_sweep_with_perplexity_fills_the_columns_for_every_precision(checkpoint_with_tokenizer, tmp_path):
    path, _ = checkpoint_with_tokenizer
    sweep = tmp_path / "ppl.yaml"
    sweep.write_text(f"""
name: ppl
models: ["{path}"]
precisions: [fp32, bf16]
batch_sizes: 1
workload: {{input_len: 8, output_len: 4}}
measure: {{warmup_iters: 0, min_iters: 1, min_duration_s: 0, idle_s: 0}}
fidelity: {{reference: fp32, prompts: 2, prompt_len: 8, continuation_len: 4, perplexity: true}}
""")
    r = run_cli("run", str(sweep), "-o", str(tmp_path / "out"), "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = duckdb.sql(f"SELECT precision, perplexity, perplexity_tokens, perplexity_status, fidelity_status "
                      f"FROM '{tmp_path}/out/trials.parquet' ORDER BY precision").fetchall()
    assert [(p, s, f) for p, _, _, s, f in rows] == [("bf16", "ok", "ok"), ("fp32", "ok", "reference")]
    (_, ppl_bf16, n, _, _), (_, ppl_fp32, n32, _, _) = rows
    assert n == n32 > 300
    # Same weights, rounding apart: bf16's perplexity is close to fp32's but its own number.
    assert ppl_bf16 == pytest.approx(ppl_fp32, rel=0.05)
