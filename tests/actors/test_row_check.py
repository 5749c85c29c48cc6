"""Results are checked in the actor that built them (each part once; the row against the
schema): a bad one fails its own trial, with the reason, and the next trial runs as usual."""

from __future__ import annotations

import dataclasses

import pytest

from actors.actor import TrialRunner
from actors.measure import OfflineWindow
from sweeper.core.results import Energy, Throughput
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


def _twice(figures):
    # One figure computed, and sent, twice.
    return dataclasses.replace(figures, parts=(*figures.parts, Energy(energy_j=1.0)))


def _wrong_type(figures):
    return dataclasses.replace(figures, parts=tuple(Throughput(throughput_tok_s="fast") if isinstance(p, Throughput)
                                                    else p for p in figures.parts))


def _bad_request(figures):
    first, *rest = figures.requests
    return dataclasses.replace(figures, requests=[dataclasses.replace(first, output_tokens="three"), *rest])


@pytest.mark.parametrize(("plant", "message"), [
    (_twice, "Energy given twice"),
    (_wrong_type, "trials.throughput_tok_s"),  # a value the schema cannot hold
    (_bad_request, "requests.output_tokens"),  # in a request's record: its table is made in the actor
])
def test_a_bad_result_fails_its_trial_and_the_next_trial_runs(monkeypatch, plant, message):
    first, second, third = group()
    runner = TrialRunner()
    assert runner.load(first).ok
    try:
        assert runner.run(first).status == "ok"
        real = OfflineWindow.figures

        def planting(self, *args, **kwargs):
            # As a window whose producers made these would: they meet in the method's skeleton.
            return plant(real(self, *args, **kwargs))

        monkeypatch.setattr(OfflineWindow, "figures", planting)
        bad = runner.run(second)
        assert bad.status == "failed" and bad.row["reason"] == "invalid_row"
        assert message in bad.row["error"]
        # The failed row itself fits the schema: the driver writes it like any other.
        assert to_table("trials", [{"trial_id": second.trial_id, **bad.row}]).num_rows == 1
        monkeypatch.setattr(OfflineWindow, "figures", real)
        assert runner.run(third).status == "ok"
    finally:
        runner.close()
