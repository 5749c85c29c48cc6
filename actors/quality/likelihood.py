"""Multiple choice scored by likelihood: the choice the model finds likeliest after the prompt.

A question's generated letter (``actors.quality.accuracy``) is what the measured window paid
for; a small model often names no letter at all, or the first one. HellaSwag-style tasks, and
lm-evaluation-harness's multiple-choice scoring, ask instead which choice's text the model
gives the highest log-likelihood as the continuation of the prompt. This pass does that after
the measured window, teacher-forced with ``Backend.continuation_logprobs`` (one forward over a question's
choices on transformers, ``prompt_logprobs`` on vLLM), once per loaded model and prompt set:

- ``acc``: argmax over choices of the summed log-probabilities of the choice's tokens;
- ``acc_norm``: the same divided by the choice's length in characters.

The continuation follows the prompt as a reply would: right after a chat template's assistant
turn, after one space otherwise (lm-evaluation-harness's target delimiter). It costs no energy
that the trial reports: the pass runs outside every measured window.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from actors.backends.base import Backend
from actors.workload import DatasetSource, Prompt
from sweeper.core.datasets import LETTERS
from sweeper.core.results import ChoiceLikelihood
from sweeper.core.scoring import wilson_interval

log = logging.getLogger(__name__)


def chosen(logprobs: Sequence[float], choices: Sequence[str]) -> tuple[int, int]:
    """The likeliest choice's index, by summed log-probability and by it per character (the first
    of equals, as ``numpy.argmax``)."""
    sums = np.asarray(logprobs, dtype=np.float64)
    lengths = np.asarray([max(1, len(c)) for c in choices], dtype=np.float64)
    return int(np.argmax(sums)), int(np.argmax(sums / lengths))


def questions(source: DatasetSource) -> list[Prompt]:
    """The source's distinct prompts that have choices, in order."""
    seen: set[bytes] = set()
    out = []
    for prompt in source.prompts:
        key = prompt.ids.tobytes()
        if prompt.reference is not None and prompt.reference.choices and key not in seen:
            seen.add(key)
            out.append(prompt)
    return out


def likelihood_columns(backend: Backend, source: DatasetSource, tokenizer: Any, *, chat: bool) -> ChoiceLikelihood:
    """The trial's likelihood figures over ``source``'s questions; never raises (the status says
    what happened)."""
    if tokenizer is None:
        return ChoiceLikelihood(likelihood_status="not applicable: the model has no tokenizer to read its choices")
    asked = questions(source)
    if not asked:
        return ChoiceLikelihood(likelihood_status="not applicable: no prompt of the trial has choices")
    delimiter = "" if chat else " "
    right = right_norm = 0
    try:
        for prompt in asked:
            reference = prompt.reference
            assert reference is not None and reference.choices  # questions() keeps only these
            scores = backend.continuation_logprobs(
                prompt.ids, [tokenizer(delimiter + text, add_special_tokens=False)["input_ids"]
                             for text in reference.choices])
            by_sum, by_char = chosen(scores, reference.choices)
            answer = reference.answer.upper()
            right += LETTERS[by_sum] == answer
            right_norm += LETTERS[by_char] == answer
    except NotImplementedError as exc:
        return ChoiceLikelihood(likelihood_status=f"not applicable: {exc}"[:2000])
    except Exception as exc:
        log.exception("likelihood scoring failed")
        backend.recover()
        return ChoiceLikelihood(likelihood_status=f"failed: {type(exc).__name__}: {exc}"[:2000])
    n = len(asked)
    interval = wilson_interval(right, n)
    assert interval is not None
    return ChoiceLikelihood(likelihood_n_scored=n, likelihood_accuracy=right / n,
                            likelihood_accuracy_ci95_low=interval[0], likelihood_accuracy_ci95_high=interval[1],
                            likelihood_accuracy_norm=right_norm / n, likelihood_status="ok")
