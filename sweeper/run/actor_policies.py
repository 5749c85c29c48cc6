"""The scheduler's rules about actors, each a policy that reads a snapshot and returns a decision
(GuideLLM's scheduler constraints are the model): whether work whose actor died is tried again
(``Retries``), which waiting group a finished group's actor goes on to (``HandOver``), and which
groups wait for another group's placement before asking for an actor (``ReferenceReaders``).

``SweepRun`` owns the state and does what a decision says; these own the rules and nothing
else, so each is tested alone (tests/run/test_actor_policies.py). Splitting and out-of-memory
pruning are policies of the same kind, in ``splitting.py`` and ``oom_pruning.py``.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sweeper.plan.expand import TrialGroup


@dataclass(frozen=True)
class RetryDecision:
    """After an actor's death (or a hung load, handled as one): try the work again on a fresh
    actor, or record it failed. ``deaths`` counts this one."""

    retry: bool
    deaths: int
    max_retries: int


@dataclass(frozen=True)
class Retries:
    """A group's current work (its load, or the trial it was running) is tried again on a fresh
    actor while its actor has died at most ``max_retries`` times on it; then it is recorded
    failed. A node lost or the OOM killer is worth another try; an engine that kills its actor
    every time is not worth more than a few."""

    max_retries: int

    def after_death(self, deaths_before: int) -> RetryDecision:
        deaths = deaths_before + 1
        return RetryDecision(retry=deaths <= self.max_retries, deaths=deaths, max_retries=self.max_retries)


@dataclass(frozen=True)
class OpenGroup:
    """A group not done yet, as the hand-over rule sees it."""

    key: Hashable
    group: TrialGroup
    resources: Mapping[str, Any]
    waiting: bool  # its actor is requested and not placed yet


class HandOver:
    """A finished group's actor, started and holding its GPU, loads a waiting group's model next
    instead of ending, where the two ask for the same resources and their backends allow it
    (``TrialGroup.may_follow``); the waiting group's own request is withdrawn. A new process per
    group would start, import its backend and queue for the GPU again."""

    @staticmethod
    def successor(done: OpenGroup, open_groups: Sequence[OpenGroup]) -> Hashable | None:
        """The first waiting group (in start order) that ``done``'s actor can serve, or None."""
        return next((h.key for h in open_groups if h.waiting and h.key != done.key
                     and h.resources == done.resources and h.group.may_follow(done.group)), None)


class ReferenceReaders:
    """A group that reads a fidelity reference another group computes asks for its actor only
    once that group holds its resources (its calls run in order: the reference's claim comes
    first in its load). Asked at the same time, the reader could take the only slot and wait
    for a reference that no one can compute."""

    @staticmethod
    def held(groups: Sequence[TrialGroup]) -> dict[int, int]:
        """Each reader's index in ``groups`` -> the index of the group that computes its reference."""
        computes = {t.load_key: i for i, g in enumerate(groups) for t in g.serves_reference}
        return {i: computes[g.load_key] for i, g in enumerate(groups)
                if computes.get(g.load_key, i) != i}  # a group never waits for itself
