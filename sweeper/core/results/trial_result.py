"""A trial's result: its parts, made once (``TrialResult.of``) and flattened once (``row``)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import cache
from typing import Any

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
from sweeper.core.results.part import Part, RowError
from sweeper.core.results.passes import (
    Fidelity,
    LayerPass,
    Perplexity,
)
from sweeper.core.results.run import (
    Compile,
    Environment,
    Outcome,
    ServerSetup,
    Setup,
)
from sweeper.core.results.serving import (
    ClientTimeliness,
    Conversations,
    PrefixCacheUse,
    ServingRun,
    SteadyState,
)
from sweeper.core.results.trust import (
    Intervals,
    IterationNoise,
    Stability,
)
from sweeper.core.results.window import (
    Latency,
    Lengths,
    Memory,
    Roofline,
    Speculation,
    Throughput,
)


# The parts an actor measures, in the trials table's order (after the trial's configuration).
@dataclass(frozen=True)
class TrialResult:
    """One trial's result as its actor (or, for a trial that never ran, the driver) sends it."""

    outcome: Outcome
    setup: Setup = Setup()
    server: ServerSetup = ServerSetup()
    compile: Compile = Compile()
    throughput: Throughput = Throughput()
    lengths: Lengths = Lengths()
    latency: Latency = Latency()
    serving_run: ServingRun = ServingRun()
    steady_state: SteadyState = SteadyState()
    client: ClientTimeliness = ClientTimeliness()
    prefix_cache: PrefixCacheUse = PrefixCacheUse()
    conversations: Conversations = Conversations()
    speculation: Speculation = Speculation()
    memory: Memory = Memory()
    energy: Energy = Energy()
    baseline: Baseline = Baseline()
    phases: PhaseEnergy = PhaseEnergy()
    request_energy: PerRequestEnergy = PerRequestEnergy()
    run_energy: RunEnergy = RunEnergy()
    host_energy: HostEnergy = HostEnergy()
    occupancy: Occupancy = Occupancy()
    intervals: Intervals = Intervals()
    noise: IterationNoise = IterationNoise()
    stability: Stability = Stability()
    layer_pass: LayerPass = LayerPass()
    roofline: Roofline = Roofline()
    fidelity: Fidelity = Fidelity()
    perplexity: Perplexity = Perplexity()
    accuracy: Accuracy = Accuracy()
    likelihood: ChoiceLikelihood = ChoiceLikelihood()
    environment: Environment = Environment()

    @staticmethod
    def part_types() -> tuple[type[Part], ...]:
        return tuple(_PART_TYPES.values())

    def row(self) -> dict[str, Any]:
        """The trials row's result columns: every part's, flattened (null where not set)."""
        return {name: value for f in fields(self) for name, value in getattr(self, f.name).items()}

    @classmethod
    def of(cls, outcome: Outcome, *parts: Part | None) -> TrialResult:
        """The result of ``outcome`` and its producers' parts, each under the field of its type
        (a part not given, or None, stays empty). A type given twice is a ``RowError``: every
        figure is computed, and sent, once."""
        by_field: dict[str, Part] = {}
        fields_of = _fields_by_type()
        for part in parts:
            if part is None:
                continue
            name = fields_of.get(type(part))
            if name is None:
                raise RowError(f"trials: {type(part).__name__} is not a part of a trial's result")
            if name in by_field:
                raise RowError(f"trials: {type(part).__name__} given twice")
            by_field[name] = part
        return cls(outcome, **by_field)  # type: ignore[arg-type]  # each part under its own field

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TrialResult:
        """The result from a flat row (one that a producer built by name): each column to the
        part that declares it; a name no part declares is a ``RowError`` naming it."""
        by_part: dict[str, dict[str, Any]] = {}
        owners = _owners()
        unknown = sorted(set(row) - owners.keys())
        if unknown:
            raise RowError(f"trials: column(s) the schema does not know: {', '.join(unknown)}")
        for name, value in row.items():
            by_part.setdefault(owners[name], {})[name] = value
        parts = {attr: _PART_TYPES[attr].of(values) for attr, values in by_part.items()}
        if "outcome" not in parts:
            raise RowError("trials: a result needs its outcome (status)")
        return cls(**parts)  # type: ignore[arg-type]  # each part under its own field

    def replace(self, **parts: Part) -> TrialResult:
        from dataclasses import replace

        return replace(self, **parts)  # type: ignore[arg-type]


_PART_TYPES: dict[str, type[Part]] = {
    f.name: typing.get_type_hints(TrialResult)[f.name] for f in fields(TrialResult)
}


@cache
def _fields_by_type() -> dict[type[Part], str]:
    return {part: attr for attr, part in _PART_TYPES.items()}


@cache
def _owners() -> dict[str, str]:
    """Which of TrialResult's fields declares each column."""
    return {name: attr for attr, part in _PART_TYPES.items() for name in part.names()}
