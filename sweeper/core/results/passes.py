"""The passes after the measured window: layer profiling, output fidelity, perplexity."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.results.part import Part, column


@dataclass(frozen=True)
class LayerPass(Part):
    """The layer-profiling pass (a separate pass after the measured window; its rows are in layers.parquet)."""

    layer_profile_status: str | None = column(
        "ok, or why the profiling pass wrote no layer rows (not applicable: ..., failed: ...)")
    layer_profile_overhead: float | None = column(
        "profiling pass time per iteration / measured time per iteration - 1 (the hooks' slowdown)")
    layer_profile_energy_j: float | None = column(
        "GPU energy measured over the profiling pass; its layers rows' energy_j sum to it")


@dataclass(frozen=True)
class Fidelity(Part):
    """The outputs against the reference precision's (a separate pass once per loaded model,
    after the group's first measured trial)."""

    fidelity_reference: str | None = column(
        "precision this trial's outputs were compared with (the same model, options and seed), as "
        "backend/precision when the reference runs on a named backend")
    fidelity_reference_source: str | None = column(
        "where this group's reference outputs came from: computed (the group loaded the reference "
        "precision itself, before its own model) | node cache (read from the node's cache: written by the "
        "reference's own group of this sweep right after its load, or by an earlier group or sweep); null "
        "for the reference itself")
    fidelity_method: str | None = column(
        "full (KL over the whole vocabulary: both backends return full distributions) | topK (KL "
        "estimated over the reference's top K tokens and one bucket for the rest, vLLM; docs/METHOD.md); "
        "null unless fidelity_status is ok")
    fidelity_kl: float | None = column(
        "mean over prompts and positions of KL(reference || this) of next-token distributions (nats, "
        "float64), teacher-forced on the reference's greedy continuation; on synthetic models numerical "
        "deviation, not quality; null unless fidelity_status is ok")
    fidelity_top1: float | None = column(
        "share of those positions where this trial's top-1 next token equals the reference's")
    fidelity_status: str | None = column(
        "ok | reference (this is the reference precision) | not applicable: ... (the backend cannot "
        "score) | failed: ... (the trial's status stays ok: its headline numbers stand)")


@dataclass(frozen=True)
class Perplexity(Part):
    """Perplexity on a public text (with the fidelity pass, when the sweep asks for it)."""

    perplexity: float | None = column(
        "perplexity on the bundled public-domain text (actors/quality/corpus.py), teacher-forced; real "
        "checkpoints only")
    perplexity_tokens: int | None = column("tokens scored for perplexity")
    perplexity_status: str | None = column(
        "ok | not applicable: ... (synthetic model, no tokenizer) | failed: ...; null: not asked for")
