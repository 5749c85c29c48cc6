"""The fidelity pass's reference: computed in its own step, cached on the node's disk.

Fixed random prompts (seeded) are continued greedily by the model at the reference
precision, on the reference backend; the reference then scores its own token sequences
(prompt + continuation) teacher-forced, keeping full log-probabilities (``full``) or the
top k per position (``topk``: what vLLM returns).

Where the reference configuration is itself a group of the sweep, that group computes
it with the model it has just loaded (``ReferenceDuty``): the planner starts such groups
first and hands them one trial of each group they serve, and the others read the file.
Otherwise the step runs in the group's actor *before* the group's model loads: the
reference backend loads, scores, moves its outputs to host memory and closes, so the two
models never share the GPU's memory. Either way the outputs go to a file under the sweep
cache keyed by everything that decides them, and a lock per key makes a second actor on
the node wait for the first one's file instead of computing it again (a group that serves
a reference takes its locks before its own load, so the others wait for it rather than
start a reference load of their own); every other precision of the same model (and every
other backend naming the same reference) reads that file.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
from pydantic import BaseModel

from actors.backends.base import Backend, ModelSpec
from actors.records import TopK
from actors.workload import RandomPrompts
from sweeper.core.backends import BACKENDS
from sweeper.core.settings import DEFAULT_TOP_K, FidelitySettings, canonical_json
from sweeper.core.trial import Trial

log = logging.getLogger(__name__)

# The prompts' RandomPrompts iteration: far from the measured (>= 0) and warm-up
# (small negative) batches, so fidelity prompts are never a measured batch.
PROMPT_ITERATION = -(2**19)
# Host memory one scoring call may fill with float32 log-probs.
CHUNK_BYTES = 256 * 2**20
# The reference's cached full log-probs are (prompts, continuation_len, vocab) float32.
MAX_REFERENCE_BYTES = 8 * 2**30


@dataclass(frozen=True)
class ReferenceOutputs:
    """Prompt + greedy continuation (prompts, prompt_len + n), and at the n continuation
    positions either full log-probs (prompts, n, vocab) or the top k (prompts, n, k)."""

    tokens: np.ndarray
    logprobs: np.ndarray | None = None
    topk: TopK | None = None
    # Where the group got them: computed (its own reference load) | node cache (written by
    # the reference's own group of this sweep, or by an earlier group or sweep on the node).
    source: str = "computed"


def method_top_k(trial: Trial) -> int | None:
    """The comparison's k (top-k log-probabilities), or None: full distributions. Full only
    where the trial's backend and the reference's both return them, unless top_k is set."""
    settings = trial.fidelity
    assert settings is not None
    if settings.top_k is not None:
        return settings.top_k
    backends = {trial.backend, settings.reference_backend or trial.backend}
    return None if all(BACKENDS[b].full_logprobs for b in backends) else DEFAULT_TOP_K


def method_name(top_k: int | None) -> str:
    return "full" if top_k is None else f"top{top_k}"


def reference_backend(trial: Trial) -> tuple[str, BaseModel]:
    """The backend the reference runs on and its options: the trial's own, or the named one
    at its default options."""
    settings = trial.fidelity
    assert settings is not None
    name = settings.reference_backend or trial.backend
    return name, (trial.backend_options if name == trial.backend else BACKENDS[name].default_options())


def is_reference(trial: Trial) -> bool:
    """This trial is the reference itself (same backend and precision)."""
    settings = trial.fidelity
    assert settings is not None
    return trial.precision == settings.reference and reference_backend(trial)[0] == trial.backend


def fidelity_prompts(settings: FidelitySettings, vocab_size: int, seed: int) -> np.ndarray:
    return RandomPrompts(vocab_size, settings.prompt_len, settings.prompts, seed).batch(PROMPT_ITERATION)


def chunk_rows(settings: FidelitySettings, width: int) -> int:
    per_row = (settings.prompt_len + settings.continuation_len) * width * 4
    return max(1, min(settings.prompts, CHUNK_BYTES // max(per_row, 1)))


def score(backend: Backend, tokens: np.ndarray, n: int, top_k: int | None) -> np.ndarray | TopK:
    """Log-probs at the n positions that predict the last n tokens of ``tokens``."""
    if top_k is None:
        return backend.next_token_logprobs(tokens[:, :-1], last=n)
    return backend.topk_logprobs(tokens[:, :-1], n, top_k)


def reference_outputs(backend: Backend, settings: FidelitySettings, vocab_size: int, seed: int,
                      top_k: int | None = None) -> ReferenceOutputs:
    prompts = fidelity_prompts(settings, vocab_size, seed)
    n = settings.continuation_len
    rows = chunk_rows(settings, vocab_size if top_k is None else 2 * top_k)
    tokens: list[np.ndarray] = []
    scored: list = []
    for i in range(0, len(prompts), rows):
        chunk = prompts[i:i + rows]
        full = np.concatenate([chunk, backend.greedy_continuation(chunk, n).astype(np.int64)], axis=1)
        tokens.append(full)
        scored.append(score(backend, full, n, top_k))
    if top_k is None:
        return ReferenceOutputs(np.concatenate(tokens), logprobs=np.concatenate(scored).astype(np.float32, copy=False))
    return ReferenceOutputs(np.concatenate(tokens), topk=TopK(np.concatenate([s.ids for s in scored]),
                                                             np.concatenate([s.logprobs for s in scored])))


def process_gpu_names() -> list[str]:
    """The GPUs this process holds, known before any model loads (none: a CPU worker)."""
    from actors.telemetry.nvml import TelemetryError, resolve_gpus

    try:
        return [g.name for g in resolve_gpus()]
    except TelemetryError:
        return []


def _device_description() -> str:
    """What the reference runs on (its numbers depend on it)."""
    from actors.environment import cpu_model

    return ",".join(process_gpu_names()) or cpu_model()


def reference_key(trial: Trial) -> str:
    """What makes two reference computations give the same numbers."""
    from actors.models import weights_dir

    settings = trial.fidelity
    assert settings is not None
    model = trial.model_location
    if trial.model_source == "synthetic":
        model = weights_dir(trial.model_location, trial.seed).name  # preset config digest + seed + generator
    backend, options = reference_backend(trial)
    versions = {lib: _version(lib) for lib in ("torch", "transformers", *BACKENDS[backend].requires)}
    blob = json.dumps({
        "source": trial.model_source, "model": model, "backend": backend, "options": canonical_json(options),
        "reference": settings.reference, "method": method_name(method_top_k(trial)),
        "settings": [settings.prompts, settings.prompt_len, settings.continuation_len],
        "seed": trial.seed, "tensor_parallel": trial.tensor_parallel, "device": _device_description(), **versions,
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
            if "topk_ids" in data:
                return ReferenceOutputs(data["tokens"], topk=TopK(data["topk_ids"], data["topk_logprobs"]),
                                        source="node cache")
            return ReferenceOutputs(data["tokens"], logprobs=data["logprobs"], source="node cache")
    except (OSError, ValueError, KeyError):
        log.warning("unreadable fidelity reference cache %s; recomputing", path)
        return None


def _write_cached(path: Path, ref: ReferenceOutputs) -> None:
    arrays = ({"logprobs": ref.logprobs} if ref.topk is None
              else {"topk_ids": ref.topk.ids, "topk_logprobs": ref.topk.logprobs})
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, tokens=ref.tokens, **arrays)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _check_size(settings: FidelitySettings, top_k: int | None, vocab_size: int) -> None:
    if top_k is None and settings.prompts * settings.continuation_len * vocab_size * 4 > MAX_REFERENCE_BYTES:
        raise ValueError("the reference log-probs would take more than "
                         f"{MAX_REFERENCE_BYTES // 2**30} GiB (prompts x continuation_len x vocab x 4 "
                         "bytes); lower fidelity.prompts or fidelity.continuation_len, or set fidelity.top_k")


def _cache_path(trial: Trial) -> Path:
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    return cache / f"{reference_key(trial)}.npz"


def _lock_file(path: Path) -> IO[str]:
    return open(path.parent / f".{path.stem}.lock", "w")


def load_reference(trial: Trial, open_backend: Callable[[str], Backend]) -> ReferenceOutputs:
    """The reference outputs for ``trial``'s model: from the node's cache, or computed.

    Computing loads the reference precision into a backend from ``open_backend``
    (by name: the reference may run on another backend), scores, moves the results
    to host memory and closes that backend before returning. While the reference's own
    group computes it, this waits for that group's file (bounded by that group's load
    timeout, after which the driver ends it and the lock goes with its process).
    """
    settings = trial.fidelity
    assert settings is not None
    path = _cache_path(trial)
    with _lock_file(path) as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _read_cached(path)
        if cached is not None:
            return cached
        name, options = reference_backend(trial)
        backend = open_backend(name)
        try:
            ref_load = backend.load(ModelSpec(
                source=trial.model_source, location=trial.model_location, precision=settings.reference,
                options=options, seed=trial.seed, tensor_parallel=trial.tensor_parallel, weights_on_disk=True,
            ))
            top_k = method_top_k(trial)
            _check_size(settings, top_k, ref_load.vocab_size)
            ref = reference_outputs(backend, settings, ref_load.vocab_size, trial.seed, top_k)
        finally:
            backend.close()
            del backend
            gc.collect()
        _write_cached(path, ref)
        return ref


class ReferenceDuty:
    """The references a group computes for other groups of the sweep, with its own model.

    ``claim`` (before the group's load) takes each reference's lock, so that the groups
    that need it wait for this one's file rather than load the reference precision
    themselves; a reference already cached, or being computed by another actor right now,
    is left alone. ``fulfil`` (right after the load) computes and writes the claimed ones;
    ``release`` lets the waiting groups go on, whatever happened (a failed load or pass
    leaves them to compute their own). Never raises: the group's own trials stand.
    """

    def __init__(self, dependents: Sequence[Trial]) -> None:
        self._claimed: dict[str, tuple[Trial, Path, IO[str]]] = {}
        self._dependents = list(dependents)

    def claim(self) -> None:
        for trial in self._dependents:
            try:
                path = _cache_path(trial)
                if path.stem in self._claimed or path.is_file():
                    continue
                lock = _lock_file(path)
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # another actor computes it now: it writes the file
                    lock.close()
                    continue
                self._claimed[path.stem] = (trial, path, lock)
            except Exception:  # the dependent computes its own
                log.exception("could not claim the fidelity reference of trial %s", trial.trial_id)

    @property
    def claimed(self) -> int:
        return len(self._claimed)

    def fulfil(self, backend: Backend, vocab_size: int) -> None:
        """Compute every claimed reference with ``backend`` (the reference configuration,
        loaded), write it to the node's cache, and release its lock."""
        for stem in list(self._claimed):
            trial, path, _ = self._claimed[stem]
            settings = trial.fidelity
            assert settings is not None
            try:
                if _read_cached(path) is None:
                    top_k = method_top_k(trial)
                    _check_size(settings, top_k, vocab_size)
                    _write_cached(path, reference_outputs(backend, settings, vocab_size, trial.seed, top_k))
            except Exception:  # the dependent computes its own, and reports what fails there
                log.exception("fidelity reference for trial %s failed in its reference group", trial.trial_id)
            self._release(stem)

    def _release(self, stem: str) -> None:
        _, _, lock = self._claimed.pop(stem)
        lock.close()  # closing the file drops its flock

    def release(self) -> None:
        for stem in list(self._claimed):
            self._release(stem)
