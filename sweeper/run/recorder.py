"""Writing finished trials' shards off the scheduler's thread."""

from __future__ import annotations

import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from sweeper.core.results import Part, TrialResult
from sweeper.core.results.tables import StageRecord
from sweeper.core.schema import records_table
from sweeper.core.stages import StageSpan
from sweeper.core.trial import Trial
from sweeper.run.events import (
    CapacityFound,
    Placement,
    PlanSkipped,
    RunEvent,
    SearchPointFound,
    TrialRecorded,
)
from sweeper.run.storage import ResultStore


class Recorder:
    """Writes each trial's shards — auxiliary tables first, the trials row last (the commit) —
    on one writer thread, in the order they were recorded.

    The driver hands a finished trial over and submits the GPU's next trial at once: a
    trial's shards cost milliseconds of serialisation and fsyncs, which a GPU waiting on the
    driver would otherwise spend idle, once per trial. At most ``MAX_PENDING`` trials wait
    to be written (then ``record`` waits), so memory stays bounded when the disk is slower
    than the trials. A write that fails raises its ``OSError`` from the next ``record`` or
    from ``flush``, on the driver's thread.
    """

    MAX_PENDING = 64

    def __init__(self, store: ResultStore):
        self.store = store
        self.write_s = 0.0  # the writer thread's time spent writing
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sweeper-writer")
        self._pending: deque[Future[None]] = deque()

    @property
    def uri(self) -> str:
        return self.store.uri

    def record(self, trial: Trial, result: TrialResult, tables: dict[str, Any] | None = None,
               stages: list[StageSpan] | None = None, placement: Placement | None = None) -> None:
        while self._pending and self._pending[0].done():
            self._pending.popleft().result()  # a failed write raises here
        self._pending.append(self._pool.submit(self._write, trial, result, dict(tables or {}), stages, placement))
        while len(self._pending) > self.MAX_PENDING:
            self._pending.popleft().result()

    def on_event(self, event: RunEvent) -> None:
        """Write what the run's event says was decided (the recorder is one of its listeners)."""
        match event:
            case TrialRecorded():
                self.record(event.trial, event.result, dict(event.tables), list(event.stages), event.placement)
            case PlanSkipped(skips=skips):
                for trial, result in skips:
                    self.record(trial, result)
            case CapacityFound(capacity=found):
                self.record_derived("capacity", found.capacity_id or "", found)
            case SearchPointFound(key=key, point=point):
                self.record_derived("search", key, point)

    def record_derived(self, kind: str, key: str, row: Part) -> None:
        """A derived table's row (a capacity search's answer, a search point), written after
        every trial recorded before it."""
        self._pending.append(self._pool.submit(self.store.write_derived, kind, key, row))

    def flush(self) -> None:
        """Wait until every recorded trial is written (all of them, whatever fails); then raise
        the first failed write's error, if any."""
        first: OSError | None = None
        while self._pending:
            try:
                self._pending.popleft().result()
            except OSError as exc:
                first = first or exc
        if first is not None:
            raise first

    def shutdown(self) -> None:
        """End the writer thread (after ``flush``: nothing is left to write)."""
        self._pool.shutdown(wait=True)

    def _write(self, trial: Trial, result: TrialResult, tables: dict[str, Any],
               stages: list[StageSpan] | None, placement: Placement | None) -> None:
        t0 = time.monotonic()
        if stages:
            node, gpu_ids = (placement.node, placement.gpu_ids) if placement is not None else (None, None)
            tables["stages"] = records_table("stages", [StageRecord.of_span(span, trial.trial_id, node, gpu_ids)
                                                        for span in stages])
        for kind, table in tables.items():
            self.store.write_shard(kind, trial.trial_id, table)
        self.store.write_shard("trials", trial.trial_id, [{**trial.columns(), **result.row()}])
        self.write_s += time.monotonic() - t0
