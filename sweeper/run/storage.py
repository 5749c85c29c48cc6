"""Result storage: a results directory, written one trial at a time and aggregated after.

Layout under the output root (a local path or any pyarrow.fs URI)::

    shards/<kind>/<trial_id>.parquet     one shard per trial per table kind (shards.py)
    shards/trials.index                  each committed trial's status (trial_index.py)
    plan.json                            the trial ids of the sweep last run here
    <kind>.parquet                       aggregated: the results of that sweep (aggregation.py)
    superseded/<kind>.parquet            aggregated: every other stored result
    quarantine/<kind>/<name>             shards that could not be read, moved aside

A trial's ``trials`` shard is written last, so its presence means the trial's other
shards are complete; a shard of another kind without one (a run killed between the two)
is an orphan and never aggregated. ``ResultStore`` is the directory as the rest of
sweeper sees it: the per-trial write path, what a resume needs to know (the index), the
plan record, and aggregation, each kept in the module named above.
"""

from __future__ import annotations

import os
import posixpath
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.fs as pafs

from sweeper.core.errors import first_line
from sweeper.core.plan_record import PLAN_FILE, PlanRecord
from sweeper.core.results import Part
from sweeper.core.schema import DERIVED
from sweeper.core.settings import ReportSettings
from sweeper.run.aggregation import Aggregation, aggregate_derived
from sweeper.run.shards import TRIALS, ShardFiles, StorageError
from sweeper.run.trial_index import StoredTrial, TrialIndex

__all__ = ["LOW_SPACE_BYTES", "ResultStore", "StorageError", "StoredTrial", "check_destination"]


class ResultStore:
    def __init__(self, root: str, *, on_quarantine: Callable[[str], None] | None = None):
        self.files = ShardFiles(root, on_quarantine=on_quarantine)
        self.index = TrialIndex(self.files)
        self.uri, self.fs, self.root, self.local = self.files.uri, self.files.fs, self.files.root, self.files.local
        self.superseded = 0  # trials left out of the last aggregation: not in the recorded plan
        # The trials table the last aggregation wrote, as it holds it (None: none ran here).
        self.aggregated_trials: pa.Table | None = None
        # plan.json as read once (or as written since). Like the index's view, it holds for the
        # store's life, which a writer's run lock covers.
        self._plan: PlanRecord | None = None
        self._plan_read = False

    @property
    def server_log_dir(self) -> str | None:
        """Where the servers a run launches write their logs: ``DIR/servers`` of a results
        directory on a filesystem (on the node that launched each; ``server_log`` names it),
        None for an object store (each node's sweeper cache then)."""
        return os.path.join(self.root, "servers") if self.local else None

    # -- the per-trial write path, and reading it back ------------------------------------
    def write_shard(self, kind: str, trial_id: str, table: pa.Table | list[dict]) -> None:
        written = self.files.write_shard(kind, trial_id, table)
        if kind == TRIALS and written.num_rows:
            self.index.record(trial_id, written)

    def read_shards(self, kind: str, *, trial_ids: Iterable[str] | None = None,
                    columns: list[str] | None = None) -> pa.Table:
        return self.files.read_shards(kind, trial_ids=trial_ids, columns=columns)

    def shard_paths(self, kind: str) -> list[str]:
        return self.files.shard_paths(kind)

    def stored_trials(self) -> dict[str, StoredTrial]:
        return self.index.stored_trials()

    def remove_stale_temporaries(self) -> int:
        return self.files.remove_stale_temporaries()

    def exists(self) -> bool:
        return self.files.exists()

    # -- the plan ---------------------------------------------------------------
    def write_plan(self, sweep: str, trial_ids: Iterable[str], report: ReportSettings | None = None,
                   derived: Mapping[str, Iterable[str]] | None = None) -> None:
        """Record which trials (and rows of the derived tables: capacity searches, search points)
        the sweep now has (what the aggregated tables answer for) and how its energy is priced."""
        ids = sorted(set(trial_ids))
        keys = {kind: sorted(set(values)) for kind, values in (derived or {}).items() if values}
        report = report if report is not None else ReportSettings()
        current = self.plan_record()
        if current is not None and current.trial_ids == ids and current.report == report and current.derived == keys:
            return  # unchanged: left as it is, so the aggregates stay up to date
        record = PlanRecord(sweep=sweep, written_at=datetime.now(timezone.utc).isoformat(),
                            trial_ids=ids, report=report, derived=keys)
        self.files.fs.create_dir(self.files.root, recursive=True)
        with self.files.atomic_output(posixpath.join(self.files.root, PLAN_FILE)) as out:
            out.write(record.to_json())
        self._plan, self._plan_read = record, True

    def plan_record(self) -> PlanRecord | None:
        if not self._plan_read:
            path = posixpath.join(self.files.root, PLAN_FILE)
            try:
                with self.files.fs.open_input_stream(path) as f:
                    self._plan = PlanRecord.parse(f.read())
            except (FileNotFoundError, OSError):
                self._plan = None
            self._plan_read = True
        return self._plan

    def planned_ids(self) -> set[str] | None:
        """The trial ids of the sweep last run here, or None (no plan recorded: every result counts)."""
        record = self.plan_record()
        return set(record.trial_ids) if record is not None else None

    def write_derived(self, kind: str, key: str, row: Part) -> None:
        """A derived table's row (a capacity search's answer, a search point) as its shard,
        replaced by a later one of the same key."""
        self.files.write_shard(kind, key, [dict(row.items())])

    # -- aggregation -----------------------------------------------------------
    def aggregate(self, *, full: bool = False) -> dict[str, int]:
        """``Aggregation.run`` for the recorded plan; damaged shards the index can tell
        (another size than written) are moved aside first."""
        if self.local:
            self.stored_trials()  # stats only, once indexed: no trial is aggregated short of a shard
        aggregation = Aggregation(self.files, self.planned_ids())
        counts = aggregation.run(full=full)
        self.superseded = aggregation.superseded
        self.aggregated_trials = aggregation.trials
        record = self.plan_record()
        for kind in DERIVED:
            rows = aggregate_derived(self.files, kind, set(record.derived.get(kind, ())) if record is not None else None)
            if rows is not None:
                counts[kind] = rows
        return counts

    def up_to_date(self) -> bool:
        return Aggregation(self.files, None).up_to_date()


# Below this much free space the run says so before it starts: shards are small, but
# timelines of long GPU trials are not.
LOW_SPACE_BYTES = 1 << 30


def check_destination(store: ResultStore) -> str | None:
    """Fail now, before a cluster starts or a GPU spins, if results cannot be written there.

    Returns a warning line when free space is low, else None.
    """
    if not store.local:
        try:
            info = store.fs.get_file_info(store.root)
        except OSError as exc:
            raise StorageError(f"--output {store.uri}: cannot reach it: {first_line(exc)}") from None
        if info.type == pafs.FileType.File:
            raise StorageError(f"--output {store.uri}: is an object, not a prefix")
        return None
    root = store.root
    if os.path.exists(root) and not os.path.isdir(root):
        raise StorageError(f"--output {root}: is a file, not a directory")
    try:
        os.makedirs(root, exist_ok=True)
        probe = os.path.join(root, f".write-probe.{uuid.uuid4().hex}")
        with open(probe, "wb") as f:
            f.write(b"sweeper")
        os.unlink(probe)
    except OSError as exc:
        raise StorageError(f"--output {root}: not writable: {exc.strerror or first_line(exc)}") from None
    import shutil

    free = shutil.disk_usage(root).free
    if free < LOW_SPACE_BYTES:
        return f"only {free / 2**20:,.0f} MiB free under {root}: a full disk stops the sweep (resume completes it)"
    return None
