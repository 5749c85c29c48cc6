"""A trial's status, the reason codes of one that did not end ok, and the resume rule.

``Status`` and ``Reason`` are string-valued enums: a member *is* the string the
``status`` and ``reason`` columns hold (``Status.OK == "ok"``, it hashes, formats
and JSON-encodes as ``"ok"``), so rows, Parquet files and existing results
directories read exactly as before. A stored status read back from Parquet is a
plain ``str``; everything here accepts either.
"""

from __future__ import annotations

import enum
import sys
from datetime import datetime, timezone

from sweeper.core.results import Outcome

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10
    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` of Python 3.11: ``str()`` and formatting give the value."""

        __str__ = str.__str__
        __format__ = str.__format__


class Status(StrEnum):
    """The ``status`` column: how a trial ended."""

    OK = "ok"  # it ran and measured its figures (which may still be flagged unstable)
    FAILED = "failed"  # it was to run and did not produce its figures; ``reason`` says why
    SKIPPED = "skipped"  # it never ran, by decision (the plan's, or a smaller batch's OOM); ``reason`` says why


class Reason(StrEnum):
    """The ``reason`` column: why a trial is not ok (null on an ok trial)."""

    # -- skipped --
    # At plan time: the backend, precision or cluster cannot run this combination here (fp16 on
    # CPU, no vLLM on any node, a prompt longer than the model's context, wider than a node...);
    # ``error`` holds the plan's text. Recorded again by every run, before any trial starts.
    UNSUPPORTED = "unsupported"
    # At run time, with oom_pruning: a smaller batch of the same model and workload shape ran
    # out of memory, so this larger one would too. Re-run by --retry-failed.
    PREDICTED_OOM = "predicted_oom"

    # -- failed --
    # The model load or the trial ran out of device memory (the backend's is_out_of_memory);
    # a trial's OOM prunes the larger batches of its shape (PREDICTED_OOM).
    OOM = "oom"
    # The trial's measurement raised (or the call to its actor failed): ``error`` has the text.
    EXCEPTION = "exception"
    # The model load raised (not out of memory): every trial of the group fails with it.
    LOAD_FAILED = "load_failed"
    # The load ran past measure.load_timeout_s on every try (1 + max_retries fresh actors).
    LOAD_TIMEOUT = "load_timeout"
    # The actor died (a node lost, the OOM killer) more than max_retries times, loading or
    # running the trial.
    ACTOR_DIED = "actor_died"
    # The trial ran past measure.timeout_s (its actor is replaced), or a serving run's time
    # limit cut requests short (the row keeps what it measured).
    TIMEOUT = "timeout"
    # The layer-profiling pass raised after the headline window: the headline figures stay in
    # the row, the layer columns say "failed: ...".
    LAYER_PROFILE_FAILED = "layer_profile_failed"
    # The actor's row (or its requests) did not fit the schema: a column it does not know, or
    # a value its type cannot hold; ``error`` names the column. Checked in the actor, so a
    # misspelling or a worker of another version fails its trial, not the driver's writer.
    INVALID_ROW = "invalid_row"


def settles(status: str | None, reason: str | None, *, retry_failed: bool,
            still_unsupported: bool = False) -> bool:
    """The resume rule: whether a stored result stands, i.e. the trial is not run again.

    - ``ok`` stands;
    - ``failed``, and ``skipped`` as ``predicted_oom``, stand unless ``retry_failed``: they are
      results of this sweep's runs, re-run only on request;
    - ``skipped`` at plan time (``unsupported``) is the plan's verdict, not a result: it stands
      only while the plan still skips the trial, which the caller says with
      ``still_unsupported`` (a trial the plan now runs is run);
    - no status (nothing stored) never stands.
    """
    if status == Status.OK:
        return True
    if status == Status.FAILED or (status == Status.SKIPPED and reason == Reason.PREDICTED_OOM):
        return not retry_failed
    if status == Status.SKIPPED:
        return still_unsupported
    return False


def _outcome(status: Status, reason: Reason, error: str, started_at: datetime | None) -> Outcome:
    now = datetime.now(timezone.utc)
    return Outcome(status=status, reason=reason, error=error, started_at=started_at or now, finished_at=now)


def failed_outcome(reason: Reason, error: str, *, started_at: datetime | None = None) -> Outcome:
    """The outcome of a failed trial (``started_at`` defaults to now, ``finished_at`` is now)."""
    return _outcome(Status.FAILED, reason, error, started_at)


def skipped_outcome(reason: Reason, error: str) -> Outcome:
    """The outcome of a skipped trial: it never started, so both times are now."""
    return _outcome(Status.SKIPPED, reason, error, None)
