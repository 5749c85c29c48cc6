"""A trial's results as typed parts: every trials-table column beyond the trial's identity
and its axes.

Each part is a frozen dataclass of columns: the field's name carries the unit, its type the
column's type (``float | None`` is a double, ``list[float] | None`` a list of doubles,
``datetime | None`` a UTC timestamp) and its ``column`` the meaning that docs/SCHEMA.md
prints. The trials schema is generated from these classes (``sweeper.core.schema``), so a
column cannot exist in one and not the other, and a part built with a name it does not
have fails where it is built. A trial's result is a ``TrialResult`` of parts; ``row()``
flattens it, the one place a trials row is made from them. Every column is nullable: a
part that does not apply (serving figures of an offline trial) stays empty.

A row of the requests table is declared the same way, whole: ``RequestRecord`` (``requests``),
one per measured request, from which the requests schema is generated.

The parts are declared by topic (``part``: what a part is; ``run``, ``window``, ``serving``,
``energy``, ``trust``, ``passes``, ``accuracy``) and put together in ``trial_result``; everything is
imported from here."""

from __future__ import annotations

from sweeper.core.results.accuracy import Accuracy, ChoiceLikelihood
from sweeper.core.results.energy import (
           Baseline,
           Energy,
           HostEnergy,
           Occupancy,
           PerRequestEnergy,
           PhaseEnergy,
           RunEnergy,
)
from sweeper.core.results.part import ColumnSpec, Part, RowError, column
from sweeper.core.results.passes import Fidelity, LayerPass, Perplexity
from sweeper.core.results.requests import RequestRecord
from sweeper.core.results.run import Compile, Environment, Outcome, ServerSetup, Setup
from sweeper.core.results.serving import (
           ClientTimeliness,
           Conversations,
           PrefixCacheUse,
           ServingRun,
           SteadyState,
)
from sweeper.core.results.trial_result import TrialResult
from sweeper.core.results.trust import Intervals, IterationNoise, Stability
from sweeper.core.results.window import Latency, Lengths, Memory, Roofline, Speculation, Throughput

__all__ = ["Accuracy", "Baseline", "ChoiceLikelihood", "ClientTimeliness", "ColumnSpec", "Compile", "Conversations", "Energy", "Environment",
           "Fidelity", "HostEnergy", "Intervals", "IterationNoise", "Latency", "LayerPass", "Lengths",
           "Memory", "Occupancy", "Outcome", "Part", "PerRequestEnergy", "Perplexity", "PhaseEnergy",
           "PrefixCacheUse", "RequestRecord", "Roofline", "RowError", "RunEnergy", "ServerSetup", "ServingRun", "Setup",
           "Speculation", "Stability", "SteadyState", "Throughput", "TrialResult", "column"]
