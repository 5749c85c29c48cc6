"""A configuration search: the sweep file's ``search:`` block, validated.

The sweep's axes (their values) and ``space``'s numeric ranges of backend options make the
space; ``objective`` names what to minimise or maximise, one column (a best point) or two (a
Pareto front); ``constraints`` the points that count; ``budget`` when to stop. The searcher
itself is Optuna's (``sweeper.run.search``); this module only says what is asked of it, so
that a plan can show it and a bad block is refused before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Discriminator, Field, Tag, model_validator

from sweeper.core.results import Part, column
from sweeper.core.settings import Settings

Direction = Literal["minimize", "maximize"]
Sampler = Literal["tpe", "random", "grid"]

# Where the search's numeric options live: ``backend_options.<backend>.<option>``.
OPTION_PREFIX = "backend_options."


class Objective(Settings):
    """``{minimize: column}`` or ``{maximize: column}``."""

    minimize: str | None = None
    maximize: str | None = None

    @model_validator(mode="after")
    def _one(self) -> Objective:
        if (self.minimize is None) == (self.maximize is None):
            raise ValueError("give one of minimize or maximize, naming a column")
        return self

    @property
    def column(self) -> str:
        return self.minimize or self.maximize or ""

    @property
    def direction(self) -> Direction:
        return "minimize" if self.minimize is not None else "maximize"

    def __str__(self) -> str:
        return f"{self.direction} {self.column}"


def _objectives(value: Any) -> Any:
    return value if isinstance(value, list) else [value]


class Bound(Settings):
    """A column's bounds a point must keep to count (``{min: x}``, ``{max: y}`` or both)."""

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _some(self) -> Bound:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min:g}) is above max ({self.max:g})")
        return self


class Constraints(Settings):
    """What a point must do to count: meet the SLO, hold a capacity, keep columns in bounds."""

    slo: bool = False
    min_capacity_req_s: float | None = Field(None, gt=0)
    # A scored sweep's floor on the share of replies judged right (the trials table's accuracy).
    min_accuracy: float | None = Field(None, gt=0, le=1)
    # Any other key: a column with {min, max}.
    columns: dict[str, Bound] = {}

    @model_validator(mode="before")
    @classmethod
    def _columns(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        known = {"slo", "min_capacity_req_s", "min_accuracy", "columns"}
        rest = {k: v for k, v in value.items() if k not in known}
        return {**{k: v for k, v in value.items() if k in known}, "columns": {**value.get("columns", {}), **rest}}


class Range(Settings):
    """A numeric option's range: ``{low, high, log, int}``."""

    low: float
    high: float
    log: bool = False
    int_: bool = Field(False, alias="int")

    model_config = {**Settings.model_config, "populate_by_name": True}

    @model_validator(mode="after")
    def _valid(self) -> Range:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError("low and high must be finite numbers")
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        if self.log and self.low <= 0:
            raise ValueError(f"a log range cannot reach zero or below (low {self.low:g})")
        if self.int_ and not (float(self.low).is_integer() and float(self.high).is_integer()):
            raise ValueError("an int range's low and high are whole numbers")
        return self


def _dimension_kind(value: Any) -> str:
    # By shape, so that an error names only the branch meant (a bad range, not also "a list").
    return "[range]" if isinstance(value, (dict, Range)) else "[values]"


# A range ({low, high, log, int}) or a list of values (categorical).
Dimension = Annotated[
    Annotated[Range, Tag("[range]")] | Annotated[list[Any], Tag("[values]")],
    Discriminator(_dimension_kind),
]


class Budget(Settings):
    """When the search stops: after ``trials`` points, or ``gpu_hours`` of GPU time, whichever first."""

    trials: int | None = Field(None, gt=0, le=100_000, strict=True)
    gpu_hours: float | None = Field(None, gt=0, le=1_000_000)

    @model_validator(mode="after")
    def _some(self) -> Budget:
        if self.trials is None and self.gpu_hours is None:
            raise ValueError("give trials, gpu_hours or both (a search without a budget never ends)")
        return self


class SearchSettings(Settings):
    """The ``search:`` block."""

    objective: Annotated[list[Objective], BeforeValidator(_objectives), Field(min_length=1, max_length=2)]
    constraints: Constraints = Constraints()
    space: dict[str, Dimension] = {}
    budget: Budget
    sampler: Sampler = "tpe"
    seed: int = Field(0, ge=0, le=2**32 - 1, strict=True)

    @model_validator(mode="after")
    def _space_keys(self) -> SearchSettings:
        for key, dim in self.space.items():
            if not key.startswith(OPTION_PREFIX) or key.count(".") != 2:
                raise ValueError(f"space.{key}: a searched option is backend_options.<backend>.<option>")
            if isinstance(dim, list) and not dim:
                raise ValueError(f"space.{key}: must not be empty (give at least one value)")
            if self.sampler == "grid" and isinstance(dim, Range):
                raise ValueError(f"space.{key}: sampler grid takes lists of values, not ranges")
        if len({o.column for o in self.objective}) < len(self.objective):
            raise ValueError("objective: the two objectives name the same column")
        return self

    @property
    def multi(self) -> bool:
        return len(self.objective) > 1

    def identity(self) -> dict[str, Any]:
        """What makes two searches the same (the budget may grow: the search goes on)."""
        return self.model_dump(mode="json", exclude={"budget"}, by_alias=True)


@dataclass(frozen=True)
class SearchPoint(Part):
    """One evaluated point of a configuration search (search.parquet): its parameters and what it scored."""

    search_id: str | None = column("the search (trials.parquet's search_id)")
    search_step: int | None = column("the point's step in its search (the order it was suggested in)")
    search_params: str | None = column(
        "the point's parameters as the searcher chose them (axis values, backend_options.<backend>.<option> "
        "values), canonical JSON")
    trial_id: str | None = column("the point's trial (a capacity search: its first probe)")
    capacity_id: str | None = column("the point's capacity search (capacity.parquet), where the load is searched")
    label: str | None = column("the point's configuration in words")
    objective: str | None = column("the first objective: minimize|maximize and its column")
    value: float | None = column("the first objective's value (null: the point has none: failed, or no capacity)")
    objective_2: str | None = column("the second objective (a Pareto search), or null")
    value_2: float | None = column("the second objective's value")
    interval_low: float | None = column(
        "the first objective's 95 % interval, low end, where the row carries one (energy_per_token_j, "
        "throughput_tok_s), or its capacity bracket's passing load (capacity_req_s)")
    interval_high: float | None = column("the interval's high end, or the bracket's failing load (null: none failed)")
    feasible: bool | None = column("it has its objectives and meets every constraint")
    violations: str | None = column("the constraints it breaks, in words ('; '-separated)")
    error: str | None = column("why it has no objective value (its trial failed, or no load in the range held)")
    gpu_s: float | None = column("GPU-seconds it took: its trials' time (and a fixed-load point's model load) x GPUs")
    best: bool | None = column(
        "the search's best point (one objective), or on its Pareto front (two), among the points stored when "
        "it was written")
