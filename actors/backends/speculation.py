"""What speculative decoding did, from the engine's own counters.

vLLM counts, per engine, the draft steps it ran (``vllm:spec_decode_num_drafts``), the tokens
those drafts proposed (``..._num_draft_tokens``) and the proposed tokens the model accepted
(``..._num_accepted_tokens``): read in-process from its Prometheus registry (``LLM.get_metrics``
and ``AsyncLLM`` alike) or from a server's ``/metrics`` text, where counters carry the
``_total`` suffix and one sample per engine. A trial reads them before and after its window;
the difference is the window's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sweeper.core.results import Speculation

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"


@dataclass(frozen=True)
class SpeculationCounts:
    """Cumulative counts of one engine (or the sum of several), or a window's difference."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float

    @classmethod
    def from_samples(cls, samples: Iterable[tuple[str, float]]) -> SpeculationCounts | None:
        """Summed over engines from (name, value) pairs; a name may carry Prometheus's ``_total``.
        None where the engine counts none of them (speculation off)."""
        totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED_TOKENS: 0.0}
        seen = False
        for name, value in samples:
            key = name.removesuffix("_total")
            if key in totals:
                totals[key] += float(value)
                seen = True
        return cls(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED_TOKENS]) if seen else None

    @classmethod
    def from_metrics(cls, metrics: Iterable[Any]) -> SpeculationCounts | None:
        """From vLLM's in-process snapshot (``vllm.v1.metrics.reader``: objects with ``name`` and,
        for counters, ``value``)."""
        return cls.from_samples((m.name, m.value) for m in metrics if hasattr(m, "value"))

    @classmethod
    def from_prometheus_text(cls, text: str) -> SpeculationCounts | None:
        """From a server's ``/metrics`` page (Prometheus's text format)."""
        from prometheus_client.parser import text_string_to_metric_families

        return cls.from_samples((s.name, s.value) for family in text_string_to_metric_families(text)
                                for s in family.samples)

    def minus(self, before: SpeculationCounts) -> SpeculationCounts:
        return SpeculationCounts(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                                 self.accepted_tokens - before.accepted_tokens)

    def part(self) -> Speculation:
        """The trial's result part (sweeper.core.results): the window's counts, the share of proposed
        tokens accepted, and the tokens a draft step yields (its accepted ones and the model's own)."""
        return Speculation(
            spec_drafts=self.drafts, spec_draft_tokens=self.draft_tokens, spec_accepted_tokens=self.accepted_tokens,
            spec_acceptance_rate=self.accepted_tokens / self.draft_tokens if self.draft_tokens else None,
            spec_tokens_per_step=1.0 + self.accepted_tokens / self.drafts if self.drafts else None,
        )


def window_speculation(before: SpeculationCounts | None, after: SpeculationCounts | None) -> Speculation | None:
    """The part of a window bracketed by two readings; None where speculation was off or unread."""
    if before is None or after is None:
        return None
    return after.minus(before).part()
