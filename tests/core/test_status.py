"""Status, Reason and the resume rule: the strings results hold, and when a stored result stands."""

from __future__ import annotations

import itertools
import json
import re
from datetime import datetime, timezone

import pyarrow.parquet as pq
import pytest

from sweeper.core.schema import TRIALS, to_table
from sweeper.core.status import Reason, Status, failed_outcome, settles, skipped_outcome
from tests.conftest import ROOT

# The strings results directories written so far hold: renaming a member breaks them.
STATUS_VALUES = {"ok", "failed", "skipped"}
REASON_VALUES = {"unsupported", "predicted_oom", "oom", "exception", "load_failed", "load_timeout",
                 "actor_died", "timeout", "layer_profile_failed", "invalid_row"}


def test_the_values_are_the_strings_stored_results_hold():
    assert {s.value for s in Status} == STATUS_VALUES
    assert {r.value for r in Reason} == REASON_VALUES


def test_every_status_and_reason_in_the_committed_results_is_a_member():
    files = sorted((ROOT / "docs" / "data").glob("*trials.parquet"))
    assert files
    for path in files:
        table = pq.read_table(path, columns=["status", "reason"])
        statuses = set(table.column("status").to_pylist())
        reasons = set(table.column("reason").to_pylist()) - {None}
        assert statuses <= set(Status), (path.name, statuses)
        assert reasons <= set(Reason), (path.name, reasons)


def test_every_reason_code_the_docs_name_is_a_member():
    named = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        named |= set(re.findall(r"\breason `([a-z_]+)`", path.read_text()))
    assert named, "the README names reason codes (`timeout`, `actor_died`, ...)"
    assert named <= set(Reason), named - set(Reason)


def test_the_schema_lists_every_status_and_reason():
    doc = {c.name: c.doc for c in TRIALS}
    assert all(s in doc["status"] for s in Status)
    assert all(r in doc["reason"] for r in Reason)


def test_a_member_is_its_string_everywhere_a_row_goes():
    for member in (Status.FAILED, Reason.PREDICTED_OOM):
        value = member.value
        assert member == value and hash(member) == hash(value) and {value: 1}[member] == 1
        assert str(member) == f"{member}" == f"{member:<6}".strip() == value
        assert json.dumps({"x": member}) == json.dumps({"x": value})
    row = {"trial_id": "t1", **dict(failed_outcome(Reason.OOM, "CUDA out of memory").items())}
    stored = to_table("trials", [row]).select(["status", "reason"]).to_pylist()
    assert stored == [{"status": "failed", "reason": "oom"}]
    assert type(stored[0]["status"]) is str


def test_failed_and_skipped_outcomes():
    started = datetime(2026, 1, 1, tzinfo=timezone.utc)
    failed = failed_outcome(Reason.TIMEOUT, "ran past", started_at=started)
    assert (failed.status, failed.reason, failed.error) == ("failed", "timeout", "ran past")
    assert failed.started_at == started < failed.finished_at
    skipped = skipped_outcome(Reason.UNSUPPORTED, "fp16 on CPU")
    assert (skipped.status, skipped.reason, skipped.error) == ("skipped", "unsupported", "fp16 on CPU")
    assert skipped.started_at == skipped.finished_at


def _expected(status: str | None, reason: str | None, retry_failed: bool, still_unsupported: bool) -> bool:
    """The rule as the docs state it, case by case."""
    if status == "ok":
        return True  # an ok result is never re-run
    if status == "failed":
        return not retry_failed  # a failure stands until --retry-failed
    if status == "skipped" and reason == "predicted_oom":
        return not retry_failed  # a run-time skip is a result too, re-run by --retry-failed
    if status == "skipped":
        return still_unsupported  # a plan-time skip stands only while the plan still skips it
    return False  # nothing stored


@pytest.mark.parametrize("status", [*Status, None])
def test_the_resume_rule_for_every_status_reason_and_flag(status):
    for reason, retry_failed, still_unsupported in itertools.product([*Reason, None], [False, True], [False, True]):
        got = settles(status, reason, retry_failed=retry_failed, still_unsupported=still_unsupported)
        assert got is _expected(status, reason, retry_failed, still_unsupported), \
            (status, reason, retry_failed, still_unsupported)


def test_the_resume_rule_takes_the_plain_strings_read_back_from_parquet():
    assert settles("ok", None, retry_failed=True)
    assert settles("failed", "oom", retry_failed=False) and not settles("failed", "oom", retry_failed=True)
    assert settles("skipped", "predicted_oom", retry_failed=False)
    assert not settles("skipped", "unsupported", retry_failed=False)
    assert settles("skipped", "unsupported", retry_failed=True, still_unsupported=True)
