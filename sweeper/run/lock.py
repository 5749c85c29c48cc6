"""One ``sweeper run`` per results directory.

Two runs into one directory would measure the same trials twice at once (on the
same GPUs) and race to write the same shards. The first run creates
``<dir>/.sweeper.lock`` (atomically: ``O_CREAT | O_EXCL``) naming its host and
process; a second run, on this host or another that sees the directory,
refuses with one line naming the holder.

A lock left by a killed run is stale and taken over: on the same host when its
process no longer exists, on any host when its holder has not refreshed it for
``STALE_AFTER_S`` (a live run touches it every ``HEARTBEAT_S``).
Object stores have no exclusive create: there the lock is advisory (written,
then read back), which still catches the common case of a second run started
later.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import socket
import threading
import time
from datetime import datetime, timezone
from typing import Any

import pyarrow.fs as pafs

from sweeper.run.storage import ResultStore, StorageError

LOCK_FILE = ".sweeper.lock"
HEARTBEAT_S = 15.0
STALE_AFTER_S = 120.0


class DirectoryInUse(StorageError):
    """Another live ``sweeper run`` holds the results directory."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


class RunLock:
    """Taken by ``acquire`` (or a ``with`` block), given back by ``release``; see the module docstring."""

    def __init__(self, store: ResultStore):
        self.store = store
        self.path = posixpath.join(store.root, LOCK_FILE)
        self.me = {"host": socket.gethostname(), "pid": os.getpid(),
                   "started_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None
        self.took_over: dict[str, Any] | None = None  # the stale holder replaced, if any

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        if not self.store.local:
            self._acquire_advisory()
            return
        os.makedirs(self.store.root, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder is None:
                    continue  # gone since: try again
                if not self._stale(holder):
                    raise DirectoryInUse(self._refusal(holder)) from None
                self.took_over = holder
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(self.me, f)
            self._beat = threading.Thread(target=self._heartbeat, name="sweeper-lock", daemon=True)
            self._beat.start()
            return
        raise DirectoryInUse(f"{self.store.uri}: could not take {LOCK_FILE}: another run keeps taking it")

    def _acquire_advisory(self) -> None:
        info = self.store.fs.get_file_info(self.path)
        if info.type == pafs.FileType.File:
            holder = self._holder()
            if holder is not None and not self._stale(holder):
                raise DirectoryInUse(self._refusal(holder))
        with self.store.fs.open_output_stream(self.path) as out:
            out.write(json.dumps({**self.me, "heartbeat_unix_s": time.time()}).encode())

    def _holder(self) -> dict[str, Any] | None:
        """The lock's holder as it wrote itself, with the lock's age; None if the lock is gone.
        A lock that does not read as a holder (caught between its creation and its first write,
        or damaged) is a holder of no known name: judged by its age alone, never taken over
        while fresh (its run may be starting this instant)."""
        try:
            age_s = time.time() - self._mtime_s()
            with self.store.fs.open_input_stream(self.path) as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError:
            data = b""  # there, but unreadable to us (its permissions): judged by its age
        try:
            holder = json.loads(data)
        except ValueError:
            holder = None
        if not isinstance(holder, dict) or not isinstance(holder.get("host"), str):
            holder = {"unreadable": True}
        holder["age_s"] = age_s
        return holder

    def _mtime_s(self) -> float:
        if self.store.local:
            return os.stat(self.path).st_mtime
        info = self.store.fs.get_file_info(self.path)
        return info.mtime.timestamp() if info.mtime is not None else time.time()

    def _stale(self, holder: dict[str, Any]) -> bool:
        if holder.get("host") == self.me["host"] and isinstance(holder.get("pid"), int):
            return not _pid_alive(holder["pid"])
        return float(holder.get("age_s", 0.0)) > STALE_AFTER_S

    def took_over_text(self) -> str | None:
        """What the run says of the stale lock it replaced (None: there was none)."""
        held = self.took_over
        if held is None:
            return None
        if held.get("unreadable"):
            return (f"took over a stale lock of {self.store.uri} (unreadable, untouched for "
                    f"{held['age_s']:.0f} s)")
        return f"took over a stale lock of {self.store.uri} (pid {held.get('pid')} on {held.get('host')} is gone)"

    def _refusal(self, holder: dict[str, Any]) -> str:
        if holder.get("unreadable"):
            return (f"{self.store.uri} may be in use by another sweeper run: its lock {self.path} does not say "
                    f"whose it is and was written {holder['age_s']:.0f} s ago (a run starting, or a damaged lock, "
                    f"taken over once {STALE_AFTER_S:.0f} s old); remove it if no run is using the directory")
        return (f"{self.store.uri} is in use by another sweeper run (pid {holder.get('pid')} on "
                f"{holder.get('host')}, since {holder.get('started_at')}); wait for it to finish, or "
                f"remove {self.path} if that run is gone")

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=1.0)
        with contextlib.suppress(OSError):
            holder = self._holder()
            if holder is None or holder.get("pid") == self.me["pid"] and holder.get("host") == self.me["host"]:
                self.store.fs.delete_file(self.path)
