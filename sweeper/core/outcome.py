"""What an actor sends back for one trial: the trials row and any other tables.

Shared by both planes so the driver can write shards without knowing how the
numbers were produced.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sweeper.core.stages import StageSpan
from sweeper.core.status import Reason, Status


@dataclass
class TrialOutcome:
    trial_id: str
    row: dict[str, Any]  # trials-table columns measured by the actor
    tables: dict[str, Any] = field(default_factory=dict)  # kind -> pyarrow.Table | list[dict]
    stages: list[StageSpan] = field(default_factory=list)  # where the actor's time went on this trial

    @property
    def status(self) -> str:
        return self.row.get("status", Status.FAILED)


@dataclass
class LoadResult:
    ok: bool
    load_s: float | None = None
    error: str | None = None
    reason: Reason | None = None  # why a load that is not ok failed (oom, load_failed, ...)
    stages: list[StageSpan] = field(default_factory=list)  # the actor's start and the load's stages
