"""The data plane's value records, at the bottom of ``actors``: what a generate call returns
(``Generation`` of ``RequestTiming``), what it is asked (``PromptBatch``), and a serving engine's
top-k log-probabilities (``TopK``). Every layer above reads them; they import nothing of
``actors`` (the served request and run records are ``actors.serving.records``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RequestTiming:
    """One sequence of a generate call, on the actor's monotonic clock."""

    t_start_s: float
    t_first_token_s: float
    t_end_s: float
    output_tokens: int
    prompt_tokens: int | None = None  # None: the batch's common prompt length
    # The reply's token ids, where the batch asked for them (``PromptBatch.keep_replies``: a
    # scored trial); None otherwise, so that a long window holds no replies it never reads.
    reply_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class PromptBatch:
    """The sequences of one generate call: prompts of any lengths, each with the output
    length it asks for (exact; or, with ``stop_at_eos``, its cap)."""

    prompts: tuple[np.ndarray, ...]  # (tokens,) int64 each
    output_lens: tuple[int, ...]
    stop_at_eos: bool = False
    # Return each reply's token ids (``RequestTiming.reply_ids``): a scored trial judges them.
    keep_replies: bool = False

    @classmethod
    def uniform(cls, prompt_ids: np.ndarray, output_len: int) -> PromptBatch:
        return cls(tuple(prompt_ids), (output_len,) * len(prompt_ids))

    def as_uniform(self) -> tuple[np.ndarray, int] | None:
        """(batch, len) ids and the output length when every sequence has the same shape and
        runs to its exact length; None otherwise."""
        if self.stop_at_eos or len(set(self.output_lens)) != 1 or len({len(p) for p in self.prompts}) != 1:
            return None
        return np.stack(self.prompts), self.output_lens[0]

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


@dataclass(frozen=True)
class Generation:
    """One generate call: its span, its requests and its phase marks."""

    t_start_s: float
    t_end_s: float
    requests: tuple[RequestTiming, ...]
    # (phase, t0, t1) intervals: "prefill" and "decode" for energy attribution
    marks: tuple[tuple[str, float, float], ...] = ()
    # A static batch (prompts padded to the longest, every sequence held until the longest
    # reply ends); False where the engine batches continuously inside the call (vLLM).
    static_batch: bool = True

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)


@dataclass(frozen=True)
class TopK:
    """The k most likely next tokens per position, most likely first: ids and log-probabilities,
    each (..., k)."""

    ids: np.ndarray
    logprobs: np.ndarray

    @property
    def k(self) -> int:
        return int(self.ids.shape[-1])

    def __getitem__(self, index: int | slice) -> TopK:
        return TopK(self.ids[index], self.logprobs[index])


def topk_of(logprobs: np.ndarray, k: int) -> TopK:
    """The top k of full log-probabilities (..., vocab), most likely first; equal values in
    token-id order, as ``argmax`` breaks ties (bf16 logits tie often), so the first entry is
    the argmax and top-1 agreement is the same number by either method."""
    k = min(k, logprobs.shape[-1])
    part = np.sort(np.argpartition(-logprobs, k - 1, axis=-1)[..., :k], axis=-1)
    values = np.take_along_axis(logprobs, part, axis=-1)
    order = np.argsort(-values, axis=-1, kind="stable")  # stable: ties stay in id order
    return TopK(np.take_along_axis(part, order, axis=-1).astype(np.int64),
                np.take_along_axis(values, order, axis=-1).astype(np.float32))
