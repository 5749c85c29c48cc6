"""``sweeper query``: DuckDB SQL over the aggregated tables of real results."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tests.analysis.test_report import build_gpu_results
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory) -> Path:
    return build_gpu_results(tmp_path_factory.mktemp("h200-q") / "quantization")


def test_table_output_on_quickstart(quickstart_results):
    import pandas as pd

    r = run_cli("query", str(quickstart_results),
                "SELECT model, precision, batch_size, status FROM trials ORDER BY precision, batch_size")
    assert r.returncode == 0, r.stderr
    trials = pd.read_parquet(quickstart_results / "trials.parquet")
    lines = [ln for ln in r.stdout.splitlines() if "tiny-llama" in ln]
    assert len(lines) == len(trials)
    assert "┃ model" in r.stdout and "batch_size" in r.stdout


def test_views_join_requests_to_trials(quickstart_results):
    import pandas as pd

    sql = ("SELECT t.precision, t.batch_size, count(*) AS n, any_value(t.n_requests) AS expected "
           "FROM requests r JOIN trials t USING (trial_id) GROUP BY ALL ORDER BY ALL")
    r = run_cli("query", str(quickstart_results), sql, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    ok = pd.read_parquet(quickstart_results / "trials.parquet").query("status == 'ok'")
    assert len(rows) == len(ok) > 0
    assert all(row["n"] == row["expected"] for row in rows)  # one requests row per measured request


def test_every_table_the_schema_lists_is_a_view(quickstart_results):
    import pyarrow.parquet as pq

    from sweeper.core.schema import TABLES

    present = [kind for kind in TABLES if (quickstart_results / f"{kind}.parquet").is_file()]
    assert "stages" in present  # aggregation writes it; docs/SCHEMA.md documents it
    for kind in present:
        r = run_cli("query", str(quickstart_results), f"SELECT count(*) AS n FROM {kind}", "--json")
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == [{"n": pq.read_metadata(quickstart_results / f"{kind}.parquet").num_rows}]
    r = run_cli("query", str(quickstart_results), "SELECT stage, count(*) AS n FROM stages GROUP BY stage", "--json")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("[")


def test_the_query_help_names_every_view():
    from sweeper.core.schema import TABLES

    r = run_cli("query", "--help")
    assert r.returncode == 0 and all(kind in r.stdout for kind in TABLES), r.stdout


def test_csv_and_json_types(gpu_results):
    r = run_cli("query", str(gpu_results), "SELECT trial_id, energy_j, started_at, unstable FROM trials "
                "ORDER BY energy_j DESC LIMIT 3", "--csv")
    assert r.returncode == 0, r.stderr
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert [row["trial_id"] for row in rows][0] == "d58a02976863a6f0"
    assert float(rows[0]["energy_j"]) == pytest.approx(4502.73, abs=0.01)

    r = run_cli("query", str(gpu_results), "SELECT started_at, unstable, "
                "round(energy_j, 1)::DECIMAL(10, 1) AS e FROM trials ORDER BY energy_j DESC LIMIT 1", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert row["started_at"].startswith("20") and row["unstable"] is False and row["e"] == 4502.7


def test_gpu_views_include_timeline_and_layers(gpu_results):
    r = run_cli("query", str(gpu_results), "SELECT module_type, round(sum(energy_j) / "
                "(SELECT sum(energy_j) FROM layers), 3) AS share FROM layers GROUP BY 1 ORDER BY 2 DESC",
                "--json")
    assert r.returncode == 0, r.stderr
    shares = json.loads(r.stdout)
    assert shares[0]["module_type"] == "mlp"
    assert sum(s["share"] for s in shares) == pytest.approx(1.0, abs=0.01)
    r = run_cli("query", str(gpu_results), "SELECT count(DISTINCT trial_id) AS n FROM timeline", "--json")
    assert json.loads(r.stdout) == [{"n": 16}]


def test_long_results_are_capped_in_the_table_only(gpu_results):
    r = run_cli("query", str(gpu_results), "SELECT * FROM timeline")
    assert r.returncode == 0, r.stderr
    assert "more rows not shown (use --csv or --json for all)" in r.stderr
    r = run_cli("query", str(gpu_results), "SELECT t_s FROM timeline", "--csv")
    import pyarrow.parquet as pq

    assert len(r.stdout.splitlines()) == 1 + pq.read_metadata(gpu_results / "timeline.parquet").num_rows


@pytest.mark.parametrize("sql, expected", [
    ("SELEC 1", "query failed: Parser Error: syntax error at or near \"SELEC\""),
    ("SELECT * FROM trails", "Table with name trails does not exist"),
    ("SELECT no_such_column FROM trials", "query failed: Binder Error"),
    ("   ", "empty query"),
])
def test_bad_sql_is_one_line_exit_2(quickstart_results, sql, expected):
    r = run_cli("query", str(quickstart_results), sql)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout
    assert expected in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_missing_directory_and_conflicting_flags(tmp_path, quickstart_results):
    r = run_cli("query", str(tmp_path / "nope"), "SELECT 1")
    assert r.returncode == 2 and "no such results directory" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("query", str(tmp_path), "SELECT 1")
    assert r.returncode == 2 and "no trials.parquet" in r.stderr
    r = run_cli("query", str(quickstart_results), "SELECT 1", "--csv", "--json")
    assert r.returncode == 2 and "exclude each other" in r.stderr


# -- read-only ------------------------------------------------------------------------------

@pytest.fixture
def results_copy(gpu_results, tmp_path) -> Path:
    import shutil

    return Path(shutil.copytree(gpu_results, tmp_path / "copy"))


def _files(directory: Path) -> dict[Path, tuple[int, int]]:
    """Every file under ``directory`` with its size and modification time: what a write changes."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*") if p.is_file()}


# Every kind of statement that writes a file, or would let a later one: a COPY over the
# aggregated tables (in place, in another format, in a new file), an export, a database
# attached to write into, the settings that would turn file access back on, an extension.
WRITES = [
    "COPY (SELECT 1 AS x) TO '{dir}/trials.parquet' (FORMAT parquet)",
    "COPY (SELECT 1 AS x) TO '{dir}/trials.parquet' (FORMAT parquet, USE_TMP_FILE false)",
    "COPY (SELECT 1 AS x) TO '{dir}/timeline.parquet' (FORMAT csv, USE_TMP_FILE false)",
    "COPY trials TO '{dir}/copy.parquet'",
    "EXPORT DATABASE '{dir}/exported'",
    "ATTACH '{dir}/other.db' AS other",
    "ATTACH '{dir}/other.db' AS other; CREATE TABLE other.t AS SELECT 1 AS x; INSERT INTO other.t VALUES (2)",
    "SET enable_external_access = true",
    "RESET enable_external_access",
    "SET lock_configuration = false",
    "SET allowed_directories = ['{dir}']",
    "INSTALL httpfs",
    "LOAD httpfs",
]


@pytest.mark.parametrize("explain", ["", "EXPLAIN ANALYZE "], ids=["plain", "explain-analyze"])
@pytest.mark.parametrize("sql", WRITES)
def test_the_query_connection_itself_can_write_no_file(results_copy, sql, explain):
    """The defence is the connection's own configuration: each statement is run on it
    directly, past ``run_query``'s statement check. ``EXPLAIN ANALYZE`` runs what it explains."""
    import duckdb

    from sweeper.analysis.query import connect

    before = _files(results_copy)
    con, _ = connect(results_copy)
    try:
        with pytest.raises(duckdb.Error):
            for statement in sql.format(dir=results_copy).split("; "):
                con.execute(explain + statement)
        # ... and the connection is as locked down as before the attempt.
        with pytest.raises(duckdb.Error):
            con.execute(f"EXPLAIN ANALYZE COPY trials TO '{results_copy}/trials.parquet' (FORMAT parquet)")
        assert con.execute("SELECT count(*) FROM trials").fetchone()[0] > 0
    finally:
        con.close()
    assert _files(results_copy) == before  # nothing written, nothing added


@pytest.mark.parametrize("sql", [
    "EXPLAIN ANALYZE COPY (SELECT * FROM trials LIMIT 1) TO '{dir}/trials.parquet' (FORMAT parquet, USE_TMP_FILE false)",
    "EXPLAIN ANALYZE COPY (SELECT 1 AS x) TO '{dir}/timeline.parquet' (FORMAT csv, USE_TMP_FILE false)",
    "EXPLAIN COPY (SELECT 1 AS x) TO '{dir}/trials.parquet'",  # not even bound: the path is refused
])
def test_explain_analyze_of_a_copy_overwrites_nothing(results_copy, sql):
    before = _files(results_copy)
    r = run_cli("query", str(results_copy), sql.format(dir=results_copy))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "query failed: Permission Error" in r.stderr and "read-only" in r.stderr, r.stderr
    assert _files(results_copy) == before


@pytest.mark.parametrize(("sql", "expected"), [
    ("COPY (SELECT 1 AS x) TO '{dir}/requests.parquet'", "read-only: COPY statements are not allowed"),
    ("CREATE TABLE t AS SELECT 1", "read-only: CREATE statements are not allowed"),
    ("INSTALL httpfs", "read-only: LOAD statements are not allowed"),
    ("ATTACH '{dir}/other.db'", "read-only: ATTACH statements are not allowed"),
    ("SELECT 1; DROP VIEW trials", "read-only: DROP statements are not allowed"),
    ("SELECT * FROM read_text('/etc/hostname')", "Permission Error"),
    ("SELECT * FROM read_parquet('{dir}/shards/trials/*.parquet')", "Permission Error"),
    ("SELECT * FROM read_parquet('{dir}/trials.parquet')", "Permission Error"),  # only through the view
])
def test_query_can_read_the_results_and_nothing_else(results_copy, sql, expected):
    before = _files(results_copy)
    r = run_cli("query", str(results_copy), sql.format(dir=results_copy))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and expected in r.stderr, r.stderr
    assert _files(results_copy) == before  # nothing written


def test_reads_and_their_explanations_still_run(results_copy):
    for sql in ("EXPLAIN SELECT count(*) FROM trials", "EXPLAIN ANALYZE SELECT count(*) FROM trials",
                "SELECT count(*) AS n FROM trials t JOIN timeline USING (trial_id) WHERE t.status = 'ok'",
                "DESCRIBE trials", "SUMMARIZE layers", "SELECT co2e_g_per_1k_tokens FROM trials LIMIT 1"):
        r = run_cli("query", str(results_copy), sql, "--json")
        assert r.returncode == 0 and json.loads(r.stdout), (sql, r.stderr)


@pytest.mark.parametrize("damage", ["truncate", "empty", "wrong-schema"])
def test_a_damaged_trials_table_is_one_line_for_query_and_report(results_copy, damage):
    import pyarrow as pa
    import pyarrow.parquet as pq

    trials = results_copy / "trials.parquet"
    if damage == "truncate":
        trials.write_bytes(trials.read_bytes()[:200])
    elif damage == "empty":
        trials.write_bytes(b"")
    else:
        pq.write_table(pa.table({"x": [1, 2]}), trials)
    for args in (("query", str(results_copy), "SELECT count(*) FROM trials"), ("report", str(results_copy))):
        r = run_cli(*args)
        assert r.returncode == 2 and "Traceback" not in r.stderr, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "trials.parquet" in r.stderr, (args, r.stderr)


def test_report_refuses_a_report_path_that_is_a_file(results_copy):
    shutil_target = results_copy / "report"
    import shutil

    shutil.rmtree(shutil_target, ignore_errors=True)
    shutil_target.write_text("not a directory")
    r = run_cli("report", str(results_copy))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "exists and is not a directory" in r.stderr


def test_the_table_never_truncates_ids_even_beside_long_text(quickstart_results):
    import pandas as pd

    r = run_cli("query", str(quickstart_results),
                "SELECT trial_id, backend_options, backend_options AS again, error FROM trials")
    assert r.returncode == 0, r.stderr
    ids = pd.read_parquet(quickstart_results / "trials.parquet")["trial_id"]
    assert all(i in r.stdout for i in ids) and "…" not in r.stdout
