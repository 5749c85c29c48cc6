"""The fidelity pass: how far a precision's next-token distributions are from a reference's.

Fixed random prompts (seeded) are continued greedily by the same model at the
reference precision; then both precisions score the same token sequences
(prompt + the reference's continuation), teacher-forced, and at each
continuation position we compare the two next-token distributions:

- ``fidelity_kl``: mean over positions and prompts of KL(reference || trial),
  in float64 from float32 log-softmax outputs (each renormalized in float64,
  so identical inputs give exactly 0 and KL is never negative);
- ``fidelity_top1``: share of positions where both argmaxes agree.

The reference is loaded as a second backend in the same actor, scored, and
closed before the trial's group goes on; its tokens and log-probs are cached on
the node's disk so that other groups (int8, nf4, ...) of the same model reuse
them. On a synthetic model the numbers measure numerical deviation between
precisions of one random network, not loss of quality on language.

A pass that cannot run leaves the trial ``ok``: the headline numbers stand, and
``fidelity_status`` says ``not applicable: ...`` (a backend that cannot score)
or ``failed: ...`` (e.g. the reference precision cannot load on this device).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import importlib.metadata
import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from actors.backends.base import Backend, LoadInfo, ModelSpec
from actors.workload import RandomPrompts
from sweeper.core.backends import BACKENDS
from sweeper.core.precisions import PRECISIONS
from sweeper.core.settings import FidelitySettings, canonical_json
from sweeper.core.trial import Trial

log = logging.getLogger(__name__)

# The prompts' RandomPrompts iteration: far from the measured (>= 0) and warm-up
# (small negative) batches, so fidelity prompts are never a measured batch.
PROMPT_ITERATION = -(2**19)
# Host memory one scoring call may fill with float32 log-probs.
CHUNK_BYTES = 256 * 2**20
# The reference's cached log-probs are (prompts, continuation_len, vocab) float32.
MAX_REFERENCE_BYTES = 8 * 2**30


@dataclass(frozen=True)
class ReferenceOutputs:
    """Prompt + greedy continuation (prompts, prompt_len + n) and log-probs (prompts, n, vocab)."""

    tokens: np.ndarray
    logprobs: np.ndarray


@dataclass(frozen=True)
class FidelityResult:
    kl: float
    top1: float
    positions: int


def fidelity_prompts(settings: FidelitySettings, vocab_size: int, seed: int) -> np.ndarray:
    return RandomPrompts(vocab_size, settings.prompt_len, settings.prompts, seed).batch(PROMPT_ITERATION)


def _chunk_rows(settings: FidelitySettings, vocab_size: int) -> int:
    per_row = (settings.prompt_len + settings.continuation_len) * vocab_size * 4
    return max(1, min(settings.prompts, CHUNK_BYTES // max(per_row, 1)))


def _logprobs_of_continuation(backend: Backend, tokens: np.ndarray, n: int) -> np.ndarray:
    """Log-probs at the n positions that predict the last n tokens of ``tokens``."""
    return backend.next_token_logprobs(tokens[:, :-1], last=n)


def reference_outputs(backend: Backend, settings: FidelitySettings, vocab_size: int, seed: int) -> ReferenceOutputs:
    prompts = fidelity_prompts(settings, vocab_size, seed)
    n = settings.continuation_len
    rows = _chunk_rows(settings, vocab_size)
    tokens, logprobs = [], []
    for i in range(0, len(prompts), rows):
        chunk = prompts[i:i + rows]
        full = np.concatenate([chunk, backend.greedy_continuation(chunk, n).astype(np.int64)], axis=1)
        tokens.append(full)
        logprobs.append(_logprobs_of_continuation(backend, full, n))
    return ReferenceOutputs(np.concatenate(tokens), np.concatenate(logprobs).astype(np.float32, copy=False))


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


def compare(backend: Backend, reference: ReferenceOutputs, settings: FidelitySettings) -> FidelityResult:
    """Score the reference's token sequences with ``backend`` and compare, chunk by chunk."""
    n = settings.continuation_len
    vocab = reference.logprobs.shape[-1]
    rows = _chunk_rows(settings, vocab)
    kl_sum, agree, positions = 0.0, 0, 0
    for i in range(0, len(reference.tokens), rows):
        trial_lp = _logprobs_of_continuation(backend, reference.tokens[i:i + rows], n)
        if trial_lp.shape[-1] != vocab:
            raise ValueError(f"vocabularies differ: reference {vocab}, this precision {trial_lp.shape[-1]}")
        for j in range(len(trial_lp)):  # one prompt at a time bounds the float64 copies
            ref_lp = reference.logprobs[i + j]
            kl_sum += float(kl_per_position(ref_lp, trial_lp[j]).sum())
            agree += int(top1_agreement(ref_lp, trial_lp[j]).sum())
            positions += len(ref_lp)
    return FidelityResult(kl=kl_sum / positions, top1=agree / positions, positions=positions)


# -- the reference: loaded beside the trial's model, or read from the node's cache ---------

def reference_key(trial: Trial, settings: FidelitySettings, load: LoadInfo) -> str:
    """What makes two reference computations give the same numbers."""
    from actors.models import weights_dir

    model = trial.model_location
    if trial.model_source == "synthetic":
        model = weights_dir(trial.model_location, trial.seed).name  # preset config digest + seed + generator
    versions = {lib: _version(lib) for lib in ("torch", "transformers")}
    blob = json.dumps({
        "source": trial.model_source, "model": model, "backend": trial.backend,
        "options": canonical_json(trial.backend_options), "reference": settings.reference,
        "settings": [settings.prompts, settings.prompt_len, settings.continuation_len],
        "seed": trial.seed, "device": load.device, "device_name": load.device_name, **versions,
    }, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _version(lib: str) -> str | None:
    try:
        return importlib.metadata.version(lib)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cache_dir() -> Path:
    from actors.models import cache_root

    return cache_root() / "fidelity"


def _read_cached(path: Path) -> ReferenceOutputs | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            return ReferenceOutputs(data["tokens"], data["logprobs"])
    except (OSError, ValueError, KeyError):
        log.warning("unreadable fidelity reference cache %s; recomputing", path)
        return None


def _write_cached(path: Path, ref: ReferenceOutputs) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, tokens=ref.tokens, logprobs=ref.logprobs)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def load_reference(trial: Trial, settings: FidelitySettings, load: LoadInfo,
                   open_backend: Callable[[], Backend]) -> ReferenceOutputs:
    """The reference outputs for ``trial``'s model: from the node's cache, or computed.

    Computing loads the reference precision into a second backend from
    ``open_backend`` (same model, options and seed), scores, moves the results
    to host memory and closes that backend before returning. A lock per key
    makes a second actor on the node wait for the first one's file instead of
    loading the reference again.
    """
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"{reference_key(trial, settings, load)}.npz"
    with open(cache / f".{path.stem}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _read_cached(path)
        if cached is not None:
            return cached
        backend = open_backend()
        try:
            ref_load = backend.load(ModelSpec(
                source=trial.model_source, location=trial.model_location, precision=settings.reference,
                options=trial.backend_options, seed=trial.seed, tensor_parallel=trial.tensor_parallel,
                weights_on_disk=True,
            ))
            ref = reference_outputs(backend, settings, ref_load.vocab_size, trial.seed)
        finally:
            backend.close()
            del backend
            gc.collect()
        _write_cached(path, ref)
        return ref


def _columns(settings: FidelitySettings, status: str, result: FidelityResult | None = None) -> dict[str, Any]:
    return {"fidelity_reference": settings.reference, "fidelity_status": status,
            "fidelity_kl": result.kl if result else None, "fidelity_top1": result.top1 if result else None}


def fidelity_columns(trial: Trial, backend: Backend, load: LoadInfo,
                     open_backend: Callable[[], Backend]) -> dict[str, Any]:
    """The fidelity columns of ``trial`` (loaded in ``backend``); never raises."""
    settings = trial.fidelity
    if settings is None:
        raise ValueError(f"trial {trial.trial_id} has no fidelity settings")
    if trial.precision == settings.reference:
        return _columns(settings, "reference")
    reason = (BACKENDS[trial.backend].unsupported_reason(settings.reference, load.device)
              or PRECISIONS[settings.reference].unsupported_reason(load.device))
    if reason:
        return _columns(settings, f"failed: reference {reason}")
    ref_bytes = settings.prompts * settings.continuation_len * load.vocab_size * 4
    if ref_bytes > MAX_REFERENCE_BYTES:
        return _columns(settings, f"failed: the reference log-probs would take {ref_bytes / 2**30:.1f} GiB "
                                  f"(prompts x continuation_len x vocab x 4 bytes); lower fidelity.prompts "
                                  f"or fidelity.continuation_len")
    try:
        # A backend that cannot score is found out before the reference is loaded.
        backend.next_token_logprobs(np.full((1, 2), 8, dtype=np.int64), last=1)
    except NotImplementedError as exc:
        return _columns(settings, f"not applicable: {exc}")
    try:
        reference = load_reference(trial, settings, load, open_backend)
    except Exception as exc:
        log.exception("fidelity reference failed")
        backend.recover()
        return _columns(settings, f"failed: reference {settings.reference} did not load or score: "
                                  f"{type(exc).__name__}: {exc}"[:2000])
    try:
        result = compare(backend, reference, settings)
    except Exception as exc:
        log.exception("fidelity comparison failed")
        backend.recover()
        return _columns(settings, f"failed: scoring with {trial.precision}: {type(exc).__name__}: {exc}"[:2000])
    return _columns(settings, "ok", result)
