"""Result storage: atomic per-trial shards and their aggregation.

Layout under the output root (a local path or any pyarrow.fs URI)::

    shards/<kind>/<trial_id>.parquet     one shard per trial per table kind
    <kind>.parquet                       aggregated by ``aggregate``

A shard becomes visible only whole: locally it is written under a hidden
temporary name and renamed; on object stores a single put is atomic already.
A trial's ``trials`` shard is written last, so its presence means the trial's
other shards are complete.
"""

from __future__ import annotations

import contextlib
import posixpath
import uuid
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from sweeper.core.errors import ResultsError
from sweeper.core.schema import TABLES, arrow_schema, to_table

_SORT = {
    "trials": [("started_at", "ascending"), ("trial_id", "ascending")],
    "requests": [("trial_id", "ascending"), ("iteration", "ascending"), ("request_index", "ascending")],
    "timeline": [("trial_id", "ascending"), ("t_s", "ascending"), ("gpu_index", "ascending")],
    "layers": [("trial_id", "ascending"), ("phase", "descending"), ("layer_index", "ascending"),
               ("module", "ascending")],
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


class ResultStore:
    def __init__(self, root: str):
        self.uri = root
        if "://" in root:
            self.fs, self.root = pafs.FileSystem.from_uri(_single_put(root))
        else:
            import os

            self.fs, self.root = pafs.LocalFileSystem(), os.path.abspath(root)
        self._atomic_rename = isinstance(self.fs, pafs.LocalFileSystem)

    # -- writing ---------------------------------------------------------------
    def _shard_dir(self, kind: str) -> str:
        return posixpath.join(self.root, "shards", kind)

    def write_shard(self, kind: str, trial_id: str, table: pa.Table | list[dict]) -> None:
        table = to_table(kind, table)
        directory = self._shard_dir(kind)
        self.fs.create_dir(directory, recursive=True)
        final = posixpath.join(directory, f"{trial_id}.parquet")
        self._write_atomic(table, final)

    def _write_atomic(self, table: pa.Table, final: str) -> None:
        if not self._atomic_rename:
            # Serialized in memory first, then one write and close: a failure while
            # encoding never reaches the store, and the object appears whole or not at all.
            sink = pa.BufferOutputStream()
            pq.write_table(table, sink)
            with self.fs.open_output_stream(final) as out:
                out.write(sink.getvalue())
            return
        directory, name = posixpath.split(final)
        tmp = posixpath.join(directory, f".{name}.{uuid.uuid4().hex}.tmp")
        try:
            pq.write_table(table, tmp, filesystem=self.fs)
            self.fs.move(tmp, final)  # rename(2): atomic on one filesystem
        except BaseException:
            with contextlib.suppress(OSError):
                self.fs.delete_file(tmp)
            raise

    # -- reading ---------------------------------------------------------------
    def shard_paths(self, kind: str) -> list[str]:
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
        return sorted(
            info.path for info in infos
            if info.is_file and info.base_name.endswith(".parquet")
            and not info.base_name.startswith(".")
        )

    def read_shards(self, kind: str) -> pa.Table:
        paths = self.shard_paths(kind)
        schema = arrow_schema(kind)
        if not paths:
            return schema.empty_table()
        # The current schema is imposed, so shards written before a column was
        # added read back with nulls in it.
        dataset = ds.dataset(paths, schema=schema, format="parquet", filesystem=self.fs)
        return dataset.to_table()

    def stored_trials(self) -> dict[str, StoredTrial]:
        table = self.read_shards("trials").select(["trial_id", "status"])
        return {r["trial_id"]: StoredTrial(r["trial_id"], r["status"]) for r in table.to_pylist()}

    # -- aggregation -----------------------------------------------------------
    def aggregate(self) -> dict[str, int]:
        """Merge every kind's shards into ``<root>/<kind>.parquet``; return row counts."""
        if not self.shard_paths("trials"):
            raise ResultsError(f"{self.uri}: no trial shards found (is this a sweeper output directory?)")
        counts = {}
        for kind in TABLES:
            table = self.read_shards(kind)
            if table.num_rows:
                table = table.sort_by(_SORT[kind])
            self._write_atomic(table, posixpath.join(self.root, f"{kind}.parquet"))
            counts[kind] = table.num_rows
        return counts

    def exists(self) -> bool:
        return self.fs.get_file_info(self.root).type != pafs.FileType.NotFound
