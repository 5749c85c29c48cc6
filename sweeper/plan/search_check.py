"""The ``search:`` block against the rest of its sweep: objectives and constraints that name
numeric columns of the table they are read from, options the backend has, one workload.

Called by the sweep's own validator (``sweeper.plan.spec.Sweep``), so every problem is one
line naming the field, like the rest of the file's.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pydantic import ValidationError

from sweeper.core.backends import BACKENDS
from sweeper.core.capacity import LOAD_AXES
from sweeper.core.results.accuracy import Accuracy
from sweeper.core.schema import columns as schema_columns
from sweeper.plan.field_errors import problems

if TYPE_CHECKING:
    from sweeper.core.search import SearchSettings
    from sweeper.plan.spec import Sweep


_NUMERIC = (pa.int64(), pa.float64())
# The columns a scored sweep fills (null throughout without scoring:).
SCORED = frozenset(f.name for f in fields(Accuracy))


def _numeric_columns(sweep: Sweep) -> tuple[str, dict[str, pa.DataType]]:
    """The table a search's objectives are read from, and its numeric columns."""
    kind = "capacity" if sweep.workload.load_search is not None else "trials"
    return kind, {c.name: c.type for c in schema_columns(kind) if c.type in _NUMERIC}


def check_search(sweep: Sweep) -> None:
    """The search block against the sweep: columns that exist, options that exist, one workload."""
    search, w = sweep.search, sweep.workload
    assert search is not None
    kind, numeric = _numeric_columns(sweep)
    for i, objective in enumerate(search.objective):
        if objective.column not in numeric:
            raise ValueError(f"search.objective[{i}]: {objective.column!r} is not a numeric column of the {kind} "
                             f"table (e.g. {', '.join(sorted(numeric)[:6])}, ...: docs/SCHEMA.md)")
    _check_constraints(sweep, kind, numeric)
    for key, dim in search.space.items():
        _check_dimension(sweep, key, dim)
    shape = [("workload.input_len", w.input_lens or []), ("workload.output_len", w.output_lens)]
    for where, values in shape:
        if len(values) > 1:
            raise ValueError(f"{where}: a search scores each configuration on one workload; give one value")
    for axis in LOAD_AXES:
        values = getattr(w, axis)
        if isinstance(values, list) and len(values) > 1:
            raise ValueError(f"workload.{axis}: a search scores each configuration at one load; give one value, "
                             "or a capacity range ({capacity: {low, high}})")
    if sweep.repeats > 1:
        raise ValueError("repeats: a search evaluates each point once; leave repeats at 1")


def _check_constraints(sweep: Sweep, kind: str, numeric: dict[str, pa.DataType]) -> None:
    """Constraints the sweep can judge: an SLO it has, a capacity it searches, columns it fills."""
    search, w = sweep.search, sweep.workload
    assert search is not None
    c = search.constraints
    if c.slo and w.slo is None:
        raise ValueError("search.constraints.slo: the workload has no slo to meet (set workload.slo)")
    if c.min_capacity_req_s is not None and w.load_search is None:
        raise ValueError("search.constraints.min_capacity_req_s: needs a capacity search (request_rate: "
                         "{capacity: {low, high}})")
    for name in c.columns:
        if name not in numeric:
            raise ValueError(f"search.constraints.{name}: not a numeric column of the {kind} table")
    if c.min_accuracy is not None and "accuracy" not in numeric:
        raise ValueError(f"search.constraints.min_accuracy: the {kind} table has no accuracy (score each configuration "
                         "at one load rather than by a capacity search)")
    if sweep.scoring is None:
        _check_unscored(search)


def _check_unscored(search: SearchSettings) -> None:
    """Without scoring every accuracy column is null: a search judged by one could never count a point."""
    c = search.constraints
    wanted = [f"objective[{i}]" for i, o in enumerate(search.objective) if o.column in SCORED]
    wanted += [f"constraints.{name}" for name in c.columns if name in SCORED]
    wanted += ["constraints.min_accuracy"] if c.min_accuracy is not None else []
    if wanted:
        raise ValueError(f"search.{wanted[0]}: judges by accuracy, and the sweep scores no replies; add a "
                         "scoring: block (and a dataset with answers)")


def _check_dimension(sweep: Sweep, key: str, dim: Any) -> None:
    _, backend, option = key.split(".")
    if backend not in sweep.backends:
        raise ValueError(f"search.space.{key}: {backend} is not among this sweep's backends "
                         f"({', '.join(sweep.backends)})")
    options_type = BACKENDS[backend].options
    if option not in options_type.model_fields:
        raise ValueError(f"search.space.{key}: {backend} has no option {option!r}; its options: "
                         f"{', '.join(sorted(options_type.model_fields))}")
    probes = dim if isinstance(dim, list) else [dim.low, dim.high]
    for variant in sweep.backend_options.get(backend) or [{}]:
        for value in probes:
            if not isinstance(dim, list) and dim.int_:
                value = int(value)
            try:
                options_type.model_validate({**variant, option: value})
            except ValidationError as exc:
                # As the file's own problems are worded: a union's members as one message
                # ("a valid integer, or 'auto'"), not the first member's alone.
                raise ValueError(f"search.space.{key}: {value!r}: {problems(exc.errors())[0][1]}") from None


