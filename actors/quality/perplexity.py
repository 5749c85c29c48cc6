"""Perplexity of a loaded model on the bundled public-domain text (``actors.quality.corpus``).

Meaningful for real checkpoints only: it needs the checkpoint's tokenizer, and
a random-weight preset has no language to model (its perplexity is about its
vocabulary size), so synthetic models are reported as not applicable. The text
is tokenized once, cut into non-overlapping windows no longer than the model's
context (and ``MAX_WINDOW_TOKENS``), and scored teacher-forced with the same
log-probabilities the fidelity pass uses (``Backend.sequence_logprobs``: the full
distribution on transformers, ``prompt_logprobs`` on vLLM): perplexity = exp of the mean
negative log-likelihood of every token after the first of each window.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from actors.backends.base import Backend, LoadInfo
from actors.quality.corpus import PUBLIC_DOMAIN_TEXT
from sweeper.core.results import Perplexity
from sweeper.core.trial import Trial

log = logging.getLogger(__name__)

# Log-probs of one window are (tokens x vocab) float32 on the host: 512 x 128k is 256 MiB.
MAX_WINDOW_TOKENS = 512


def _columns(status: str, perplexity: float | None = None, tokens: int | None = None) -> Perplexity:
    return Perplexity(perplexity=perplexity, perplexity_tokens=tokens, perplexity_status=status)


def context_tokens(architecture: dict[str, Any] | None) -> int:
    """The longest window the model takes (its position table), capped at MAX_WINDOW_TOKENS."""
    arch = architecture or {}
    limit = arch.get("max_position_embeddings") or arch.get("n_positions") or MAX_WINDOW_TOKENS
    return max(2, min(int(limit), MAX_WINDOW_TOKENS))


def windows(token_ids: list[int], length: int) -> list[list[int]]:
    """Non-overlapping windows of at most ``length`` tokens; a last window of one token is dropped
    (it predicts nothing)."""
    out = [token_ids[i:i + length] for i in range(0, len(token_ids), length)]
    return [w for w in out if len(w) >= 2]


def perplexity_of(backend: Backend, token_ids: list[int], window_tokens: int) -> tuple[float, int]:
    """(perplexity, scored tokens) of ``token_ids`` under ``backend``."""
    nll: list[np.ndarray] = []
    for window in windows(token_ids, window_tokens):
        nll.append(-backend.sequence_logprobs(np.asarray(window, dtype=np.int64)))
    scored = np.concatenate(nll)
    return math.exp(float(scored.mean())), int(scored.size)


def perplexity_columns(trial: Trial, backend: Backend, load: LoadInfo) -> Perplexity:
    """The perplexity columns of ``trial`` (loaded in ``backend``); never raises."""
    if trial.model_source == "synthetic":
        return _columns("not applicable: a synthetic (random-weight) model has no tokenizer "
                        "and no language to model")
    try:
        from transformers import AutoTokenizer

        from actors.models import model_dir

        tokenizer = AutoTokenizer.from_pretrained(model_dir(trial.model_source, trial.model_location))
    except Exception as exc:
        return _columns(f"not applicable: no tokenizer for {trial.model_location} "
                        f"({type(exc).__name__}: {exc})"[:2000])
    try:
        token_ids = list(tokenizer(PUBLIC_DOMAIN_TEXT)["input_ids"])
        value, tokens = perplexity_of(backend, token_ids, context_tokens(load.architecture))
    except NotImplementedError as exc:
        return _columns(f"not applicable: {exc}")
    except Exception as exc:
        log.exception("perplexity failed")
        backend.recover()
        return _columns(f"failed: {type(exc).__name__}: {exc}"[:2000])
    return _columns("ok", value, tokens)
