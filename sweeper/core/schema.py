"""The result tables' schemas: one place, units in every name, documented.

Shards are cast to these schemas when written, so every shard of a kind has the
same columns and types, and ``docs/SCHEMA.md`` is generated from here.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa

from sweeper.core.capacity import Capacity
from sweeper.core.configuration import Configuration
from sweeper.core.results import Part, RequestRecord, RowError, TrialResult
from sweeper.core.results.tables import LayerRecord, StageRecord, TimelineSample
from sweeper.core.search import SearchPoint


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


def _c(name: str, type_: pa.DataType, doc: str) -> Column:
    return Column(name, type_, doc)


S, I, F, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()  # noqa: E741 - short type aliases keep the table readable
TS = pa.timestamp("us", tz="UTC")
FL, IL = pa.list_(F), pa.list_(I)  # per-GPU figures, one element per GPU

_IDENTITY: tuple[Column, ...] = (
    _c("trial_id", S, "content hash of the trial's configuration (stable across runs)"),
    _c("sweep", S, "sweep name"),
)

_ARROW: dict[Any, pa.DataType] = {str: S, int: I, float: F, bool: B, datetime: TS}


def _axis_columns() -> tuple[Column, ...]:
    """The columns of the grid's axes, from the axis table (each axis declares its own)."""
    from sweeper.core.axes import AXES

    return tuple(_c(name, _ARROW[kind], doc) for axis in AXES for name, kind, doc in axis.column_schema())


def _python_to_arrow(kind: Any) -> pa.DataType:
    if typing.get_origin(kind) is list:
        # An element may be null (a GPU with no sample of a slow field): the list's type is the element's.
        element = [a for a in typing.get_args(typing.get_args(kind)[0]) if a is not type(None)] \
            or [typing.get_args(kind)[0]]
        return pa.list_(_python_to_arrow(element[0]))
    return _ARROW[kind]


def _part_columns(part: type[Part]) -> tuple[Column, ...]:
    return tuple(_c(spec.name, _python_to_arrow(spec.type), spec.doc) for spec in part.specs())


# The trial's configuration beyond the axes (the driver's, from the trial), then the parts of
# the result its actor measures (sweeper.core.results: the columns are declared there).
_PARTS: tuple[type[Part], ...] = (Configuration, *TrialResult.part_types())
_RESULT: tuple[Column, ...] = tuple(c for part in _PARTS for c in _part_columns(part))

# A request's row is a typed record (sweeper.core.results.requests), made whole by its producer.
REQUESTS: tuple[Column, ...] = _part_columns(RequestRecord)

# The other per-trial tables' rows are typed records too (sweeper.core.results.tables).
TIMELINE: tuple[Column, ...] = _part_columns(TimelineSample)
LAYERS: tuple[Column, ...] = _part_columns(LayerRecord)
STAGES: tuple[Column, ...] = _part_columns(StageRecord)


def trials_columns() -> tuple[Column, ...]:
    """The trials table: identity, one column set per axis of the axis table, then results."""
    return _IDENTITY + _axis_columns() + _RESULT


TRIALS = trials_columns()  # as built in; ``columns("trials")`` also sees axes added since

TABLES: dict[str, tuple[Column, ...]] = {
    "trials": TRIALS,
    "requests": REQUESTS,
    "timeline": TIMELINE,
    "layers": LAYERS,
    "stages": STAGES,
}


# Tables a run derives from its trials rather than measures, each row a shard of its own, keyed
# by what it answers for: one row per capacity search (sweeper.core.capacity), written when the
# search ends; one per point of a configuration search (sweeper.core.search), written at the run's end.
DERIVED: dict[str, tuple[Column, ...]] = {
    "capacity": _part_columns(Capacity),
    "search": _part_columns(SearchPoint),
}


def columns(kind: str) -> tuple[Column, ...]:
    if kind == "trials":
        return trials_columns()
    return TABLES[kind] if kind in TABLES else DERIVED[kind]


def arrow_schema(kind: str) -> pa.Schema:
    return pa.schema([pa.field(c.name, c.type) for c in columns(kind)])


def to_table(kind: str, rows: list[dict[str, Any]] | pa.Table) -> pa.Table:
    """Rows (or a table) as a table of exactly ``kind``'s schema.

    Missing columns become nulls; an unknown column is a programming error and
    raises, so the schema cannot drift silently.
    """
    schema = arrow_schema(kind)
    names = set(schema.names)
    if isinstance(rows, pa.Table):
        unknown = set(rows.column_names) - names
        if unknown:
            raise KeyError(f"{kind}: unknown columns {sorted(unknown)}")
        cols = [rows.column(f.name).cast(f.type) if f.name in rows.column_names
                else pa.nulls(rows.num_rows, f.type) for f in schema]
        return pa.Table.from_arrays(cols, schema=schema)
    for row in rows:
        unknown = set(row) - names
        if unknown:
            raise KeyError(f"{kind}: unknown columns {sorted(unknown)}")
    return pa.Table.from_pylist(rows, schema=schema)


# The tables whose rows actors make as typed records: the type each one's schema comes from.
RECORDS: dict[str, type[Part]] = {"requests": RequestRecord, "stages": StageRecord, "layers": LayerRecord}


def records_table(kind: str, records: Sequence[Part]) -> pa.Table:
    """``kind``'s table from its typed records (``RECORDS``), in the schema's column order.
    Actors make their tables with this, in the process that made the records, so a value a
    column's type cannot hold is a ``RowError`` naming the column there (failing one trial,
    with the reason) and never reaches the driver's writer."""
    record_type = RECORDS[kind]
    wrong = sorted({type(r).__name__ for r in records if type(r) is not record_type})
    if wrong:
        raise RowError(f"{kind}: rows are {record_type.__name__}s, not {', '.join(wrong)}")
    schema = arrow_schema(kind)
    arrays = []
    for field in schema:
        try:
            arrays.append(pa.array([getattr(r, field.name) for r in records], type=field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RowError(f"{kind}.{field.name}: not a {field.type} ({exc})") from None
    return pa.Table.from_arrays(arrays, schema=schema)


def check_rows(kind: str, rows: list[dict[str, Any]]) -> None:
    """Raise ``RowError`` naming the first column of ``rows`` that ``kind``'s schema does not
    know, or whose values its type cannot hold. Actors check their rows with this before
    they leave the process, so a misspelled column (or a driver and worker of different
    versions) fails one trial, with the reason, instead of the driver's writer."""
    schema = arrow_schema(kind)
    names = {k for row in rows for k in row}
    unknown = sorted(names - set(schema.names))
    if unknown:
        raise RowError(f"{kind}: column(s) the schema does not know: {', '.join(unknown)}")
    for name in sorted(names):
        field = schema.field(name)
        try:
            pa.array([row.get(name) for row in rows], type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RowError(f"{kind}.{name}: not a {field.type} ({exc})") from None


def schema_markdown() -> str:
    lines = []
    for kind, cols in {**TABLES, **DERIVED}.items():
        lines += [f"### `{kind}.parquet`", "", "| column | type | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{c.name}` | {c.type} | {c.doc.replace('|', chr(92) + '|')} |" for c in cols]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m sweeper.core.schema > docs/SCHEMA.md
    print("# Result tables\n")
    print("Generated from `sweeper/core/schema.py` and, for the trials table's results and the requests "
          "table, the typed parts and records in `sweeper/core/results/` that actors send "
          "(`python -m sweeper.core.schema > docs/SCHEMA.md`); a test keeps the two in step. Units are in "
          "the column names: `_s` seconds, `_j` joules, `_w` watts, `_bytes` bytes, `_mj` millijoules, "
          "`_mhz` MHz, `_c` degrees Celsius, `_pct` per cent.\n")
    print("Per-GPU figures (`gpu_energy_j`, `gpu_avg_power_w`, `gpu_peak_power_w`, `gpu_peak_memory_bytes`, "
          "`gpu_idle_power_w`) are list columns of the trials table, one element per GPU in the order of "
          "`gpu_uuids`, not a child table: a trial holds the GPUs of one node (a handful), so its row stays "
          "whole and needs no join. In DuckDB, `list_sum(gpu_energy_j)` gives back `energy_j` and "
          "`unnest(gpu_energy_j)` one row per GPU; in pandas each cell is a list.\n")
    print(schema_markdown())
    from sweeper.core.budget import BUDGET_COLUMNS

    print("### Derived by the analysis (not stored)\n")
    print("`sweeper report`, `load_results` (the notebooks) and `sweeper query`'s `trials` view add these to "
          "the trials from the sweep file's `report` block (recorded in `plan.json`) or `sweeper report`'s flags.\n")
    print("| column | type | meaning |\n| --- | --- | --- |")
    for column in BUDGET_COLUMNS:
        print(f"| `{column.name}` | double | {column.doc} |")
