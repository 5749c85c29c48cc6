"""A launched server: a process group of its own, its output in a log file, ready when it
answers, stopped with its whole group, and never outliving the process that launched it.

The server leads a new session (so its group holds every process it forks: vLLM's engine
cores, SGLang's schedulers, their compile workers). ``stop`` sends the group SIGTERM,
then SIGKILL after a bound. A watchdog (``reaper.py``), in a session of its own, does the
same if the launcher dies first: Ray killing the actor, the driver's Ctrl-C or SIGTERM
ending the job, a raylet lost with its node all end the launcher, and then the server.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from actors.backends.server.reaper import stop_group
from sweeper.core.secrets import redact, redact_argv
from sweeper.core.servers import fill_placeholders

log = logging.getLogger(__name__)

# Lines of the server's log a failure message quotes.
TAIL_LINES = 5
# How often readiness is polled, and how long one poll may take.
READY_POLL_S = 0.25
READY_REQUEST_TIMEOUT_S = 5.0
# A server that answers its model list with an HTTP error this long is not starting: it is
# broken (transformers serve without a Hub cache directory answers 500 forever), and the
# group fails now with the server's answer instead of at measure.load_timeout_s. Long enough
# for a server that answers 503 while it warms up.
READY_ERROR_GRACE_S = 60.0


class ServerError(RuntimeError):
    """The server did not start, or did not answer as a server should."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port no one listens on, kept from anyone who asks the kernel for a port for a minute.

    A port only found free goes back to the kernel's pool when it is closed, and the next
    process to bind port 0 (another launch, a Ray worker) may be handed it before the server,
    a second or more later, binds it by number. Two servers then race for one port: the
    loser exits, and its launcher takes the winner's answers for its own server's (a CI run
    measured 12 refused requests against a port whose server had gone). So the port is
    connected to once and the accepted end closed first: that end stays in TIME_WAIT (60 s
    on Linux), and the kernel hands the port to no bind of port 0 meanwhile, while a server
    that binds it by number with SO_REUSEADDR (asyncio's and uvicorn's servers, aiohttp,
    gRPC, tokio: each sets it) gets it at once.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen(1)
        port = int(listener.getsockname()[1])
        with socket.create_connection((host, port), timeout=5.0):
            accepted, _ = listener.accept()
            accepted.close()  # before the client's end: this is the one left in TIME_WAIT
    return port


def listening_pids(port: int) -> set[int] | None:
    """The processes listening on TCP ``port``, or None where the system does not say whose
    sockets are whose (psutil needs more rights there: macOS without root)."""
    import psutil  # only once a server answers; not needed to import this module

    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    pids = {c.pid for c in connections
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid is not None}
    return pids or None


def process_group(pid: int) -> int | None:
    """The process group of ``pid``; None once it is gone."""
    try:
        return os.getpgid(pid)
    except OSError:  # gone meanwhile
        return None


def port_listeners(port: int, group: int) -> tuple[set[int], set[int]] | None:
    """The processes listening on ``port``: those of process group ``group`` and those of any
    other (a process gone since is in neither); None where the system does not say."""
    pids = listening_pids(port)
    if pids is None:
        return None
    groups = {pid: process_group(pid) for pid in pids}
    return ({pid for pid, g in groups.items() if g == group},
            {pid for pid, g in groups.items() if g not in (group, None)})


def _command_of(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())[:200] or "?"
    except psutil.Error:
        return "?"


def resolve_program(argv: Sequence[str]) -> list[str]:
    """``python`` is this interpreter; a console script (``vllm``, ``transformers``) is the one
    installed beside it, so that the server runs in the actor's own environment."""
    first, rest = argv[0], list(argv[1:])
    if first == "python":
        return [sys.executable, *rest]
    beside = Path(sys.executable).parent / first
    if beside.is_file():
        return [str(beside), *rest]
    return [shutil.which(first) or first, *rest]


# A line that states an error: an exception's last line (``ValueError: ...``), argparse's
# ``prog: error: ...``, a logger's ``ERROR`` record.
_ERROR_LINE = re.compile(r"\b[A-Z]\w*(Error|Exception)\b|\berror\b|\bERROR\b|\bfatal\b", re.IGNORECASE)


def log_tail(path: Path, lines: int = TAIL_LINES) -> str:
    """What a failed server's log says, in one line of the run's output: its last non-empty
    lines, joined with `` | ``, led by its last error line where that came before them (a
    server that prints its help after the error, as ``vllm serve`` does for a bad value,
    would otherwise be quoted by its help text)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - 16_384, 0))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    # The header sweeper wrote (the command line, the pid) is not the server's own word.
    kept = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("$ ", "# pid "))]
    tail = kept[-lines:]
    errors = [ln for ln in kept[:len(kept) - len(tail)] if _ERROR_LINE.search(ln)]
    return " | ".join(([errors[-1], "..."] if errors and not any(_ERROR_LINE.search(ln) for ln in tail) else []) + tail)


def get_json(url: str, timeout_s: float = READY_REQUEST_TIMEOUT_S,
             headers: Mapping[str, str] | None = None) -> object:
    """GET ``url`` (with ``headers``: a server's key) and parse its JSON answer; raises
    ``OSError`` or ``ValueError``."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - an http(s) URL we built
        return json.loads(response.read().decode())


def get_text(url: str, timeout_s: float = READY_REQUEST_TIMEOUT_S, headers: Mapping[str, str] | None = None) -> str:
    """GET ``url`` (with ``headers``) as text; raises ``OSError``."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310 - an http(s) URL we built
        return response.read().decode(errors="replace")


def _copy_redacted(source: IO[bytes], log_path: Path, secrets: Sequence[str]) -> None:
    """Append the server's output to its log line by line, each secret replaced: a server may
    print its own arguments (vLLM logs its non-default ones, its key among them)."""
    with source, open(log_path, "ab") as out:
        for line in source:
            out.write(redact(line.decode(errors="replace"), secrets).encode())
            out.flush()


@dataclass
class ServerProcess:
    """One launched server: its command line, its process (group leader), its log."""

    argv: list[str]  # as started, every secret redacted (what is recorded and printed)
    base_url: str  # http://host:port/v1
    port: int
    log_path: Path
    popen: subprocess.Popen
    started_s: float  # monotonic time of the launch
    ready_s: float | None = None  # seconds from the launch until it first answered
    headers: Mapping[str, str] = field(default_factory=dict)  # sent with every request sweeper makes

    @classmethod
    def launch(cls, argv: Sequence[str], *, log_path: Path, host: str = "127.0.0.1",
               env: Mapping[str, str] | None = None, stop_timeout_s: float = 30.0,
               fields: Mapping[str, str] | None = None, secrets: Sequence[str] = (),
               headers: Mapping[str, str] | None = None) -> ServerProcess:
        """Start ``argv`` (its placeholders ``{port}``, ``{host}`` and ``fields`` filled in; a
        ``Verbatim`` word, a value, as given) on a free port, bound to ``host`` (loopback unless
        told otherwise). ``secrets`` (its key, secret flags' values) never reach its log or its
        recorded command line."""
        port = free_port(host)
        values = {**(fields or {}), "port": str(port), "host": host}
        try:
            filled = fill_placeholders(argv, values)
        except ValueError as exc:
            raise ServerError(str(exc)) from None
        command = resolve_program(filled)
        shown = [redact(word, secrets) for word in redact_argv(command)]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # The watchdog first, so that no server ever runs unwatched (reaper.py says why); it
        # detaches, and this goes on once it runs on its own, waiting for the server's pid.
        watchdog = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("reaper.py")), str(os.getpid()), str(stop_timeout_s)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        assert watchdog.stdin is not None
        with watchdog.stdin as to_watchdog:  # closed on the way out: a watchdog told no pid exits
            try:
                code = watchdog.wait(timeout=30)
            except subprocess.TimeoutExpired:
                watchdog.kill()
                watchdog.wait()
                raise ServerError("the server's watchdog did not start within 30 s") from None
            if code != 0:
                raise ServerError(f"the server's watchdog could not start (exit code {code})")
            popen = cls._start(command, log_path, env, shown, secrets)
            try:
                to_watchdog.write(f"{popen.pid}\n".encode())
                to_watchdog.flush()
            except BrokenPipeError:  # the watchdog is gone: a server must not run unwatched
                stop_group(popen.pid, 1.0)
                popen.wait()
                raise ServerError("the server's watchdog exited before the server started") from None
        log.info("server pid %d on %s:%d, log %s", popen.pid, host, port, log_path)
        return cls(argv=shown, base_url=f"http://{host}:{port}/v1", port=port, log_path=log_path, popen=popen,
                   started_s=time.monotonic(), headers=dict(headers or {}))

    @staticmethod
    def _start(command: list[str], log_path: Path, env: Mapping[str, str] | None, shown: list[str],
               secrets: Sequence[str]) -> subprocess.Popen:
        """The server's process, leading a session of its own, its output going to ``log_path``."""
        with open(log_path, "ab") as out:
            out.write(f"$ {' '.join(shown)}\n".encode())
            out.flush()
            # With secrets, the output goes through this process on its way to the log.
            popen = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE if secrets else out, stderr=subprocess.STDOUT,
                                     env=dict(env) if env is not None else None, start_new_session=True)
            # Appended before the server's first line (the file is opened for appending by both).
            out.write(f"# pid {popen.pid} (its process group: every process it starts)\n".encode())
        if secrets:
            assert popen.stdout is not None
            threading.Thread(target=_copy_redacted, args=(popen.stdout, log_path, tuple(secrets)),
                             name=f"server-log-{popen.pid}", daemon=True).start()
        return popen

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_ready(self, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                   error_grace_s: float = READY_ERROR_GRACE_S) -> float:
        """Block until ``GET /v1/models`` answers 200; returns the seconds since launch.

        Raises ``ServerError`` with the log's last lines if the server exits first, if it
        answers with an HTTP error for ``error_grace_s`` on end, or if ``timeout_s`` passes
        (the server is then stopped). Refused connections are a server still starting.
        """
        deadline = self.started_s + timeout_s
        erring_since: float | None = None
        while True:
            code = self.popen.poll()
            if code is not None:
                raise ServerError(f"the server exited with code {code} before it was ready "
                                  f"(log {self.log_path}): {log_tail(self.log_path)}")
            try:
                get_json(self.base_url + "/models", timeout_s=min(READY_REQUEST_TIMEOUT_S, max(deadline - clock(), 0.1)),
                         headers=self.headers)
            except urllib.error.HTTPError as exc:
                erring_since = clock() if erring_since is None else erring_since
                if clock() - erring_since >= error_grace_s:
                    self.stop(timeout_s=5.0)
                    raise ServerError(
                        f"the server answered GET {self.base_url}/models with HTTP {exc.code} for "
                        f"{error_grace_s:g} s (log {self.log_path}): {log_tail(self.log_path)}") from None
            except (OSError, ValueError):
                erring_since = None
            else:
                self._check_answered_by_itself()
                self.ready_s = clock() - self.started_s
                return self.ready_s
            if clock() >= deadline:
                self.stop(timeout_s=5.0)
                raise ServerError(f"the server did not answer {self.base_url}/models within {timeout_s:g} s "
                                  f"(measure.load_timeout_s; log {self.log_path}): {log_tail(self.log_path)}")
            time.sleep(READY_POLL_S)

    def _check_answered_by_itself(self) -> None:
        """Raise ``ServerError`` if a process outside the server's group listens on its port.

        One that bound it by number before the server did would otherwise be measured in the
        server's name; one that shares it (vLLM binds with SO_REUSEPORT, and so may another
        vLLM) would take some of the requests. The server's own processes are its group's (it
        leads one, ``_start``), wherever they were forked."""
        listeners = port_listeners(self.port, self.popen.pid)
        if listeners is None or not listeners[1]:
            return  # only its own, or the system does not say whose socket it is: taken as the server's
        others = listeners[1]
        other = min(others)
        self.stop(timeout_s=5.0)
        raise ServerError(f"port {self.port} is held by another process (pid {other}: {_command_of(other)}), "
                          f"not by the server launched (pid {self.popen.pid}), so its answers are not the "
                          f"server's (log {self.log_path}): {log_tail(self.log_path)}")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM to the server's whole group, SIGKILL after ``timeout_s``; returns its exit code."""
        stop_group(self.popen.pid, timeout_s)
        code = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self.popen.wait(timeout=5.0)
        # The watchdog sees the leader gone, clears what is left of the group and exits.
        return code
