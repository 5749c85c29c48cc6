"""Result storage: atomic per-trial shards and their aggregation.

Layout under the output root (a local path or any pyarrow.fs URI)::

    shards/<kind>/<trial_id>.parquet     one shard per trial per table kind
    plan.json                            the trial ids of the sweep last run here
    <kind>.parquet                       aggregated: the results of that sweep
    superseded/<kind>.parquet            aggregated: every other stored result
    quarantine/<kind>/<name>             shards that could not be read, moved aside

A shard becomes visible only whole: locally it is written under a hidden
temporary name, flushed to disk (fsync), renamed, and its directory flushed;
on object stores a single put is atomic already. A trial's ``trials`` shard is
written last, so its presence means the trial's other shards are complete;
a shard of another kind without one (a run killed between the two) is an
orphan and never aggregated.

The aggregated tables answer for the sweep as it is now: ``sweeper run``
records its plan, and ``trials.parquet`` holds one row per trial of that plan.
Results of trials the sweep no longer has (a removed batch size, a changed
measurement setting) stay on disk and in ``superseded/``; nothing measured is
ever deleted.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sweeper.core.errors import ResultsError, UserInputError
from sweeper.core.plan_record import PLAN_FILE, PlanRecord
from sweeper.core.schema import TABLES, arrow_schema, to_table
from sweeper.core.settings import ReportSettings

TRIALS = "trials"
INDEX_FILE = "trials.index"
# Shards read per batch while aggregating: memory stays flat in the number of trials.
BATCH_FILES = 256


# A shard is one trial's rows, read whole by aggregation and never filtered on its own:
# column statistics and dictionaries buy nothing there, and cost a quarter of the write of
# a 165-column trials row (the driver writes one per trial). The aggregated tables keep both.
SHARD_WRITE_OPTIONS: dict[str, Any] = {"write_statistics": False, "use_dictionary": False}


class StorageError(UserInputError):
    """The results destination cannot be used (not a directory, not writable, unknown scheme, full)."""

_SORT = {
    "trials": [("started_at", "ascending"), ("trial_id", "ascending")],
    "requests": [("trial_id", "ascending"), ("iteration", "ascending"), ("request_index", "ascending")],
    "timeline": [("trial_id", "ascending"), ("t_s", "ascending"), ("gpu_index", "ascending")],
    "layers": [("trial_id", "ascending"), ("phase", "descending"), ("layer_index", "ascending"),
               ("module", "ascending")],
    "stages": [("started_at", "ascending"), ("trial_id", "ascending")],
}


def _single_put(uri: str) -> str:
    """An ``s3://`` URI whose small objects are written with one PutObject.

    Without ``allow_delayed_open`` pyarrow writes every object, however small,
    as a multipart upload: three requests per shard instead of one, and some
    S3-compatible servers (moto, found by the object-store test) reject the
    completion. A URI that sets the option itself keeps its own choice.
    """
    if not uri.startswith("s3://") or "allow_delayed_open=" in uri:
        return uri
    return uri + ("&" if "?" in uri else "?") + "allow_delayed_open=true"


@dataclass(frozen=True)
class StoredTrial:
    trial_id: str
    status: str
    reason: str | None = None


@dataclass(frozen=True)
class _Indexed:
    """A line of ``trials.index``: a committed trial's status and each of its shards' size in
    bytes, by table, when it was committed (a line of an older sweeper has none: its shard is read)."""
    stored: StoredTrial
    sizes: dict[str, int]


def _stem(path: str) -> str:
    return posixpath.basename(path).removesuffix(".parquet")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ResultStore:
    def __init__(self, root: str, *, on_quarantine: Callable[[str], None] | None = None):
        self.uri = root
        if "://" in root:
            try:
                self.fs, self.root = pafs.FileSystem.from_uri(_single_put(root))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OSError) as exc:
                raise StorageError(f"--output {root}: not a usable results location: {_first_line(exc)}") from None
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(root)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        # Told one line per shard moved aside (the CLI prints it); default: silent.
        self.on_quarantine = on_quarantine or (lambda line: None)
        self.superseded = 0  # trials left out of the last aggregation: not in the recorded plan

    # -- writing ---------------------------------------------------------------
    def _shard_dir(self, kind: str) -> str:
        return posixpath.join(self.root, "shards", kind)

    def write_shard(self, kind: str, trial_id: str, table: pa.Table | list[dict]) -> None:
        table = to_table(kind, table)
        directory = self._shard_dir(kind)
        self.fs.create_dir(directory, recursive=True)
        final = posixpath.join(directory, f"{trial_id}.parquet")
        self._write_atomic(table, final, **SHARD_WRITE_OPTIONS)
        if kind == TRIALS and self.local and table.num_rows:
            self._index(trial_id, table)

    def _index(self, trial_id: str, table: pa.Table) -> None:
        """Note a committed trial's status in ``shards/trials.index`` (one JSON line, appended),
        with the size of each of its shards as written.

        A resume then learns every stored status from one small file and the directory
        listing instead of parsing thousands of Parquet footers. The index is a cache the
        listing is checked against, never believed over it: a line whose shard is gone is
        ignored, and a shard the index does not know at its listed size (a killed run never
        indexed it, or it was truncated since) is read itself (``stored_trials``).
        """
        status, reason = (table.column(c)[0].as_py() for c in ("status", "reason"))
        sizes = {}
        for kind in TABLES:
            with contextlib.suppress(OSError):  # a trial writes only the tables it has
                sizes[kind] = os.stat(posixpath.join(self._shard_dir(kind), f"{trial_id}.parquet")).st_size
        self._append_index([_Indexed(StoredTrial(trial_id, status, reason), sizes)])

    def _append_index(self, entries: Iterable[_Indexed]) -> None:
        lines = "".join(json.dumps({"trial_id": e.stored.trial_id, "status": e.stored.status,
                                    "reason": e.stored.reason, "sizes": e.sizes}) + "\n"
                        for e in entries)
        if not self.local or not lines:
            return
        os.makedirs(posixpath.join(self.root, "shards"), exist_ok=True)
        with open(posixpath.join(self.root, "shards", INDEX_FILE), "a", encoding="utf-8") as f:
            f.write(lines)

    def _write_atomic(self, table: pa.Table, final: str, **options: Any) -> None:
        with self._atomic_output(final) as out:
            pq.write_table(table, out, **options)

    @contextlib.contextmanager
    def _atomic_output(self, final: str) -> Iterator[Any]:
        """A file-like to write ``final`` through: visible whole, under its name, or not at all.

        Locally a hidden temporary file, flushed to disk (fsync) before it is renamed to
        ``final``, and the directory flushed after, so neither a crash nor a power loss can
        leave a partial file under the name. On object stores the bytes are gathered in
        memory and put in one request: a failure while writing never reaches the store.
        """
        if not self.local:
            buffer = pa.BufferOutputStream()
            yield buffer
            with self.fs.open_output_stream(final) as out:
                out.write(buffer.getvalue())
            return
        directory, name = posixpath.split(final)
        tmp = posixpath.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())  # the bytes are on disk before the name is
            os.replace(tmp, final)  # rename(2): atomic on one filesystem
            _fsync_dir(directory)  # ... and the rename itself survives a power loss
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    # -- reading ---------------------------------------------------------------
    def _shard_infos(self, kind: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self._shard_dir(kind), allow_not_found=True)
        for attempt in range(5):
            try:
                infos = self.fs.get_file_info(selector)
                break
            except FileNotFoundError:
                # A writer renamed its temporary file between the listing and the
                # stat of that entry: list again (the directory itself exists).
                if attempt == 4:
                    raise
        return [info for info in infos
                if info.is_file and info.base_name.endswith(".parquet") and not info.base_name.startswith(".")]

    def shard_paths(self, kind: str) -> list[str]:
        return sorted(info.path for info in self._shard_infos(kind))

    def shard_sizes(self, kind: str) -> dict[str, int]:
        """Each shard of ``kind`` by trial id: its size in bytes, as listed (no file is opened)."""
        if not self.local:
            return {_stem(info.path): int(info.size or 0) for info in self._shard_infos(kind)}
        sizes = {}
        with contextlib.suppress(FileNotFoundError), os.scandir(self._shard_dir(kind)) as entries:
            for entry in entries:
                if entry.name.endswith(".parquet") and not entry.name.startswith("."):
                    with contextlib.suppress(FileNotFoundError):  # renamed away since the listing
                        st = entry.stat()
                        if stat.S_ISREG(st.st_mode):
                            sizes[entry.name.removesuffix(".parquet")] = st.st_size
        return sizes

    def read_shards(self, kind: str, *, trial_ids: Iterable[str] | None = None,
                    columns: list[str] | None = None) -> pa.Table:
        """Every readable shard of ``kind`` (only those of ``trial_ids``, if given), in the current schema.

        A shard that cannot be read (truncated, empty, not Parquet) is moved to
        ``quarantine/`` and reported, never read again: its trial has no result
        and runs again. Shards of other kinds than ``trials`` count only when their
        trial has a ``trials`` shard (the commit marker).
        """
        paths = self.shard_paths(kind)
        if trial_ids is not None:
            wanted = set(trial_ids)
            paths = [p for p in paths if _stem(p) in wanted]
        elif kind != TRIALS:
            committed = {_stem(p) for p in self.shard_paths(TRIALS)}
            paths = [p for p in paths if _stem(p) in committed]
        schema = arrow_schema(kind)
        empty = schema.empty_table() if columns is None else schema.empty_table().select(columns)
        # A batch of files at a time: a dataset over thousands of small files costs far
        # more memory than the rows it holds.
        tables = [self._read_batch(kind, paths[i:i + BATCH_FILES], schema, columns)
                  for i in range(0, len(paths), BATCH_FILES)]
        tables = [t for t in tables if t is not None]
        return pa.concat_tables(tables).combine_chunks() if tables else empty

    def _read_batch(self, kind: str, paths: list[str], schema: pa.Schema,
                    columns: list[str] | None) -> pa.Table | None:
        # The current schema is imposed, so shards written before a column was
        # added read back with nulls in it.
        try:
            return ds.dataset(paths, schema=schema, format="parquet", filesystem=self.fs).to_table(columns=columns)
        except (pa.ArrowInvalid, OSError):
            pass  # one bad file fails the whole read: find it, move it aside, read the rest
        good = [p for p in paths if self._readable(kind, p)]
        if not good:
            return None
        return ds.dataset(good, schema=schema, format="parquet", filesystem=self.fs).to_table(columns=columns)

    def _readable(self, kind: str, path: str) -> bool:
        try:
            with self.fs.open_input_file(path) as f:
                pq.ParquetFile(f).read()
            return True
        except (pa.ArrowInvalid, OSError) as exc:
            self.quarantine(kind, path, _first_line(exc))
            return False

    def quarantine(self, kind: str, path: str, why: str) -> None:
        """Move an unreadable shard aside (never delete it) and say so in one line.

        A shard of another table than ``trials`` takes its trial's ``trials`` shard (the
        commit marker) aside with it: that trial's result is incomplete, so it has none
        and runs again, its readable row kept beside the damaged shard.
        """
        target = self._move_aside(kind, path)
        marker = posixpath.join(self._shard_dir(TRIALS), posixpath.basename(path))
        if kind != TRIALS and self.fs.get_file_info(marker).type == pafs.FileType.File:
            self._move_aside(TRIALS, marker)
        self.on_quarantine(f"moved aside unreadable {kind} shard {posixpath.basename(path)} ({why}) "
                           f"to {target}; its trial will run again")

    def _move_aside(self, kind: str, path: str) -> str:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        directory = posixpath.join(self.root, "quarantine", kind)
        self.fs.create_dir(directory, recursive=True)
        target = posixpath.join(directory, f"{posixpath.basename(path)}.{stamp}")
        self.fs.move(path, target)
        return target

    def _footer_ok(self, kind: str, path: str) -> bool:
        """Whether a shard's Parquet footer reads (a truncated or emptied file's does not);
        if not, the shard is moved aside."""
        try:
            with self.fs.open_input_file(path) as f:
                pq.read_metadata(f)
            return True
        except (pa.ArrowInvalid, OSError) as exc:
            self.quarantine(kind, path, _first_line(exc))
            return False

    def stored_trials(self) -> dict[str, StoredTrial]:
        """Each stored trial's status and reason: all a resume needs. Damaged shards are
        moved aside first, so their trials count as not stored and run again.

        The shard listing is the authority, and the index a cache checked against it:
        a trial is taken from the index only where its ``trials`` shard is listed at the
        size the index recorded; otherwise its shard is read (an unreadable one is moved
        aside) and indexed. A shard of another table the index recorded that is gone or
        has another size is checked (a footer read); an unreadable one is moved aside
        with its trial's ``trials`` shard. Listing costs one stat per file, not a read.
        """
        sizes = {kind: self.shard_sizes(kind) for kind in TABLES} if self.local else \
            {TRIALS: self.shard_sizes(TRIALS)}
        entries, fresh = self._verified_entries(sizes)
        if not self.local:
            return {k: e.stored for k, e in entries.items()}
        return {trial_id: entry.stored for trial_id, entry in entries.items()
                if not self._damaged_tables(trial_id, entry, sizes, trial_id in fresh)}

    def _verified_entries(self, sizes: dict[str, dict[str, int]]) -> tuple[dict[str, _Indexed], set[str]]:
        """The index's entries whose ``trials`` shard is listed at the size they recorded, and
        every other listed shard read (an unreadable one moved aside) and indexed; with the
        ids of those read now."""
        listed = sizes[TRIALS]
        entries = {k: e for k, e in self._read_index().items() if k in listed and e.sizes.get(TRIALS) == listed[k]}
        unverified = set(listed) - set(entries)
        fresh: set[str] = set()
        if unverified:
            table = self.read_shards(TRIALS, trial_ids=unverified, columns=["trial_id", "status", "reason"])
            ids, statuses, reasons = (table.column(c).to_pylist() for c in ("trial_id", "status", "reason"))
            for i, s, r in zip(ids, statuses, reasons, strict=True):
                # Sizes as listed, before any check: a shard found damaged below stays
                # recorded, so the next resume still knows its trial lacks it.
                entries[i] = _Indexed(StoredTrial(i, s, r), {k: v[i] for k, v in sizes.items() if i in v})
                fresh.add(i)
            self._append_index(entries[i] for i in sorted(fresh))  # read once: the next resume finds them indexed
        return entries, fresh

    def _damaged_tables(self, trial_id: str, entry: _Indexed, sizes: dict[str, dict[str, int]],
                        fresh: bool) -> list[str]:
        """The trial's shards of other tables that changed since they were indexed (or were never
        checked) and no longer read. Every table is checked, no short cut: each damaged shard
        of the trial is moved aside."""
        return [kind for kind, recorded in sorted(entry.sizes.items())
                if kind != TRIALS and kind in sizes
                and (sizes[kind].get(trial_id) != recorded or fresh)
                and not self._aux_intact(kind, trial_id, sizes[kind].get(trial_id))]

    def _aux_intact(self, kind: str, trial_id: str, listed: int | None) -> bool:
        """Whether a trial's shard of ``kind`` that has changed since it was indexed (or was never
        checked) still reads; one that does not, or is gone, takes its trial's result aside."""
        marker = posixpath.join(self._shard_dir(TRIALS), f"{trial_id}.parquet")
        if listed is None:  # recorded when the trial was committed, gone since (moved aside, deleted)
            if self.fs.get_file_info(marker).type == pafs.FileType.File:
                self._move_aside(TRIALS, marker)
                self.on_quarantine(f"trial {trial_id} lost its {kind} shard: moved its trials shard aside; "
                                   "its trial will run again")
            return False
        return self._footer_ok(kind, posixpath.join(self._shard_dir(kind), f"{trial_id}.parquet"))

    def _read_index(self) -> dict[str, _Indexed]:
        if not self.local:
            return {}
        out: dict[str, _Indexed] = {}
        try:
            with open(posixpath.join(self.root, "shards", INDEX_FILE), encoding="utf-8") as f:
                for line in f:
                    try:
                        d = json.loads(line)
                        sizes = {str(k): int(v) for k, v in (d.get("sizes") or {}).items()}
                        out[d["trial_id"]] = _Indexed(StoredTrial(d["trial_id"], d["status"], d.get("reason")),
                                                      sizes)
                    except (ValueError, KeyError, TypeError, AttributeError):
                        continue  # a line cut short by a crash: that shard is read instead
        except FileNotFoundError:
            pass
        return out

    # -- the plan ---------------------------------------------------------------
    def write_plan(self, sweep: str, trial_ids: Iterable[str], report: ReportSettings | None = None) -> None:
        """Record which trials the sweep now has (what the aggregated tables answer for) and
        how its energy is priced."""
        ids = sorted(set(trial_ids))
        report = report if report is not None else ReportSettings()
        current = self.plan_record()
        if current is not None and current.trial_ids == ids and current.report == report:
            return  # unchanged: left as it is, so the aggregates stay up to date
        record = PlanRecord(sweep=sweep, written_at=datetime.now(timezone.utc).isoformat(),
                            trial_ids=ids, report=report)
        self.fs.create_dir(self.root, recursive=True)
        with self._atomic_output(posixpath.join(self.root, PLAN_FILE)) as out:
            out.write(record.to_json())

    def plan_record(self) -> PlanRecord | None:
        path = posixpath.join(self.root, PLAN_FILE)
        try:
            with self.fs.open_input_stream(path) as f:
                return PlanRecord.parse(f.read())
        except (FileNotFoundError, OSError):
            return None

    def planned_ids(self) -> set[str] | None:
        """The trial ids of the sweep last run here, or None (no plan recorded: every result counts)."""
        record = self.plan_record()
        return set(record.trial_ids) if record is not None else None

    # -- aggregation -----------------------------------------------------------
    def aggregate(self, *, full: bool = False) -> dict[str, int]:
        """Merge the shards into ``<root>/<kind>.parquet`` (the plan's trials) and
        ``<root>/superseded/<kind>.parquet`` (every other stored trial); return row counts.

        Incrementally where it can (``full=False``): when the last aggregation answers for
        the same plan, every one of its trials still has its shard, and its files have the
        current schema, each table keeps its previous rows but those of trials written
        since (re-run or new) and adds theirs, reading only the new shards and one file
        per table. Otherwise, and with ``full``, everything is rebuilt from the shards.
        Damaged shards the index can tell (another size than written) are moved aside first.
        """
        if self.local:
            self.stored_trials()  # stats only, once indexed: no trial is aggregated short of a shard
        if not self.shard_paths(TRIALS):
            raise ResultsError(f"{self.uri}: no trial shards found (is this a sweeper output directory?)")
        stored = {_stem(p) for p in self.shard_paths(TRIALS)}
        planned = self.planned_ids()
        current = stored if planned is None else stored & planned
        superseded = stored - current
        changed = None if full else self._changed_since_aggregate(stored, current)
        counts = {}
        if changed is not None:
            for kind in TABLES:
                counts[kind] = self._aggregate_changes(kind, current, changed)
            self.superseded = len(superseded)  # the plan is unchanged: so are the superseded tables
            return counts
        for kind in TABLES:
            counts[kind] = self._aggregate(kind, current, posixpath.join(self.root, f"{kind}.parquet"))
            target = posixpath.join(self.root, "superseded", f"{kind}.parquet")
            if superseded:
                self.fs.create_dir(posixpath.join(self.root, "superseded"), recursive=True)
                self._aggregate(kind, superseded, target)
            elif self.fs.get_file_info(target).type == pafs.FileType.File:
                self.fs.delete_file(target)  # an aggregate, not a result: the shards stay
        self.superseded = len(superseded)
        return counts

    def _aggregate(self, kind: str, trial_ids: set[str], target: str) -> int:
        if kind == TRIALS:
            # One row per trial: small enough to sort whole (by start time).
            table = self.read_shards(kind, trial_ids=trial_ids)
            if table.num_rows:
                table = table.sort_by(_SORT[kind])
            self._write_atomic(table, target)
            return int(table.num_rows)
        # The per-trial tables can be large (timelines): read and written a batch of
        # shards at a time, in trial-id order, so memory stays flat in the number of trials.
        ids = sorted(trial_ids & {_stem(p) for p in self.shard_paths(kind)})
        schema = arrow_schema(kind)
        with self._atomic_output(target) as out, pq.ParquetWriter(out, schema) as writer:
            rows = self._append_shards(writer, kind, ids)
            if not rows:
                writer.write_table(schema.empty_table())
        return rows

    def _append_shards(self, writer: pq.ParquetWriter, kind: str, ids: list[str]) -> int:
        """The shards of ``ids``, a batch of files at a time, each batch sorted; rows written."""
        rows = 0
        for start in range(0, len(ids), BATCH_FILES):
            batch = self.read_shards(kind, trial_ids=ids[start:start + BATCH_FILES])
            if batch.num_rows:
                writer.write_table(batch.sort_by(_SORT[kind]))
                rows += batch.num_rows
        return rows

    def _changed_since_aggregate(self, stored: set[str], current: set[str]) -> set[str] | None:
        """The trials whose shards were written since the last aggregation, or None when the
        aggregates cannot be updated in place (none yet, another plan, a trial of theirs whose
        shard is gone, a schema that has changed since, a results store without local mtimes)."""
        if not self.local:
            return None
        targets = [posixpath.join(self.root, f"{kind}.parquet") for kind in TABLES]
        infos = self.fs.get_file_info(targets)
        if any(i.type != pafs.FileType.File or i.mtime is None for i in infos):
            return None
        since = min(i.mtime for i in infos)
        plan = self.fs.get_file_info(posixpath.join(self.root, PLAN_FILE))
        if plan.mtime is not None and plan.mtime > since:
            return None
        for kind, target in zip(TABLES, targets, strict=True):
            if pq.read_schema(target).remove_metadata() != arrow_schema(kind):
                return None
        previous = set(pq.read_table(targets[0], columns=["trial_id"]).column("trial_id").to_pylist())
        if not previous <= current:
            return None  # a trial it holds lost its shard (quarantined, moved away): rebuild
        changed: set[str] = set()
        for kind in TABLES:
            selector = pafs.FileSelector(self._shard_dir(kind), allow_not_found=True)
            changed |= {_stem(i.path) for i in self.fs.get_file_info(selector)
                        if i.is_file and i.base_name.endswith(".parquet") and not i.base_name.startswith(".")
                        and i.mtime is not None and i.mtime >= since}
        # A trial the previous aggregate lacks is new whatever its shards' times say.
        return (changed | (current - previous)) & stored

    def _aggregate_changes(self, kind: str, current: set[str], changed: set[str]) -> int:
        """``<kind>.parquet`` rewritten as its previous rows less the changed trials' plus
        theirs from their shards: one file and the new shards read, a batch at a time."""
        import pyarrow.compute as pc

        target = posixpath.join(self.root, f"{kind}.parquet")
        fresh = sorted(changed & current)
        drop = pa.array(sorted(changed), pa.string())
        schema = arrow_schema(kind)
        rows = 0
        if kind == TRIALS:  # one row per trial: sorted whole, as a full aggregation sorts it
            kept = pq.read_table(target, schema=schema)
            kept = kept.filter(pc.invert(pc.is_in(kept.column("trial_id"), value_set=drop)))
            table = pa.concat_tables([kept, self.read_shards(kind, trial_ids=fresh)]).combine_chunks()
            if table.num_rows:
                table = table.sort_by(_SORT[kind])
            self._write_atomic(table, target)
            return int(table.num_rows)
        with self._atomic_output(target) as out, pq.ParquetWriter(out, schema) as writer:
            for batch in pq.ParquetFile(target).iter_batches(batch_size=65_536):
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
        (nothing written since the last aggregation): a resume with nothing to run skips it."""
        target = self.fs.get_file_info(posixpath.join(self.root, f"{TRIALS}.parquet"))
        if target.type != pafs.FileType.File or target.mtime is None:
            return False
        newest = self.fs.get_file_info(posixpath.join(self.root, PLAN_FILE)).mtime
        for kind in TABLES:
            selector = pafs.FileSelector(self._shard_dir(kind), allow_not_found=True)
            for info in self.fs.get_file_info(selector):
                if info.mtime is not None and (newest is None or info.mtime > newest):
                    newest = info.mtime
        return newest is not None and newest <= target.mtime

    def remove_stale_temporaries(self) -> int:
        """Delete the hidden temporary files a killed run left in the shard directories.

        Safe only while this process holds the run lock: no other writer's temporary can be there.
        """
        if not self.local:
            return 0
        removed = 0
        for kind in TABLES:
            directory = self._shard_dir(kind)
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(directory):
                    if name.startswith(".") and name.endswith(".tmp"):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(os.path.join(directory, name))
                            removed += 1
        return removed

    def exists(self) -> bool:
        return self.fs.get_file_info(self.root).type != pafs.FileType.NotFound


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
            raise StorageError(f"--output {store.uri}: cannot reach it: {_first_line(exc)}") from None
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
        raise StorageError(f"--output {root}: not writable: {exc.strerror or _first_line(exc)}") from None
    import shutil

    free = shutil.disk_usage(root).free
    if free < LOW_SPACE_BYTES:
        return f"only {free / 2**20:,.0f} MiB free under {root}: a full disk stops the sweep (resume completes it)"
    return None
