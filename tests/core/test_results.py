"""The typed result parts and the trials schema are one declaration: every result column is a
field of exactly one part, with its type and meaning, and a result flattens to exactly them."""

from __future__ import annotations

import typing
from dataclasses import fields
from datetime import datetime, timezone

import pytest

from sweeper.core.configuration import Configuration
from sweeper.core.results import (
    Energy,
    Latency,
    Outcome,
    Part,
    RowError,
    Stability,
    Throughput,
    TrialResult,
)
from sweeper.core.schema import _IDENTITY, TRIALS, _axis_columns, to_table
from sweeper.core.status import Reason, Status, failed_outcome
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep

_PARTS: tuple[type[Part], ...] = (Configuration, *TrialResult.part_types())


def _declared() -> list[tuple[str, type[Part]]]:
    return [(f.name, part) for part in _PARTS for f in fields(part)]


def test_every_result_column_of_the_schema_is_one_field_of_one_part_with_its_type_and_meaning():
    declared = _declared()
    names = [name for name, _ in declared]
    assert len(names) == len(set(names)), "a column declared by two parts"
    fixed = {c.name for c in _IDENTITY + _axis_columns()}
    schema = {c.name: c for c in TRIALS if c.name not in fixed}
    assert set(names) == set(schema), (set(names) ^ set(schema))
    arrow = {str: "string", int: "int64", float: "double", bool: "bool", datetime: "timestamp[us, tz=UTC]",
             list[float]: "list<item: double>", list[int]: "list<item: int64>",
             list[float | None]: "list<item: double>", list[int | None]: "list<item: int64>"}
    for name, part in declared:
        spec = next(s for s in part.specs() if s.name == name)
        assert str(schema[name].type) == arrow[spec.type], name
        assert spec.doc and schema[name].doc == spec.doc, name
        hint = typing.get_type_hints(part)[name]
        assert type(None) in typing.get_args(hint), f"{part.__name__}.{name} must be nullable"


def test_a_result_flattens_to_exactly_its_columns_and_the_table_holds_them():
    result = TrialResult(failed_outcome(Reason.TIMEOUT, "ran past"), throughput=Throughput(throughput_tok_s=12.5))
    row = result.row()
    assert set(row) == {name for name, part in _declared() if part is not Configuration}
    assert (row["status"], row["reason"], row["throughput_tok_s"], row["energy_j"]) == ("failed", "timeout", 12.5, None)
    (trial,), _ = expand(parse_sweep({"name": "r", "models": "tiny-llama", "backends": "noop", "precisions": "fp32",
                                      "batch_sizes": 1, "workload": {"input_len": 8, "output_len": 4}}))
    config = trial.columns()
    assert not set(config) & set(row)  # the driver's columns and the actor's never overlap
    stored = to_table("trials", [{**config, **row}]).to_pylist()[0]
    assert (stored["trial_id"], stored["status"], stored["throughput_tok_s"]) == (trial.trial_id, "failed", 12.5)


def test_a_flat_row_goes_to_the_parts_that_declare_its_columns_and_an_unknown_one_is_named():
    started = datetime(2026, 1, 1, tzinfo=timezone.utc)
    result = TrialResult.from_row({"status": Status.OK, "started_at": started, "energy_j": 3.0, "mfu": 0.4,
                                   "fidelity_kl": 0.01, "gpu_energy_j": [1.0, 2.0]})
    assert (result.outcome.started_at, result.energy.energy_j, result.roofline.mfu) == (started, 3.0, 0.4)
    assert result.fidelity.fidelity_kl == 0.01 and result.energy.gpu_energy_j == [1.0, 2.0]
    with pytest.raises(RowError, match="energy_joules"):
        TrialResult.from_row({"status": Status.OK, "energy_joules": 3.0})
    with pytest.raises(RowError, match="Throughput: column.*energy_j"):
        Throughput.of({"energy_j": 3.0})
    with pytest.raises(RowError, match="outcome"):
        TrialResult.from_row({"energy_j": 3.0})
    with pytest.raises(TypeError):
        Throughput(energy_j=3.0)  # type: ignore[call-arg]  # a part built by keyword is checked where it is built


def test_a_result_is_made_of_its_producers_parts_each_once():
    ok = Outcome(status=Status.OK)
    result = TrialResult.of(ok, Throughput(duration_s=2.0), None, Energy(energy_j=5.0), Stability(unstable=False))
    assert (result.throughput.duration_s, result.energy.energy_j, result.stability.unstable) == (2.0, 5.0, False)
    assert result.latency == Latency() and result.row()["ttft_s"] is None  # a part not given stays empty
    with pytest.raises(RowError, match="Energy given twice"):
        TrialResult.of(ok, Energy(energy_j=5.0), Energy(energy_j=6.0))
    with pytest.raises(RowError, match="Configuration is not a part of a trial's result"):
        TrialResult.of(ok, Configuration())
