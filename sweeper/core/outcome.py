"""What an actor sends back: for one trial, its typed result and any other tables; for a
load, whether it worked; for its first call, where it runs.

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


@dataclass(frozen=True)
class Placement:
    """Where a group's actor runs: its node and the GPUs Ray gave it there (the actor's answer
    to its first call, ``ping``)."""

    hostname: str
    node_id: str
    gpu_ids: str | None  # node-local, comma-separated; None: no GPU (CPU-only cluster)
    pid: int | None = None  # the actor's process: lets an operator (or a fault test) find it

    @property
    def node(self) -> str:
        # Nodes of one host (a local test cluster) differ only in their Ray node id.
        return f"{self.hostname}:{self.node_id[:8]}"

    @property
    def gpus(self) -> str:
        return f"GPU {self.gpu_ids}" if self.gpu_ids else "CPU"

    @property
    def slots(self) -> tuple[str, ...]:
        """One name per GPU held (``node GPU i``), or the node's ``CPU``: what the run's
        per-GPU accounting counts a group's time and loads against."""
        ids = [i.strip() for i in (self.gpu_ids or "").split(",") if i.strip()]
        return tuple(f"{self.node} GPU {i}" for i in ids) or (f"{self.node} CPU",)

    def __str__(self) -> str:
        return f"{self.node} {self.gpus}"
