"""``plan.json``: what a results directory's last run planned, written by the run, read by the analysis.

The trial ids say which stored results the aggregated tables answer for (the
rest are superseded); the report settings say how the analysis prices energy.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, ValidationError

from sweeper.core.settings import ReportSettings

PLAN_FILE = "plan.json"


class PlanRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    sweep: str
    written_at: str
    trial_ids: list[str]
    # The rows of each derived table (sweeper.core.schema.DERIVED) the sweep answers for, by their
    # shard's key: capacity searches by configuration, configuration searches' points.
    derived: dict[str, list[str]] = {}
    report: ReportSettings = ReportSettings()

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=0).encode()

    @classmethod
    def parse(cls, data: bytes | str) -> PlanRecord | None:
        """The record, or None for a file this version cannot read (then every result counts)."""
        try:
            return cls.model_validate(json.loads(data))
        except (ValueError, ValidationError):
            return None
