"""The fidelity pass: how far a precision's next-token distributions are from a reference's.

The reference (``actors.quality.reference``) is the same model at the reference
precision, on the trial's backend or a named one, computed in its own step before the
group's model loads and cached on the node. After the group's first measured trial, the
trial's model scores the reference's token sequences (prompt + the reference's greedy
continuation) teacher-forced, and at each continuation position the two next-token
distributions are compared (``actors.quality.divergence``):

- ``fidelity_kl``: mean over positions and prompts of KL(reference || trial): exact over
  the vocabulary (``fidelity_method`` full) where both backends return full distributions,
  else estimated from the top k of each (``top20``: vLLM returns top-k log-probabilities);
- ``fidelity_top1``: share of positions where both argmaxes agree (exact either way).

On a synthetic model the numbers measure numerical deviation between precisions of one
random network, not loss of quality on language.

A pass that cannot run leaves the trial ``ok``: the headline numbers stand, and
``fidelity_status`` says ``not applicable: ...`` (a backend that cannot score) or
``failed: ...`` (e.g. the reference precision cannot load on this device).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from actors.backends.base import Backend
from actors.quality.divergence import kl_per_position, kl_topk, top1_agreement, top1_agreement_topk
from actors.quality.reference import (
    ReferenceOutputs,
    chunk_rows,
    is_reference,
    load_reference,
    method_name,
    method_top_k,
    process_gpu_names,
    reference_backend,
    score,
)
from actors.records import TopK
from sweeper.core.backends import BACKENDS
from sweeper.core.precisions import PRECISIONS
from sweeper.core.results import Fidelity
from sweeper.core.settings import FidelitySettings
from sweeper.core.trial import Trial

log = logging.getLogger(__name__)

# Re-exported: the arithmetic's tests and notebooks import it from here.
__all__ = ["FidelityResult", "compare", "fidelity_columns", "kl_per_position", "prepare_reference",
           "top1_agreement"]


@dataclass(frozen=True)
class FidelityResult:
    kl: float
    top1: float
    positions: int


def compare(backend: Backend, reference: ReferenceOutputs, settings: FidelitySettings) -> FidelityResult:
    """Score the reference's token sequences with ``backend`` and compare, chunk by chunk, by
    the method the reference was computed with (full log-probs or top k)."""
    n = settings.continuation_len
    top_k = reference.topk.k if reference.topk is not None else None
    width = reference.logprobs.shape[-1] if reference.logprobs is not None else 2 * (top_k or 1)
    rows = chunk_rows(settings, width)
    kl_sum, agree, positions = 0.0, 0, 0
    for i in range(0, len(reference.tokens), rows):
        scored = score(backend, reference.tokens[i:i + rows], n, top_k)
        for j in range(len(scored.ids) if isinstance(scored, TopK) else len(scored)):
            if isinstance(scored, TopK):
                assert reference.topk is not None
                ref_k, trial_k = reference.topk[i + j], scored[j]
                kl_sum += float(kl_topk(ref_k, trial_k).sum())
                agree += int(top1_agreement_topk(ref_k, trial_k).sum())
                positions += len(ref_k.ids)
                continue
            assert reference.logprobs is not None
            ref_lp = reference.logprobs[i + j]
            if scored.shape[-1] != ref_lp.shape[-1]:
                raise ValueError(f"vocabularies differ: reference {ref_lp.shape[-1]}, this one {scored.shape[-1]}")
            # one prompt at a time bounds the float64 copies
            kl_sum += float(kl_per_position(ref_lp, scored[j]).sum())
            agree += int(top1_agreement(ref_lp, scored[j]).sum())
            positions += len(ref_lp)
    return FidelityResult(kl=kl_sum / positions, top1=agree / positions, positions=positions)


def _columns(trial: Trial, status: str, result: FidelityResult | None = None,
             source: str | None = None) -> Fidelity:
    settings = trial.fidelity
    assert settings is not None
    return Fidelity(fidelity_reference=settings.reference_label(), fidelity_status=status,
                    fidelity_reference_source=source,
                    fidelity_method=method_name(method_top_k(trial)) if result is not None else None,
                    fidelity_kl=result.kl if result else None, fidelity_top1=result.top1 if result else None)


def prepare_reference(trial: Trial, open_backend: Callable[[str], Backend]) -> ReferenceOutputs | str | None:
    """The reference step, before the group's model loads: its outputs (cached on the node),
    or the fidelity status that says why there are none; None for the reference itself.
    Never raises."""
    settings = trial.fidelity
    if settings is None or is_reference(trial):
        return None
    name, _ = reference_backend(trial)
    for who in dict.fromkeys((trial.backend, name)):
        if not BACKENDS[who].runs_model:
            return f"not applicable: backend {who} has no model to score tokens with"
    device = "cuda" if process_gpu_names() else "cpu"
    reason = (BACKENDS[name].unsupported_reason(settings.reference, device)
              or PRECISIONS[settings.reference].unsupported_reason(device))
    if reason:
        return f"failed: reference {reason}"
    try:
        return load_reference(trial, open_backend)
    except Exception as exc:
        log.exception("fidelity reference failed")
        return (f"failed: reference {settings.reference_label()} did not load or score: "
                f"{type(exc).__name__}: {exc}"[:2000])


def fidelity_columns(trial: Trial, backend: Backend, reference: ReferenceOutputs | str | None) -> Fidelity:
    """The fidelity columns of ``trial`` (loaded in ``backend``) against the reference step's
    outcome; never raises."""
    settings = trial.fidelity
    if settings is None:
        raise ValueError(f"trial {trial.trial_id} has no fidelity settings")
    if reference is None:
        return _columns(trial, "reference")
    if isinstance(reference, str):
        return _columns(trial, reference)
    try:
        result = compare(backend, reference, settings)
    except NotImplementedError as exc:
        return _columns(trial, f"not applicable: {exc}", source=reference.source)
    except Exception as exc:
        log.exception("fidelity comparison failed")
        backend.recover()
        return _columns(trial, f"failed: scoring with {trial.precision}: {type(exc).__name__}: {exc}"[:2000],
                        source=reference.source)
    return _columns(trial, "ok", result, source=reference.source)
