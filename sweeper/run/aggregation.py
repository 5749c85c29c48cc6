"""The aggregated tables of a results directory: the shards merged, answering for the plan.

    <kind>.parquet                       the results of the sweep last run here (its plan)
    superseded/<kind>.parquet            every other stored result

Results of trials the sweep no longer has (a removed batch size, a changed measurement
setting) stay on disk and in ``superseded/``; nothing measured is ever deleted.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from datetime import datetime

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sweeper.core.errors import ResultsError, first_line
from sweeper.core.plan_record import PLAN_FILE
from sweeper.core.schema import DERIVED, TABLES, arrow_schema
from sweeper.run.shards import BATCH_FILES, TRIALS, ShardFiles, stem

_SORT = {
    "trials": [("started_at", "ascending"), ("trial_id", "ascending")],
    "requests": [("trial_id", "ascending"), ("iteration", "ascending"), ("request_index", "ascending")],
    "timeline": [("trial_id", "ascending"), ("t_s", "ascending"), ("gpu_index", "ascending")],
    "layers": [("trial_id", "ascending"), ("phase", "descending"), ("layer_index", "ascending"),
               ("module", "ascending")],
    "stages": [("started_at", "ascending"), ("trial_id", "ascending")],
}


class Aggregation:
    """One aggregation of ``files`` for the plan's trials (``planned``; None: every stored trial)."""

    def __init__(self, files: ShardFiles, planned: set[str] | None) -> None:
        self.files, self.planned = files, planned
        self.superseded = 0  # stored trials left out: not in the plan
        # The plan's trials table as written (in memory: one row per trial), for what the run
        # shows at its end without reading it back; None until this aggregation has run.
        self.trials: pa.Table | None = None

    def run(self, *, full: bool = False) -> dict[str, int]:
        """Merge the shards into ``<root>/<kind>.parquet`` (the plan's trials) and
        ``<root>/superseded/<kind>.parquet`` (every other stored trial); return row counts.

        Incrementally where it can (``full=False``): when the last aggregation answers for
        the same plan, every one of its trials still has its shard, and its files have the
        current schema, each table keeps its previous rows but those of trials written
        since (re-run or new) and adds theirs, reading only the new shards and one file
        per table. Otherwise, and with ``full``, everything is rebuilt from the shards:
        so too when a previous table does not read (footer or pages), said in one line.
        Damaged shards the index can tell (another size than written) are moved aside first.
        """
        if not self.files.shard_paths(TRIALS):
            raise ResultsError(f"{self.files.uri}: no trial shards found (is this a sweeper output directory?)")
        stored = {stem(p) for p in self.files.shard_paths(TRIALS)}
        planned = self.planned
        current = stored if planned is None else stored & planned
        superseded = stored - current
        changed = None if full else self._changed_since_aggregate(stored, current)
        counts = {}
        if changed is not None:
            try:
                for kind in TABLES:
                    counts[kind] = self._aggregate_changes(kind, current, changed)
            except _Unreadable as exc:
                # Its footer read, a page of it did not: what was kept of it cannot be trusted,
                # so every table is rebuilt from the shards (those updated already included).
                self._say_unreadable(exc.path, exc.why)
            else:
                self.superseded = len(superseded)  # the plan is unchanged: so are the superseded tables
                return counts
        for kind in TABLES:
            counts[kind] = self._aggregate(kind, current, posixpath.join(self.files.root, f"{kind}.parquet"))
            target = posixpath.join(self.files.root, "superseded", f"{kind}.parquet")
            if superseded:
                self.files.fs.create_dir(posixpath.join(self.files.root, "superseded"), recursive=True)
                self._aggregate(kind, superseded, target)
            elif self.files.fs.get_file_info(target).type == pafs.FileType.File:
                self.files.fs.delete_file(target)  # an aggregate, not a result: the shards stay
        self.superseded = len(superseded)
        return counts

    def _aggregate(self, kind: str, trial_ids: set[str], target: str) -> int:
        if kind == TRIALS:
            # One row per trial: small enough to sort whole (by start time).
            table = self.files.read_shards(kind, trial_ids=trial_ids)
            if table.num_rows:
                table = table.sort_by(_SORT[kind])
            self.files.write_atomic(table, target)
            if target == posixpath.join(self.files.root, f"{TRIALS}.parquet"):  # the plan's, not superseded/
                self.trials = table
            return int(table.num_rows)
        # The per-trial tables can be large (timelines): read and written a batch of
        # shards at a time, in trial-id order, so memory stays flat in the number of trials.
        ids = sorted(trial_ids & {stem(p) for p in self.files.shard_paths(kind)})
        schema = arrow_schema(kind)
        with self.files.atomic_output(target) as out, pq.ParquetWriter(out, schema) as writer:
            rows = self._append_shards(writer, kind, ids)
            if not rows:
                writer.write_table(schema.empty_table())
        return rows

    def _append_shards(self, writer: pq.ParquetWriter, kind: str, ids: list[str]) -> int:
        """The shards of ``ids``, a batch of files at a time, each batch sorted; rows written."""
        rows = 0
        for start in range(0, len(ids), BATCH_FILES):
            batch = self.files.read_shards(kind, trial_ids=ids[start:start + BATCH_FILES])
            if batch.num_rows:
                writer.write_table(batch.sort_by(_SORT[kind]))
                rows += batch.num_rows
        return rows

    def _changed_since_aggregate(self, stored: set[str], current: set[str]) -> set[str] | None:
        """The trials whose shards were written since the last aggregation, or None when the
        aggregates cannot be updated in place (none yet, another plan, a trial of theirs whose
        shard is gone, a schema that has changed since, a results store without local mtimes)."""
        targets = [posixpath.join(self.files.root, f"{kind}.parquet") for kind in TABLES]
        since = self._aggregated_at(targets)
        if since is None or not self._aggregates_current(targets):
            return None
        previous = self._aggregated_trials(targets[0])
        if previous is None:
            return None
        if not previous <= current:
            return None  # a trial it holds lost its shard (quarantined, moved away): rebuild
        # A trial the previous aggregate lacks is new whatever its shards' times say.
        return (self._shards_written_since(since) | (current - previous)) & stored

    def _aggregated_at(self, targets: list[str]) -> datetime | None:
        """When the last aggregation wrote ``targets`` (the oldest one's mtime), or None when
        they cannot tell: a store without local mtimes, a table missing, a plan written since."""
        if not self.files.local:
            return None
        infos = self.files.fs.get_file_info(targets)
        if any(i.type != pafs.FileType.File or i.mtime is None for i in infos):
            return None
        since: datetime = min(i.mtime for i in infos)
        plan = self.files.fs.get_file_info(posixpath.join(self.files.root, PLAN_FILE))
        if plan.mtime is not None and plan.mtime > since:
            return None
        return since

    def _aggregates_current(self, targets: list[str]) -> bool:
        """Whether every aggregate in ``targets`` (one per table, in ``TABLES`` order) reads and
        has its table's current schema; each that does not read is said."""
        # A previous aggregate that does not read (cut short by a copy, damaged on disk) cannot be
        # updated in place: everything is rebuilt from the shards, which hold every result.
        schemas = {}
        for kind, target in zip(TABLES, targets, strict=True):
            try:
                schemas[kind] = pq.read_schema(target).remove_metadata()
            except (pa.ArrowInvalid, OSError) as exc:
                self._say_unreadable(target, first_line(exc))
        return len(schemas) == len(TABLES) and all(schemas[kind] == arrow_schema(kind) for kind in TABLES)

    def _aggregated_trials(self, trials_target: str) -> set[str] | None:
        """The trial ids the previous trials aggregate holds (None, and said: it does not read)."""
        try:
            return set(pq.read_table(trials_target, columns=["trial_id"]).column("trial_id").to_pylist())
        except (pa.ArrowInvalid, OSError) as exc:
            self._say_unreadable(trials_target, first_line(exc))
            return None

    def _shards_written_since(self, since: datetime) -> set[str]:
        """The trials with a shard of any table written at ``since`` or later."""
        changed: set[str] = set()
        for kind in TABLES:
            selector = pafs.FileSelector(self.files.shard_dir(kind), allow_not_found=True)
            changed |= {stem(i.path) for i in self.files.fs.get_file_info(selector)
                        if i.is_file and i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
                        and i.mtime is not None and i.mtime >= since}
        return changed

    def _aggregate_changes(self, kind: str, current: set[str], changed: set[str]) -> int:
        """``<kind>.parquet`` rewritten as its previous rows less the changed trials' plus
        theirs from their shards: one file and the new shards read, a batch at a time."""
        import pyarrow.compute as pc

        target = posixpath.join(self.files.root, f"{kind}.parquet")
        fresh = sorted(changed & current)
        drop = pa.array(sorted(changed), pa.string())
        schema = arrow_schema(kind)
        rows = 0
        if kind == TRIALS:  # one row per trial: sorted whole, as a full aggregation sorts it
            try:
                kept = pq.read_table(target, schema=schema)
            except (pa.ArrowInvalid, OSError) as exc:
                raise _Unreadable(target, first_line(exc)) from None
            kept = kept.filter(pc.invert(pc.is_in(kept.column("trial_id"), value_set=drop)))
            table = pa.concat_tables([kept, self.files.read_shards(kind, trial_ids=fresh)]).combine_chunks()
            if table.num_rows:
                table = table.sort_by(_SORT[kind])
            self.files.write_atomic(table, target)
            self.trials = table
            return int(table.num_rows)
        with self.files.atomic_output(target) as out, pq.ParquetWriter(out, schema) as writer:
            for batch in _previous_batches(target):
                batch = batch.filter(pc.invert(pc.is_in(batch.column("trial_id"), value_set=drop)))
                if batch.num_rows:
                    writer.write_table(pa.Table.from_batches([batch], schema=schema))
                    rows += batch.num_rows
            rows += self._append_shards(writer, kind, fresh)
            if not rows:
                writer.write_table(schema.empty_table())
        return rows

    def up_to_date(self) -> bool:
        """Whether the aggregated tables already hold every shard and the current plan
        (nothing written since the last aggregation) and each still reads (its footer): a
        resume with nothing to run skips aggregating then, and only then."""
        target = self.files.fs.get_file_info(posixpath.join(self.files.root, f"{TRIALS}.parquet"))
        if target.type != pafs.FileType.File or target.mtime is None:
            return False
        # Newer than every shard is not enough: a table cut short or emptied since (a copy, a
        # disk that filled under another writer) is newer still. Each aggregate's footer is
        # read (a few KB each); one missing or unreadable is rebuilt, as a run with work would.
        derived = [kind for kind in DERIVED if self.files.fs.get_file_info(
            posixpath.join(self.files.root, f"{kind}.parquet")).type == pafs.FileType.File]
        if not all(self._footer_reads(posixpath.join(self.files.root, f"{kind}.parquet"))
                   for kind in (*TABLES, *derived)):
            return False
        newest = self.files.fs.get_file_info(posixpath.join(self.files.root, PLAN_FILE)).mtime
        for kind in (*TABLES, *DERIVED):
            selector = pafs.FileSelector(self.files.shard_dir(kind), allow_not_found=True)
            for info in self.files.fs.get_file_info(selector):
                if info.mtime is not None and (newest is None or info.mtime > newest):
                    newest = info.mtime
        return newest is not None and newest <= target.mtime

    def _footer_reads(self, path: str) -> bool:
        try:
            with self.files.fs.open_input_file(path) as f:
                pq.read_metadata(f)
            return True
        except (pa.ArrowInvalid, OSError):
            return False

    def _say_unreadable(self, path: str, why: str) -> None:
        self.files.on_quarantine(f"{path}: not a readable Parquet table ({why}): rebuilding it from the shards")


class _Unreadable(Exception):
    """A previous aggregate that an in-place update could not read: the update gives way to a rebuild."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def _previous_batches(target: str) -> Iterator[pa.RecordBatch]:
    """A previous aggregate's rows, a batch at a time; a read that fails is ``_Unreadable`` (the
    caller's own writes, between the batches, raise as they are)."""
    try:
        yield from pq.ParquetFile(target).iter_batches(batch_size=65_536)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _Unreadable(target, first_line(exc)) from None


def aggregate_derived(files: ShardFiles, kind: str, planned: set[str] | None) -> int | None:
    """``<kind>.parquet`` of a derived table (``sweeper.core.schema.DERIVED``): the rows the plan
    answers for (``planned``; None: every stored one), and ``superseded/<kind>.parquet`` the
    rest; None where the run made none. A row per search or point, so small: rebuilt whole."""
    target = posixpath.join(files.root, f"{kind}.parquet")
    superseded_target = posixpath.join(files.root, "superseded", f"{kind}.parquet")
    if planned is not None and not planned and files.fs.get_file_info(target).type != pafs.FileType.File:
        return None  # the plan has no such rows and no aggregate of them is left: nothing to list
    stored = {stem(p) for p in files.shard_paths(kind)}
    if not stored and not planned:
        for path in (target, superseded_target):
            if files.fs.get_file_info(path).type == pafs.FileType.File:
                files.fs.delete_file(path)  # an aggregate of shards that are gone
        return None
    current = stored if planned is None else stored & planned
    table = files.read_shards(kind, trial_ids=current)
    order = DERIVED_ORDER[kind]
    files.write_atomic(table.sort_by(order) if table.num_rows else table, target)
    rest = stored - current
    if rest:
        files.fs.create_dir(posixpath.join(files.root, "superseded"), recursive=True)
        files.write_atomic(files.read_shards(kind, trial_ids=rest), superseded_target)
    elif files.fs.get_file_info(superseded_target).type == pafs.FileType.File:
        files.fs.delete_file(superseded_target)
    return int(table.num_rows)


DERIVED_ORDER = {
    "capacity": [("capacity_id", "ascending")],
    "search": [("search_id", "ascending"), ("search_step", "ascending")],
}
assert set(DERIVED_ORDER) == set(DERIVED)
