"""Which trials a results directory holds, and with what status, without reading them all.

``shards/trials.index`` gets one JSON line per committed trial (its status, reason and
each of its shards' size as written). A resume learns every stored status from that
small file and the directory listing instead of parsing thousands of Parquet footers.
The index is a cache the listing is checked against, never believed over it: a line cut
short by a crash is skipped (its shard read instead), and a file that does not decode at
all is rebuilt from the shards, with a warning.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.fs as pafs

from sweeper.core.schema import TABLES
from sweeper.run.shards import TRIALS, ShardFiles

INDEX_FILE = "trials.index"


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


class TrialIndex:
    """The stored trials' statuses of one results directory (local directories keep the index;
    elsewhere every ``trials`` shard is read)."""

    def __init__(self, files: ShardFiles) -> None:
        self.files = files
        # What ``stored_trials`` found, kept up to date with each trial recorded since: the
        # index is read and the shards listed once per store. A store that writes is opened
        # under the run lock, so nothing else changes the directory while it lives; a reader
        # that wants a fresh look opens a store of its own.
        self._view: dict[str, StoredTrial] | None = None
        # The index file did not decode (``_read``): the scan replaces it with what the shards say
        # instead of appending to it, so the next resume trusts the index again.
        self._rebuild = False

    def record(self, trial_id: str, table: pa.Table) -> None:
        """Note a committed trial's status in ``shards/trials.index`` (one JSON line, appended),
        with the size of each of its shards as written.

        A resume then learns every stored status from one small file and the directory
        listing instead of parsing thousands of Parquet footers. The index is a cache the
        listing is checked against, never believed over it: a line whose shard is gone is
        ignored, and a shard the index does not know at its listed size (a killed run never
        indexed it, or it was truncated since) is read itself (``stored_trials``).
        """
        status, reason = (table.column(c)[0].as_py() for c in ("status", "reason"))
        stored = StoredTrial(trial_id, status, reason)
        if self._view is not None:
            self._view[trial_id] = stored
        if not self.files.local:
            return
        sizes = {}
        for kind in TABLES:
            with contextlib.suppress(OSError):  # a trial writes only the tables it has
                sizes[kind] = os.stat(posixpath.join(self.files.shard_dir(kind), f"{trial_id}.parquet")).st_size
        self._append([_Indexed(stored, sizes)])

    @staticmethod
    def _lines(entries: Iterable[_Indexed]) -> str:
        return "".join(json.dumps({"trial_id": e.stored.trial_id, "status": e.stored.status,
                                   "reason": e.stored.reason, "sizes": e.sizes}) + "\n"
                       for e in entries)

    def _append(self, entries: Iterable[_Indexed]) -> None:
        lines = self._lines(entries)
        if not self.files.local or not lines:
            return
        os.makedirs(posixpath.join(self.files.root, "shards"), exist_ok=True)
        with open(posixpath.join(self.files.root, "shards", INDEX_FILE), "a", encoding="utf-8") as f:
            f.write(lines)

    def _replace(self, entries: Iterable[_Indexed]) -> None:
        """The index rewritten whole from ``entries``: atomically, so a crash leaves the damaged
        one (rebuilt again next time) or the new one, never a mix. A cache, not a result: the
        shards it describes are untouched."""
        if not self.files.local:
            return
        os.makedirs(posixpath.join(self.files.root, "shards"), exist_ok=True)
        with self.files.atomic_output(posixpath.join(self.files.root, "shards", INDEX_FILE)) as out:
            out.write(self._lines(entries).encode("utf-8"))

    def stored_trials(self) -> dict[str, StoredTrial]:
        """Each stored trial's status and reason: all a resume needs. Damaged shards are
        moved aside first, so their trials count as not stored and run again.

        The shard listing is the authority, and the index a cache checked against it:
        a trial is taken from the index only where its ``trials`` shard is listed at the
        size the index recorded; otherwise its shard is read (an unreadable one is moved
        aside) and indexed. A shard of another table the index recorded that is gone or
        has another size is checked (a footer read); an unreadable one is moved aside
        with its trial's ``trials`` shard. Listing costs one stat per file, not a read.
        Done once per store; later calls answer from what it found and has recorded since.
        """
        if self._view is None:
            self._view = self._scan()
        return dict(self._view)

    def _scan(self) -> dict[str, StoredTrial]:
        sizes = {kind: self.files.shard_sizes(kind) for kind in TABLES} if self.files.local else \
            {TRIALS: self.files.shard_sizes(TRIALS)}
        entries, fresh = self._verified_entries(sizes)
        if not self.files.local:
            return {k: e.stored for k, e in entries.items()}
        return {trial_id: entry.stored for trial_id, entry in entries.items()
                if not self._damaged_tables(trial_id, entry, sizes, trial_id in fresh)}

    def _verified_entries(self, sizes: dict[str, dict[str, int]]) -> tuple[dict[str, _Indexed], set[str]]:
        """The index's entries whose ``trials`` shard is listed at the size they recorded, and
        every other listed shard read (an unreadable one moved aside) and indexed; with the
        ids of those read now."""
        listed = sizes[TRIALS]
        entries = {k: e for k, e in self._read().items() if k in listed and e.sizes.get(TRIALS) == listed[k]}
        unverified = set(listed) - set(entries)
        fresh: set[str] = set()
        if unverified:
            table = self.files.read_shards(TRIALS, trial_ids=unverified, columns=["trial_id", "status", "reason"])
            ids, statuses, reasons = (table.column(c).to_pylist() for c in ("trial_id", "status", "reason"))
            for i, s, r in zip(ids, statuses, reasons, strict=True):
                # Sizes as listed, before any check: a shard found damaged below stays
                # recorded, so the next resume still knows its trial lacks it.
                entries[i] = _Indexed(StoredTrial(i, s, r), {k: v[i] for k, v in sizes.items() if i in v})
                fresh.add(i)
            if not self._rebuild:
                self._append(entries[i] for i in sorted(fresh))  # read once: the next resume finds them indexed
        if self._rebuild:
            self._replace(entries[i] for i in sorted(entries))
            self._rebuild = False
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
        marker = posixpath.join(self.files.shard_dir(TRIALS), f"{trial_id}.parquet")
        if listed is None:  # recorded when the trial was committed, gone since (moved aside, deleted)
            if self.files.fs.get_file_info(marker).type == pafs.FileType.File:
                self.files.move_aside(TRIALS, marker)
                self.files.on_quarantine(f"trial {trial_id} lost its {kind} shard: moved its trials shard aside; "
                                   "its trial will run again")
            return False
        return self.files.footer_ok(kind, posixpath.join(self.files.shard_dir(kind), f"{trial_id}.parquet"))

    def _read(self) -> dict[str, _Indexed]:
        if not self.files.local:
            return {}
        path = posixpath.join(self.files.root, "shards", INDEX_FILE)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        try:
            # Every line is ``json.dumps``' ASCII: bytes that are not even UTF-8 were put there by
            # something else (a bad disk, a stray write), so no line of it is believed.
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.files.on_quarantine(f"{path}: undecodable bytes at offset {exc.start}, not an index this "
                                     "sweeper wrote: rebuilding it from the shards (every trials shard is read once)")
            self._rebuild = True
            return {}
        out: dict[str, _Indexed] = {}
        for line in text.splitlines():
            try:
                d = json.loads(line)
                sizes = {str(k): int(v) for k, v in (d.get("sizes") or {}).items()}
                out[d["trial_id"]] = _Indexed(StoredTrial(d["trial_id"], d["status"], d.get("reason")), sizes)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue  # a line cut short by a crash, or zero bytes after it: that shard is read instead
        return out
