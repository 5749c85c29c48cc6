"""The interface every backend implements (the records it returns: ``actors.records``)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel

from actors.backends.speculation import SpeculationCounts
from actors.records import Generation, PromptBatch, TopK, topk_of
from actors.serving.client import Follow
from actors.serving.records import ServedRun, ServingRequest
from sweeper.core.results import Compile, ServerSetup
from sweeper.core.secrets import SecretValues

Options = TypeVar("Options", bound=BaseModel)


@dataclass(frozen=True)
class LoadInfo:
    device: str  # "cuda" | "cpu"
    device_name: str
    weight_memory_bytes: int | None
    vocab_size: int
    extra: dict[str, Any] = field(default_factory=dict)
    # The model's HF config as a dict (``config.to_dict()``): the roofline's
    # FLOPs and bytes follow from it (sweeper.core.roofline). None: no roofline columns.
    architecture: dict[str, Any] | None = None
    # The server a server backend launched or reached, the same for every trial of the load.
    server: ServerSetup | None = None
    # Why no GPU energy is metered for this load, where the device alone does not say
    # (a client of an external server): the rows' energy_unmetered_reason.
    unmetered_reason: str | None = None
    # GPUs to meter instead of the ones this process was given (CUDA_VISIBLE_DEVICES form):
    # an external server's, named by the sweep. None: the process's own.
    metered_gpus: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    """What a backend needs to load: resolved by the control plane, opaque here."""

    source: str  # synthetic | path | hub
    location: str  # preset name | directory | hub id
    precision: str
    options: BaseModel  # the backend's validated options (its registry options model)
    seed: int = 0
    # GPUs to shard the model over (the trial's tensor_parallel); a backend that
    # cannot shard rejects more than 1.
    tensor_parallel: int = 1
    # Synthetic models only: load seeded random weights written to disk
    # (actors.models.materialize_weights) instead of initializing them in
    # memory, so that two precisions hold the same weights (fidelity pass).
    # Quantized precisions always do.
    weights_on_disk: bool = False
    # Serving mode: the backend loads the engine that takes requests as they arrive
    # (vLLM's async engine) instead of its offline one.
    serving: bool = False
    # The load's name in logs and files (e.g. a launched server's DIR/servers/<name>.log).
    name: str = "model"
    # How long the load may take (measure.load_timeout_s): a server's readiness wait is bounded by it.
    load_timeout_s: float | None = None
    # Dataset prompts go to a server's chat endpoint (workload.chat), which applies the template.
    chat: bool = False
    # Tokens of each engine step the group runs (sweeper.core.trial.GroupLoad), or None.
    step_tokens: tuple[int, ...] | None = None
    # Where a launched server writes its log (GroupLoad.server_log_dir); None: the node's cache.
    log_dir: str | None = None
    # Values from the driver's environment the load needs (GroupLoad.secrets): never logged.
    secrets: SecretValues = SecretValues()

    def options_as(self, kind: type[Options]) -> Options:
        """The options as the backend's own options model (the registry pairs them)."""
        if not isinstance(self.options, kind):
            raise TypeError(f"expected {kind.__name__} options, got {type(self.options).__name__}")
        return self.options


class Backend(ABC):
    """A loaded model that generates exactly ``output_len`` tokens per sequence."""

    @abstractmethod
    def load(self, spec: ModelSpec) -> LoadInfo: ...

    @abstractmethod
    def generate(self, prompt_ids: np.ndarray, output_len: int) -> Generation:
        """Generate for a (batch, input_len) array of token ids; device-synchronized at both ends."""

    def generate_batch(self, batch: PromptBatch) -> Generation:
        """Generate for prompts of varying lengths (each sequence's ``RequestTiming`` has its
        prompt and output tokens). A backend without a varied-length path runs uniform batches."""
        uniform = batch.as_uniform()
        if uniform is None:
            raise NotImplementedError(f"{type(self).__name__} runs batches of one prompt length and "
                                      "exact output lengths only")
        return self.generate(*uniform)

    @abstractmethod
    def sync(self) -> None:
        """Wait until all device work issued so far has finished."""

    def prepare(self, batch_size: int, input_len: int, output_len: int) -> Compile:
        """Get ready for generate calls of this shape (compile, capture graphs); before warm-up."""
        return Compile()

    def reset_peak_memory(self) -> None:  # noqa: B027 - optional hook
        pass

    def peak_memory_bytes(self) -> int | None:
        return None

    def recover(self) -> None:  # noqa: B027 - optional hook
        """Free what a failed call left behind (e.g. after out-of-memory)."""

    def speculation_counts(self) -> SpeculationCounts | None:
        """The engine's cumulative speculative-decoding counts (None: no speculation, or not
        readable); a window's figures are the difference of two readings."""
        return None

    def secret_values(self) -> tuple[str, ...]:
        """Values this backend made or was given that no text may show (a launched server's
        fresh key): the actor redacts them from every error it reports or logs."""
        return ()

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    # -- scoring, for the fidelity pass (actors.quality.fidelity); optional ------------------
    def greedy_continuation(self, prompt_ids: np.ndarray, n: int) -> np.ndarray:
        """The (batch, n) token ids that greedy decoding appends to (batch, len) ``prompt_ids``."""
        raise NotImplementedError(f"{type(self).__name__} cannot return greedy continuations")

    def next_token_logprobs(self, token_ids: np.ndarray, last: int | None = None) -> np.ndarray:
        """float32 (batch, positions, vocab) log-softmax of one teacher-forced forward over
        (batch, len) ``token_ids``; position i predicts token i + 1. ``last``: only the last
        ``last`` positions."""
        raise NotImplementedError(f"{type(self).__name__} cannot score tokens")

    def topk_logprobs(self, token_ids: np.ndarray, last: int, k: int) -> TopK:
        """The top-k next-token log-probabilities at the last ``last`` positions of one
        teacher-forced pass over (batch, len) ``token_ids`` (position i predicts token i + 1):
        (batch, last, k) ids and log-probs, most likely first. From the full distribution
        where the backend has it; a serving engine returns these directly."""

        return topk_of(self.next_token_logprobs(token_ids, last=last), k)

    def sequence_logprobs(self, token_ids: np.ndarray, last: int | None = None) -> np.ndarray:
        """log p(token i + 1 | tokens <= i) at each position of one (len,) sequence, float64
        (len - 1 values): what perplexity needs; ``last``: only those of the last ``last``
        tokens (a continuation's, for likelihood scoring). From the full distribution,
        renormalized in float64 so rounding cannot push a probability above 1; a serving engine
        returns these directly."""
        ids = np.asarray(token_ids, dtype=np.int64)
        scored = len(ids) - 1 if last is None else min(last, len(ids) - 1)
        # Only the positions that predict the scored tokens leave the device.
        logprobs = self.next_token_logprobs(ids[None], last=scored + 1)[0, :-1].astype(np.float64)
        targets = ids[len(ids) - scored:]
        lse = np.log(np.exp(logprobs).sum(axis=-1))
        return logprobs[np.arange(len(targets)), targets] - lse

    def continuation_logprobs(self, prompt_ids: np.ndarray, continuations: Sequence[Sequence[int]]) -> list[float]:
        """log p(c | prompt) for each continuation c (the sum of its tokens' log-probabilities,
        renormalized in float64 as ``sequence_logprobs``): what multiple choice by likelihood
        needs. One forward over all of them, right-padded: a causal model's positions do not
        see the padding after them, so each row reads only its own tokens."""
        prompt = np.asarray(prompt_ids, dtype=np.int64)
        longest = max(len(c) for c in continuations)
        batch = np.zeros((len(continuations), len(prompt) + longest), dtype=np.int64)
        batch[:, :len(prompt)] = prompt
        for i, c in enumerate(continuations):
            batch[i, len(prompt):len(prompt) + len(c)] = c
        # Position len(prompt) - 1 + j predicts the continuation's token j: the last longest + 1.
        logprobs = self.next_token_logprobs(batch, last=longest + 1).astype(np.float64)
        sums = []
        for i, c in enumerate(continuations):
            rows = logprobs[i, :len(c)]
            lse = np.log(np.exp(rows).sum(axis=-1))
            sums.append(float((rows[np.arange(len(c)), np.asarray(c, dtype=np.int64)] - lse).sum()))
        return sums

    # -- serving mode (actors.serving); optional ------------------------------------------
    def serve(self, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
              deadline_s: float, follow: Follow | None = None) -> ServedRun:
        """Send ``requests`` at their arrival offsets from now (at most ``max_concurrency``
        in flight), stream each one's tokens and return what happened to every request by
        ``deadline_s`` (the actor's monotonic clock). Greedy, exactly ``output_len`` tokens.
        ``follow``: asked as each request finishes, the request that follows it (a
        conversation's next turn, ``actors.serving.conversations``), sent in its turn."""
        raise NotImplementedError(f"{type(self).__name__} has no serving mode")

    def process_owner(self) -> int | None:
        """The process whose descendants are this backend's on the metered GPUs (the actor's
        own: engine workers and launched servers are its children); None where whose
        processes run there cannot be told (``actors.telemetry.occupancy``)."""
        return os.getpid()

    @staticmethod
    def is_out_of_memory(exc: BaseException) -> bool:
        return False
