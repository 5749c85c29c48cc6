"""A results directory's files: per-trial shards written atomically, read back in the
current schema, and moved aside (never deleted) when they cannot be read.

Layout under the root (a local path or any pyarrow.fs URI)::

    shards/<kind>/<trial_id>.parquet     one shard per trial per table kind
    quarantine/<kind>/<name>             shards that could not be read, moved aside

A shard becomes visible only whole: locally it is written under a hidden temporary
name, flushed to disk (fsync), renamed, and its directory flushed; on object stores a
single put is atomic already.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sweeper.core.errors import UserInputError, first_line
from sweeper.core.schema import DERIVED, TABLES, arrow_schema, to_table

TRIALS = "trials"
# Shards read per batch while aggregating: memory stays flat in the number of trials.
BATCH_FILES = 256


# A shard is one trial's rows, read whole by aggregation and never filtered on its own:
# column statistics and dictionaries buy nothing there, and cost a quarter of the write of
# a 165-column trials row (the driver writes one per trial). The aggregated tables keep both.
SHARD_WRITE_OPTIONS: dict[str, Any] = {"write_statistics": False, "use_dictionary": False}


class StorageError(UserInputError):
    """The results destination cannot be used (not a directory, not writable, unknown scheme, full)."""

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


def stem(path: str) -> str:
    return posixpath.basename(path).removesuffix(".parquet")



def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ShardFiles:
    """The shard files of one results directory (``sweeper.run.storage`` says what they mean)."""

    def __init__(self, root: str, *, on_quarantine: Callable[[str], None] | None = None):
        self.uri = root
        if "://" in root:
            try:
                self.fs, self.root = pafs.FileSystem.from_uri(_single_put(root))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError, OSError) as exc:
                raise StorageError(f"--output {root}: not a usable results location: {first_line(exc)}") from None
        else:
            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(root)
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        # Told one line per shard moved aside, and per damaged index or aggregated table rebuilt from
        # the shards (the CLI prints it as a warning); default: silent.
        self.on_quarantine = on_quarantine or (lambda line: None)
        # Hidden temporary files a local listing of each kind's directory saw (shard_sizes): what
        # remove_stale_temporaries deletes without listing that directory again.
        self._temporaries: dict[str, list[str]] = {}

    def shard_dir(self, kind: str) -> str:
        return posixpath.join(self.root, "shards", kind)

    def write_shard(self, kind: str, trial_id: str, table: pa.Table | list[dict]) -> pa.Table:
        """Write one trial's rows of ``kind``; returns them as written."""
        table = to_table(kind, table)
        directory = self.shard_dir(kind)
        self.fs.create_dir(directory, recursive=True)
        final = posixpath.join(directory, f"{trial_id}.parquet")
        self.write_atomic(table, final, **SHARD_WRITE_OPTIONS)
        return table

    def write_atomic(self, table: pa.Table, final: str, **options: Any) -> None:
        with self.atomic_output(final) as out:
            pq.write_table(table, out, **options)

    @contextlib.contextmanager
    def atomic_output(self, final: str) -> Iterator[Any]:
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

    def _shard_infos(self, kind: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(self.shard_dir(kind), allow_not_found=True)
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
            return {stem(info.path): int(info.size or 0) for info in self._shard_infos(kind)}
        sizes: dict[str, int] = {}
        temporaries: list[str] = []
        self._temporaries[kind] = temporaries
        with contextlib.suppress(FileNotFoundError), os.scandir(self.shard_dir(kind)) as entries:
            for entry in entries:
                if _is_temporary(entry.name):
                    temporaries.append(entry.name)
                elif entry.name.endswith(".parquet") and not entry.name.startswith("."):
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
            paths = [p for p in paths if stem(p) in wanted]
        elif kind != TRIALS:
            committed = {stem(p) for p in self.shard_paths(TRIALS)}
            paths = [p for p in paths if stem(p) in committed]
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
        # added read back with nulls in it. Imported here: pyarrow.dataset imports pandas
        # (about 0.3 s), which a command that reads no shard does not need.
        import pyarrow.dataset as ds

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
            self.quarantine(kind, path, first_line(exc))
            return False

    def quarantine(self, kind: str, path: str, why: str) -> None:
        """Move an unreadable shard aside (never delete it) and say so in one line.

        A shard of another table than ``trials`` takes its trial's ``trials`` shard (the
        commit marker) aside with it: that trial's result is incomplete, so it has none
        and runs again, its readable row kept beside the damaged shard.
        """
        target = self.move_aside(kind, path)
        marker = posixpath.join(self.shard_dir(TRIALS), posixpath.basename(path))
        if kind != TRIALS and self.fs.get_file_info(marker).type == pafs.FileType.File:
            self.move_aside(TRIALS, marker)
        self.on_quarantine(f"moved aside unreadable {kind} shard {posixpath.basename(path)} ({why}) "
                           f"to {target}; its trial will run again")

    def move_aside(self, kind: str, path: str) -> str:
        stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
        directory = posixpath.join(self.root, "quarantine", kind)
        self.fs.create_dir(directory, recursive=True)
        target = posixpath.join(directory, f"{posixpath.basename(path)}.{stamp}")
        self.fs.move(path, target)
        return target

    def footer_ok(self, kind: str, path: str) -> bool:
        """Whether a shard's Parquet footer reads (a truncated or emptied file's does not);
        if not, the shard is moved aside."""
        try:
            with self.fs.open_input_file(path) as f:
                pq.read_metadata(f)
            return True
        except (pa.ArrowInvalid, OSError) as exc:
            self.quarantine(kind, path, first_line(exc))
            return False

    def remove_stale_temporaries(self) -> int:
        """Delete the hidden temporary files a killed run left in the shard directories.

        Safe only while this process holds the run lock: no other writer's temporary can be there.
        """
        if not self.local:
            return 0
        removed = 0
        # The derived tables' directories exist only where a search ran: a stat, not a listing, says.
        kinds = [*TABLES, *(kind for kind in DERIVED if os.path.isdir(self.shard_dir(kind)))]
        for kind in kinds:
            directory = self.shard_dir(kind)
            names = self._temporaries.pop(kind, None)
            if names is None:  # not listed yet: list it now
                names = []
                with contextlib.suppress(FileNotFoundError):
                    names = [n for n in os.listdir(directory) if _is_temporary(n)]
            for name in names:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(directory, name))
                    removed += 1
        # The trial index is rewritten through a temporary beside it, in shards/ itself.
        shards = posixpath.join(self.root, "shards")
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(shards):
                if _is_temporary(name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(shards, name))
                        removed += 1
        return removed

    def exists(self) -> bool:
        return self.fs.get_file_info(self.root).type != pafs.FileType.NotFound


def _is_temporary(name: str) -> bool:
    """A writer's hidden temporary file (``atomic_output``), renamed to its shard when whole."""
    return name.startswith(".") and name.endswith(".tmp")
