"""A serving run's requests sent from one client process, or shared among several, each on its
own event loop (``run_http``: the server backend's way in; the client it runs is
``actors.backends.server.client``, which knows nothing of processes).

One process streams about 14,500 chunks a second per core with its loop saturated (65-120 µs
of CPU per chunk: reading, parsing the event, stamping), and requests leave late well before
that. A fast engine at a high rate, a tensor-parallel server or an ``inf`` rate produce more.
Here the run is dealt out to ``processes`` children, request ``i`` (in arrival order) to child
``i mod processes``, and each child runs exactly the one-process client
(``client.send_encoded``): the same stamps per chunk, the same records per request.

They start at one zero. Each child builds its session and opens its connections, then says it
is ready and waits; once all are ready the parent sends every child the same arrivals' zero, a
moment just ahead on the host's monotonic clock (``time.monotonic`` is CLOCK_MONOTONIC on Linux,
one clock for every process of the host), so that the children's stamps, the telemetry's and
the parent's are on one time line. The parent then waits for the records and merges them.

A concurrency cap is shared out as well: each child keeps its part of ``max_concurrency`` (the
cap split as evenly as it goes; never more children than the cap). A request then waits for a
slot of its own child, not the first slot free among all: with requests of equal length the
same, with mixed lengths a little more waiting than one shared queue would give, which
``due_s`` records (a request is due when its child's slot freed, and its lateness is counted
from there).

The protocol is pickles over the children's stdin and stdout (their other output goes to
stderr): job → ``("ready", pid)`` → zero → ``("done", run)`` or ``("error", traceback)``. Every
wait is bounded; the children are killed on the way out whatever happened.

    python -m actors.backends.server.fanout    (a child; started by ``run_in_processes``)
"""

from __future__ import annotations

import asyncio
import math
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from actors.backends.server.client import Endpoint, send_requests
from actors.serving.client import Follow
from actors.serving.records import ServedRun, ServingRequest, sort_by_index

# A child has this long to start Python, import the client and open its connections.
READY_TIMEOUT_S = 60.0
# The shared zero is this far ahead of the moment the parent sends it: every child has read
# it (a pipe read, well under a millisecond) before its first arrival is due.
START_LEAD_S = 0.02
# After the run's deadline, a child has this long to send its records (pickling a few
# thousand requests' chunk times takes milliseconds).
RESULT_GRACE_S = 30.0
# Chunks a second one client process is given when their number is chosen for a run: about
# half of what one saturated loop streams, so that each child stays well ahead of its schedule.
CHUNKS_PER_PROCESS_S = 7_000.0
# Chunks a second one request streams at most, for a bound on a run's rate where its arrivals
# give none (all at once): a token every 2 ms, a small model on a fast GPU.
STREAM_CHUNKS_S = 500.0


class ClientProcessError(RuntimeError):
    """A client process failed, or did not answer in time."""


@dataclass(frozen=True)
class _Job:
    """One child's share of the run."""

    wire: Any  # client.Wire
    requests: tuple[ServingRequest, ...]  # in arrival order
    bodies: tuple[bytes, ...]
    max_concurrency: int | None
    deadline_s: float


def run_http(endpoint: Endpoint, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
             deadline_s: float, clock: Callable[[], float] = time.monotonic, processes: int = 1,
             follow: Follow | None = None) -> ServedRun:
    """Send ``requests`` at their arrival offsets from when the client is ready, at most
    ``max_concurrency`` in flight (later arrivals wait, in order), until each has finished or
    ``deadline_s`` (on ``clock``) has passed. Runs its own event loop; returns when the run is
    over. With ``processes`` > 1 the requests are shared among that many client processes
    (``run_in_processes``), each with its own loop, on the host's monotonic clock.
    ``follow`` (a conversation's next turns, built from each reply as it ends) needs the one
    process that holds the conversations: with it, ``processes`` is 1."""
    if follow is not None:
        return asyncio.run(send_requests(endpoint, requests, max_concurrency=max_concurrency, deadline_s=deadline_s,
                                         clock=clock, follow=follow))
    if processes > 1:
        if clock is not time.monotonic:
            raise ValueError("several client processes stamp on the host's time.monotonic, not on a clock of one process")
        return run_in_processes(endpoint, requests, processes=processes, max_concurrency=max_concurrency,
                                deadline_s=deadline_s)
    return asyncio.run(send_requests(endpoint, requests, max_concurrency=max_concurrency, deadline_s=deadline_s,
                                     clock=clock))


def processes_for(requests: Sequence[ServingRequest], max_concurrency: int | None, *,
                  cpus: int | None = None) -> int:
    """How many client processes a run needs: one per CHUNKS_PER_PROCESS_S of the chunks it is
    expected to stream, at most half the host's cores (the rest are the server's and the
    engine's). Expected: one chunk per output token (the engines sweeper launches stream a
    chunk a token), at the arrivals' rate, and never more than the requests that can be in
    flight at once each streaming STREAM_CHUNKS_S (all of them, for requests sent at once)."""
    most = max(1, (cpus if cpus is not None else os.cpu_count() or 1) // 2)
    if not requests:
        return 1
    offsets = [r.arrival_offset_s for r in requests]
    span_s = max(offsets) - min(offsets)
    in_flight = min(len(requests), max_concurrency or len(requests))
    chunks_s = in_flight * STREAM_CHUNKS_S
    if span_s > 0:
        chunks_s = min(chunks_s, sum(r.output_len for r in requests) / span_s)
    return max(1, min(most, math.ceil(chunks_s / CHUNKS_PER_PROCESS_S)))


def run_in_processes(endpoint: Any, requests: Sequence[ServingRequest], *, processes: int,
                     max_concurrency: int | None, deadline_s: float) -> ServedRun:
    """``run_http`` with its requests shared among ``processes`` children (fewer where the
    run has fewer requests or a smaller concurrency cap). ``deadline_s`` is on time.monotonic."""
    ordered = sorted(requests, key=lambda r: (r.arrival_offset_s, r.index))
    bodies = endpoint.encode(ordered)
    jobs = _deal(endpoint.wire, ordered, bodies, processes, max_concurrency, deadline_s)
    children = [_Child.start() for _ in jobs]
    try:
        for child, job in zip(children, jobs, strict=True):
            child.send(job)
        ready_by = min(time.monotonic() + READY_TIMEOUT_S, deadline_s)
        for child in children:
            child.expect("ready", ready_by)
        t0 = time.monotonic() + START_LEAD_S
        for child in children:
            child.send(t0)
        runs: list[ServedRun] = [child.expect("done", deadline_s + RESULT_GRACE_S) for child in children]
    finally:
        for child in children:
            child.close()
    ends = [run.t_end_s for run in runs]
    return ServedRun(t_start_s=t0, t_end_s=max(ends, default=time.monotonic()),
                     requests=sort_by_index([r for run in runs for r in run.requests]), client_processes=len(jobs))


def _deal(wire: Any, ordered: Sequence[ServingRequest], bodies: Sequence[bytes], processes: int,
          max_concurrency: int | None, deadline_s: float) -> list[_Job]:
    n = max(1, min(processes, len(ordered), max_concurrency if max_concurrency is not None else processes))
    caps: list[int | None] = ([max_concurrency // n + (k < max_concurrency % n) for k in range(n)]
                              if max_concurrency is not None else [None] * n)
    return [_Job(wire, tuple(ordered[k::n]), tuple(bodies[k::n]), caps[k], deadline_s) for k in range(n)]


class _Child:
    """One client process and the pickles it sends back, read on a thread of their own so
    that every wait for them has a bound."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.messages: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.reader = threading.Thread(target=self._read, name=f"client-process-{process.pid}", daemon=True)
        self.reader.start()

    @classmethod
    def start(cls) -> _Child:
        # The child imports the client from wherever this process did (a Ray worker's sys.path
        # holds the job's working directory, which no environment variable says).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        process = subprocess.Popen([sys.executable, "-m", "actors.backends.server.fanout"], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, env=env)
        return cls(process)

    def send(self, message: Any) -> None:
        assert self.process.stdin is not None
        try:
            pickle.dump(message, self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.process.stdin.flush()
        except BrokenPipeError:
            raise ClientProcessError(f"client process {self.process.pid} exited "
                                     f"(code {self.process.poll()})") from None

    def expect(self, kind: str, by_s: float) -> Any:
        try:
            got, value = self.messages.get(timeout=max(by_s - time.monotonic(), 0.0))
        except queue.Empty:
            raise ClientProcessError(f"client process {self.process.pid} sent no {kind!r} in time") from None
        if got != kind:
            raise ClientProcessError(f"client process {self.process.pid}: {value}")
        return value

    def _read(self) -> None:
        assert self.process.stdout is not None
        try:
            while True:
                self.messages.put(pickle.load(self.process.stdout))
        except EOFError:
            self.messages.put(("exited", f"exited with code {self.process.wait()}"))
        except Exception as exc:  # noqa: BLE001 - whatever broke the channel is the child's failure
            self.messages.put(("exited", f"unreadable reply: {exc!r}"))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def _child(jobs: IO[bytes], replies: IO[bytes]) -> None:
    from actors.backends.server.client import send_encoded

    job: _Job = pickle.load(jobs)

    def reply(message: tuple[str, Any]) -> None:
        pickle.dump(message, replies, protocol=pickle.HIGHEST_PROTOCOL)
        replies.flush()

    async def start() -> float:
        reply(("ready", os.getpid()))
        return float(await asyncio.get_running_loop().run_in_executor(None, pickle.load, jobs))

    try:
        run = asyncio.run(send_encoded(job.wire, job.requests, job.bodies, max_concurrency=job.max_concurrency,
                                       deadline_s=job.deadline_s, start=start))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        reply(("error", traceback.format_exc()))
        return
    reply(("done", run))


if __name__ == "__main__":
    # stdout is the channel back: anything printed goes to stderr instead.
    channel = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _child(sys.stdin.buffer, channel)
