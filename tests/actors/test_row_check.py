"""Rows are checked against the schema in the actor that built them: a bad one fails its own
trial, with the reason, and the next trial runs as usual."""

from __future__ import annotations

import pytest

import actors.actor as actor_module
from actors.actor import TrialRunner
from sweeper.core.results import TrialResult
from sweeper.core.schema import RowError, check_rows, to_table
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep


def group():
    sweep = parse_sweep({"name": "rows", "models": "tiny-llama", "backends": "noop", "precisions": "bf16",
                         "batch_sizes": [1, 2, 4], "workload": {"input_len": 8, "output_len": 4},
                         "backend_options": {"noop": {"step_s": 0.001}},
                         "measure": {"warmup_iters": 0, "min_iters": 1, "min_duration_s": 0, "idle_s": 0}})
    return expand(sweep)[0]


def test_check_rows_names_the_column_and_the_problem():
    check_rows("trials", [{"throughput_tok_s": 1.5, "status": "ok"}])  # fits: no error
    with pytest.raises(RowError, match="does not know: energy_joules"):
        check_rows("trials", [{"energy_joules": 1.0}])
    with pytest.raises(RowError, match=r"trials\.throughput_tok_s: not a double"):
        check_rows("trials", [{"throughput_tok_s": "fast"}])
    with pytest.raises(RowError, match=r"requests\.output_tokens"):
        check_rows("requests", [{"output_tokens": 3}, {"output_tokens": "three"}])


@pytest.mark.parametrize(("planted", "message"), [
    ({"energy_joules": 12.0}, "does not know: energy_joules"),       # a misspelled column (no part has it)
    ({"throughput_tok_s": "fast"}, "trials.throughput_tok_s"),        # a value of the wrong type
])
def test_a_bad_row_fails_its_trial_and_the_next_trial_runs(monkeypatch, planted, message):
    first, second, third = group()
    runner = TrialRunner()
    assert runner.load(first).ok
    try:
        assert runner.run(first).status == "ok"
        real = actor_module.measure_trial

        def planting(*args, **kwargs):
            # As a producer that returns the planted column would: its parts are made from it.
            measured = real(*args, **kwargs)
            made = {k: v for k, v in measured.row.items() if v is not None}
            measured.result = TrialResult.from_row({**made, **planted})
            return measured

        monkeypatch.setattr(actor_module, "measure_trial", planting)
        bad = runner.run(second)
        assert bad.status == "failed" and bad.row["reason"] == "invalid_row"
        assert message in bad.row["error"]
        # The failed row itself fits the schema: the driver writes it like any other.
        assert to_table("trials", [{"trial_id": second.trial_id, **bad.row}]).num_rows == 1
        monkeypatch.setattr(actor_module, "measure_trial", real)
        assert runner.run(third).status == "ok"
    finally:
        runner.close()
