"""``sweeper query``: read-only DuckDB SQL over a results directory's aggregated tables.

Each aggregated table the schema lists (``sweeper.core.schema.TABLES``: ``trials``,
``requests``, ``timeline``, ``layers``, ``stages``) that exists in the directory becomes
a view of its name, so a query never needs a file path.
DuckDB is imported only when a query runs.

Read-only by construction, not by a list of refused statements: DuckDB itself may touch
no file at all. Each table is read by pyarrow (a ``pyarrow.dataset`` handed to DuckDB as
an Arrow scan), so the connection needs no file access for its views; external access
is then off with nothing allowed and the configuration locked. Any statement that would
read or write a file (``COPY ... TO``, ``EXPORT DATABASE``, ``ATTACH``, ``INSTALL``,
``LOAD``, ``read_text('/etc/shadow')``), or ``SET`` that would turn access back on, fails
inside DuckDB, however it is wrapped (``EXPLAIN ANALYZE`` runs the statement it
explains). What a statement can still change is the connection's own in-memory
catalog, gone when the query ends. Statements other than ``SELECT`` and ``EXPLAIN`` are
refused before they run as well, but only for a clearer message than DuckDB's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sweeper.core.errors import ResultsError, UserInputError, first_line
from sweeper.core.schema import DERIVED, TABLES

# Every table aggregation writes, from the schema: a table added there is queryable at once.
VIEWS = (*TABLES, *DERIVED)


class QueryError(UserInputError):
    """SQL that DuckDB rejects (syntax, unknown table or column, a failed cast)."""


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple[Any, ...]]
    views: list[str]


def _budget_columns(report: Any) -> str:
    """The trials view's derived pricing columns (null when the sweep gives no price or intensity)."""
    from sweeper.core.budget import BUDGET_COLUMNS

    parts = []
    for column in BUDGET_COLUMNS:
        factor = column.factor(report)
        expr = "CAST(NULL AS DOUBLE)" if factor is None else f"energy_per_token_j * {factor!r}"
        parts.append(f", {expr} AS {column.name}")
    return "".join(parts)


def connect(root: str | os.PathLike) -> tuple[Any, list[str]]:
    """An in-memory DuckDB connection with one view per aggregated table, that can read and
    write no file (module docstring); and the views' names."""
    import duckdb
    import pyarrow as pa
    import pyarrow.dataset as ds

    from sweeper.analysis.results import (
        REQUIRED_TRIAL_COLUMNS,
        check_results_dir,
        report_settings,
        table_path,
    )

    path = check_results_dir(root)
    derived = {"trials": _budget_columns(report_settings(path))}
    con = duckdb.connect()
    views = []
    try:
        for kind in VIEWS:
            table = table_path(path, kind)
            if table is None:
                continue
            try:
                # pyarrow opens the file (its footer now, its pages as a query reads them), not
                # DuckDB: the connection keeps no path it could be told to write to. The scan
                # still gets DuckDB's column and filter push-down.
                scan = con.from_arrow(ds.dataset(str(table.resolve()), format="parquet"))
                scan.project(f"*{derived.get(kind, '')}").create_view(kind)
            except (pa.ArrowInvalid, OSError, duckdb.Error) as exc:
                raise ResultsError(f"{table}: not a readable Parquet table ({first_line(exc)}); "
                                   f"`sweeper aggregate {root}` rebuilds it from the shards") from None
            views.append(kind)
        columns = {row[0] for row in con.execute("DESCRIBE trials").fetchall()}
        if REQUIRED_TRIAL_COLUMNS - columns:
            raise ResultsError(f"{path / 'trials.parquet'}: not a sweeper trials table (no "
                               f"{', '.join(sorted(REQUIRED_TRIAL_COLUMNS - columns))} column); "
                               f"`sweeper aggregate {root}` rebuilds it from the shards")
        # The views are bound: from here DuckDB may touch no file and load no extension (no
        # path is allowed), see no Python variable but the views (a replacement scan would),
        # and no statement can set any of this back (the configuration is locked).
        con.execute("SET python_enable_replacements = false")
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return con, views


def run_query(root: str | os.PathLike, sql: str) -> QueryResult:
    import duckdb

    if not sql.strip():
        raise QueryError("empty query")
    con, views = connect(root)
    try:
        # Not the defence (the connection can write nothing, whatever runs: ``connect``), only
        # a plainer message for a statement that is plainly not a read; ``EXPLAIN ANALYZE`` of
        # one gets DuckDB's own refusal.
        for statement in con.extract_statements(sql):
            if statement.type not in (duckdb.StatementType.SELECT, duckdb.StatementType.EXPLAIN):
                raise QueryError(f"sweeper query is read-only: {statement.type.name} statements are not "
                                 "allowed (SELECT and EXPLAIN are)")
        cur = con.execute(sql)
        if cur.description is None:  # a statement without a result (SET, CREATE ...)
            return QueryResult([], [], views)
        columns = [d[0] for d in cur.description]
        return QueryResult(columns, cur.fetchall(), views)
    except duckdb.Error as exc:
        # DuckDB's message carries the caret diagram on later lines; the first line names the error.
        first = first_line(exc)
        hint = f" (views: {', '.join(views)})" if "does not exist" in first else ""
        if isinstance(exc, duckdb.PermissionException):
            hint = " (sweeper query is read-only: it reads the views and no file)"
        raise QueryError(f"query failed: {first}{hint}") from None
    finally:
        con.close()


def to_csv(result: QueryResult) -> str:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(result.columns)
    writer.writerows(result.rows)
    return buf.getvalue()


def to_json(result: QueryResult) -> str:
    """Records, one object per row; timestamps and other non-JSON values as their ISO/str form."""
    import json
    import math
    from decimal import Decimal

    def plain(v: Any) -> Any:
        if isinstance(v, float) and not math.isfinite(v):
            return None  # NaN is not JSON
        if isinstance(v, Decimal):
            return float(v)
        if isinstance(v, int | float | str | bool) or v is None:
            return v
        return v.isoformat() if hasattr(v, "isoformat") else str(v)

    records = [{c: plain(v) for c, v in zip(result.columns, row, strict=True)} for row in result.rows]
    return json.dumps(records, indent=2)
