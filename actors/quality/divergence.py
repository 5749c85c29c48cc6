"""How far two next-token distributions are apart: exact KL over the vocabulary, or an
estimate from the top-k log-probabilities a serving engine returns.

Full distributions (``kl_per_position``): KL(reference || trial) in float64 from float32
log-softmax outputs, each renormalized in float64, so identical inputs give exactly 0 and
KL is never negative.

Top-k (``kl_topk``): vLLM returns, per position, the k most likely tokens and their
log-probabilities, nothing about the rest. The estimate is KL over a coarser space: the
reference's top-k tokens, each on its own, plus one bucket for every other token. For a
reference token missing from the trial's top k, the trial's probability is taken to be
its k-th (lowest listed) probability, the most it can be. When every reference token is in
the trial's top k, the estimate is the exact KL of the coarser space, which merging
tokens can only make smaller than the full KL (the data-processing inequality); a missing
token's stand-in value moves the estimate either way by a little. On transformers, which
returns both, the tests compare the two.
"""

from __future__ import annotations

import numpy as np

from actors.records import TopK


def _normalized(logprobs: np.ndarray) -> np.ndarray:
    lp = logprobs.astype(np.float64)
    top = lp.max(axis=-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    return lp - (top + np.log(np.exp(lp - top).sum(axis=-1, keepdims=True)))


def kl_per_position(ref_logprobs: np.ndarray, trial_logprobs: np.ndarray) -> np.ndarray:
    """KL(reference || trial) at each position (float64), from log-probs over the last axis."""
    p_log, q_log = _normalized(ref_logprobs), _normalized(trial_logprobs)
    p = np.exp(p_log)
    with np.errstate(invalid="ignore"):
        # 0 * log(0 / q) is 0, also where q is 0 too (-inf - -inf).
        terms = np.where(p > 0, p * (p_log - q_log), 0.0)
    return terms.sum(axis=-1)


def top1_agreement(ref_logprobs: np.ndarray, trial_logprobs: np.ndarray) -> np.ndarray:
    return ref_logprobs.argmax(axis=-1) == trial_logprobs.argmax(axis=-1)


# A bucket's probability is never taken below this (the listed mass can round past 1).
_FLOOR = 1e-12


def kl_topk(reference: TopK, trial: TopK) -> np.ndarray:
    """The top-k estimate of KL(reference || trial) at each position (float64), shape (...)."""
    p = np.exp(reference.logprobs.astype(np.float64))
    q_listed = np.exp(trial.logprobs.astype(np.float64))
    # The trial's probability of each of the reference's tokens: listed, or at most its k-th.
    match = reference.ids[..., :, None] == trial.ids[..., None, :]
    found = match.any(axis=-1)
    q = np.where(found, (match * q_listed[..., None, :]).sum(axis=-1), q_listed[..., -1:])
    p_rest = np.clip(1.0 - p.sum(axis=-1), _FLOOR, 1.0)
    q_rest = np.clip(1.0 - q.sum(axis=-1), _FLOOR, 1.0)
    terms = np.where(p > 0, p * (np.log(np.maximum(p, _FLOOR)) - np.log(np.maximum(q, _FLOOR))), 0.0)
    kl = terms.sum(axis=-1) + p_rest * (np.log(p_rest) - np.log(q_rest))
    return np.maximum(kl, 0.0)


def top1_agreement_topk(reference: TopK, trial: TopK) -> np.ndarray:
    return reference.ids[..., 0] == trial.ids[..., 0]
