"""What an actor sends back: for one trial, its typed result and any other tables; for a
load, whether it worked.

Shared by both planes so the driver can write shards without knowing how the
numbers were produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sweeper.core.results import TrialResult
from sweeper.core.stages import StageSpan
from sweeper.core.status import Reason, Status


@dataclass
class TrialOutcome:
    trial_id: str
    result: TrialResult  # the trials-table columns the actor measured, as typed parts
    tables: dict[str, Any] = field(default_factory=dict)  # kind -> pyarrow.Table | list[dict]
    stages: list[StageSpan] = field(default_factory=list)  # where the actor's time went on this trial

    @property
    def row(self) -> dict[str, Any]:
        """The result's columns as a flat row, for readers that look them up by name."""
        return self.result.row()

    @property
    def status(self) -> str:
        return self.result.outcome.status or Status.FAILED


@dataclass
class LoadResult:
    ok: bool
    load_s: float | None = None
    error: str | None = None
    reason: Reason | None = None  # why a load that is not ok failed (oom, load_failed, ...)
    stages: list[StageSpan] = field(default_factory=list)  # the actor's start and the load's stages
