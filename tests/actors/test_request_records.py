"""The requests table is ``RequestRecord``'s: a real actor's offline and serving trials give
tables of exactly the type's columns, in its order, and each producer fills every column its
mode has. A column added to the type that a producer never sets, or one a producer writes that
the type lacks, fails here."""

from __future__ import annotations

import json
import os
from dataclasses import fields

import pyarrow as pa
import pytest

from sweeper.core.results import RequestRecord, RowError
from sweeper.core.schema import REQUESTS, arrow_schema, records_table
from tests.actors.serving.test_conversations import CHATS
from tests.actors.test_tensor_parallel import _fake

# The columns a mode leaves null by design (the type's docs say which: "serving: ..." columns
# offline, ``iteration`` serving). Every other column must be set on some request of the trial.
SERVING_ONLY = frozenset({
    "conversation_id", "turn", "arrival_s", "send_lateness_s", "cached_tokens", "scheduled_s", "first_token_s",
    "finish_s", "queue_s", "itl_s", "in_window", "meets_slo", "prefill_energy_j", "error"})
OFFLINE_ONLY = frozenset({"iteration"})
# Set only for a request that failed: this trial's all complete (test_serving_trial's time limit
# test reads the column where requests are cut).
FAILED_ONLY = frozenset({"error"})
# Set only in a scored trial (the sweep file's scoring: tests/actors/test_accuracy.py fills them).
SCORED_ONLY = frozenset({"correct", "extracted_answer", "truncated", "reply"})


def _actor_trial(sweep: dict):
    from actors.actor import TrialRunner
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep

    # Two fake GPUs metered (test_tensor_parallel's), so that energy is split over the requests.
    trial = make_plan(parse_sweep({
        "name": "records", "models": ["tiny-llama"], "backends": "noop", "precisions": "bf16", "tensor_parallel": 2,
        "measure": {"warmup_iters": 1, "idle_s": 0.3, "min_duration_s": 0.5, "min_window_s": 0.2}, **sweep,
    }), "cuda").runnable[0]
    runner = TrialRunner()
    try:
        assert runner.load(trial).ok
        outcome = runner.run(trial)
    finally:
        runner.close()
    assert outcome.row["status"] == "ok", outcome.row.get("error")
    table = outcome.tables["requests"]
    assert isinstance(table, pa.Table) and table.num_rows == outcome.row["n_requests"]
    return trial, outcome.row, table


def _filled(table: pa.Table) -> set[str]:
    return {name for name in table.column_names if table.column(name).null_count < table.num_rows}


def _holds_the_type(table: pa.Table) -> None:
    names = [f.name for f in fields(RequestRecord)]
    assert table.column_names == names
    assert table.schema.equals(arrow_schema("requests"))
    assert [c.name for c in REQUESTS] == names  # the schema is the type's, column for column


def test_the_type_is_the_schema_column_for_column():
    names = [f.name for f in fields(RequestRecord)]
    assert names[:3] == ["trial_id", "iteration", "request_index"]  # readers' order kept
    assert len(set(names)) == len(names) and all(c.doc for c in REQUESTS)
    assert all(field.nullable for field in arrow_schema("requests"))  # as every shard has them


def test_an_offline_trial_fills_every_column_of_its_mode(monkeypatch):
    _fake(monkeypatch, {1: (os.getpid(),), 3: (os.getpid(),)})
    trial, row, table = _actor_trial({"batch_sizes": 2, "backend_options": {"noop": {"step_s": 0.01}},
                                      "workload": {"dataset": "bundled", "output_len": "natural",
                                                   "max_output_len": 16, "num_prompts": 8}})
    _holds_the_type(table)
    assert _filled(table) == {f.name for f in fields(RequestRecord)} - SERVING_ONLY - SCORED_ONLY
    assert set(table.column("trial_id").to_pylist()) == {trial.trial_id}
    # Each request's share is in its record as made: they add up to the window's energy.
    assert sum(table.column("energy_j").to_pylist()) == pytest.approx(row["energy_j"], rel=1e-9)


def test_a_serving_trial_fills_every_column_of_its_mode(monkeypatch, tmp_path):
    _fake(monkeypatch, {1: (os.getpid(),), 3: (os.getpid(),)})
    chats = tmp_path / "chats.json"
    chats.write_text(json.dumps(CHATS))
    trial, row, table = _actor_trial({
        "backend_options": {"noop": {"step_s": 0.01, "prefill_s": 0.02, "prefix_block": 4}},
        "workload": {"mode": "serving", "dataset": str(chats), "conversations": True, "output_len": 4,
                     "request_rate": 20, "num_prompts": 12, "slo": {"ttft_ms": 1000}}})
    _holds_the_type(table)
    assert _filled(table) == {f.name for f in fields(RequestRecord)} - OFFLINE_ONLY - FAILED_ONLY - SCORED_ONLY
    assert set(table.column("trial_id").to_pylist()) == {trial.trial_id}
    assert sum(table.column("energy_j").to_pylist()) == pytest.approx(row["run_energy_j"], rel=1e-9)


def test_a_value_its_column_cannot_hold_is_a_row_error_naming_the_column():
    good = RequestRecord(trial_id="t", request_index=0, output_tokens=3)
    assert records_table("requests", [good]).num_rows == 1
    with pytest.raises(RowError, match=r"requests\.output_tokens: not a int64"):
        records_table("requests", [good, RequestRecord(trial_id="t", request_index=1, output_tokens="three")])
    with pytest.raises(RowError, match="rows are RequestRecords, not dict"):
        records_table("requests", [{"trial_id": "t"}])
    with pytest.raises(TypeError):
        RequestRecord(trial_id="t", request_index=0, output_tokens=1, energy_joules=1.0)
    with pytest.raises(TypeError):
        RequestRecord(trial_id="t", output_tokens=1)  # request_index: every request has one
