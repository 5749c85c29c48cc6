"""The HTTP client held against a server whose timing is known (``tests/truth_server.py``).

The server sends each reply's first chunk a set delay after the request arrived and then one
chunk every set interval, and logs every arrival and send on the clock the client stamps
with. At light load the client's TTFT and ITL must be the server's, request by request; a
client made to lag (its event loop blocked for a set time, or a send path too slow for the
rate) must be flagged ``client_behind``, never reported as the server's latency; and the
client must be ready before its clock starts (its connections open, so none is opened on
the send path).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from actors.backends.server.backend import ServerBackend
from actors.backends.server.client import Endpoint, send_requests
from actors.backends.server.fanout import run_http
from actors.backends.server.process import ServerProcess
from actors.serving.records import ServingRequest
from sweeper.core.schema import to_table
from sweeper.core.servers import DIALECTS
from tests.truth_server import TRUTH_SERVER, ServerSends, read_send_log

READY_S = 30.0
FIRST_CHUNK_S = 0.02
CHUNK_S = 0.01
# What the client is held to at light load: its median offset from the server's own timing.
TTFT_TOLERANCE_S = 1.5e-3
ITL_TOLERANCE_S = 0.5e-3
# Runs of the light-load check: the first in which every request agrees decides (docstring).
MAX_ATTEMPTS = 3


@contextlib.contextmanager
def truth_server(tmp: Path, workers: int = 1) -> Iterator[tuple[ServerProcess, Path]]:
    """The truth server with ``workers`` processes on one port, and its send log."""
    log = tmp / "sends.jsonl"
    server = ServerProcess.launch(["python", str(TRUTH_SERVER), "--port", "{port}", "--model", "truth",
                                   "--first-chunk-s", str(FIRST_CHUNK_S), "--chunk-s", str(CHUNK_S),
                                   "--send-log", str(log), "--workers", str(workers)],
                                  log_path=tmp / "server.log", stop_timeout_s=2.0)
    try:
        server.wait_ready(READY_S)
        yield server, log
    finally:
        server.stop(2.0)


@pytest.fixture(scope="module")
def truth(tmp_path_factory) -> Any:
    with truth_server(tmp_path_factory.mktemp("truth")) as served:
        yield served


def endpoint(server: ServerProcess) -> Endpoint:
    dialect = DIALECTS["vllm"]

    def body(r: ServingRequest) -> dict:
        return {"model": "truth", "stream": True, "stream_options": dialect.stream_options(),
                "prompt": [int(t) for t in r.prompt_ids],
                **dialect.length_fields(r.output_len, exact=True, eos_token_id=None)}

    return Endpoint(url=f"{server.base_url}/completions", body=body, continuous_usage=dialect.continuous_usage,
                    warm_url=f"{server.base_url}/models")


def requests(tag: int, n: int, gap_s: float, output_len: int = 8) -> list[ServingRequest]:
    # Each prompt starts with its own token, which is how the server's log names it.
    return [ServingRequest(i, np.array([tag + i, 11, 12, 13]), output_len, 0.05 + i * gap_s) for i in range(n)]


def server_sends(log: Path, tag: int, n: int) -> list[ServerSends]:
    by_first = {s.prompt[0]: s for s in read_send_log(log) if isinstance(s.prompt, tuple)}
    return [by_first[tag + i] for i in range(n)]


def _disagreements(run: Any, sends: list[ServerSends]) -> list[str]:
    """The run's TTFT and ITL (each request's mean gap) against the server's own, outside the bounds.

    A delay of the client's own is in every request, so the median offset is held to the bounds;
    a single request is held only to ten times them (a lost chunk or a stall still fails), since
    on a busy 2-core host the scheduler now and then wakes the client milliseconds late for one
    chunk, which says nothing about the client.
    """
    offsets = [(r, s, r.ttft_s - s.ttft_s, float(np.mean(r.itl_s) - np.mean(s.itl_s)))
               for r, s in zip(run.requests, sends, strict=True)]
    out = []
    ttft_median = float(np.median([t for _, _, t, _ in offsets]))
    itl_median = float(np.median([i for _, _, _, i in offsets]))
    if abs(ttft_median) > TTFT_TOLERANCE_S or abs(itl_median) > ITL_TOLERANCE_S:
        out.append(f"median offsets: TTFT {1e3 * ttft_median:.3f} ms, ITL {1e3 * itl_median:.3f} ms")
    for r, s, ttft_off, itl_off in offsets:
        if abs(ttft_off) > 10 * TTFT_TOLERANCE_S or abs(itl_off) > 10 * ITL_TOLERANCE_S:
            out.append(f"request {r.index}: TTFT {1e3 * r.ttft_s:.3f} ms against the server's {1e3 * s.ttft_s:.3f}, "
                       f"ITL {1e3 * np.mean(r.itl_s):.3f} ms against {1e3 * np.mean(s.itl_s):.3f}")
    return out


def test_at_light_load_the_client_reads_the_servers_own_ttft_and_itl_request_by_request(truth):
    """What remains between the two is the loopback and the client process's wake-up as a chunk
    arrives: 0.35 ms at the median on the 2-core development VM, of which the client's own
    code, from the socket's callback to its stamp, took 6 us. The VM's scheduler delays a
    wake-up by over a millisecond now and then (about one request in 50 there missed the TTFT
    bound so, the client's code again taking microseconds of it), so a run in which a request
    misses is run again, up to MAX_ATTEMPTS runs in all: a client that adds a delay of its own
    misses on every run."""
    server, log = truth
    ep = endpoint(server)
    run_http(ep, requests(1_000, 2, gap_s=0.1), max_concurrency=None, deadline_s=time.monotonic() + 30)  # warm-up
    missed: list[str] = []
    for attempt in range(MAX_ATTEMPTS):
        tag = 2_000 + 100 * attempt
        run = run_http(ep, requests(tag, 4, gap_s=0.2, output_len=16), max_concurrency=None,
                       deadline_s=time.monotonic() + 30)
        sends = server_sends(log, tag, 4)
        for r, s in zip(run.requests, sends, strict=True):
            assert r.ok and r.output_tokens == 16, r.error
            assert len(r.itl_s) == len(s.itl_s) == 15
            assert r.send_lateness_s is not None and r.send_lateness_s >= 0
            # Ready before the clock started: no request waited for a connection to open.
            assert s.connection_opened_s < run.t_start_s
        missed = _disagreements(run, sends)
        if not missed:
            break
    assert not missed, f"every one of {MAX_ATTEMPTS} runs missed; the last: " + "; ".join(missed)


class _LaggingServer(ServerBackend):
    """The real server backend, its measured run made to lag on purpose: ``lag`` is started
    beside the client on its own event loop (the warm-up bursts run untouched)."""

    lag: Any = None
    measured = 40  # the trial's num_prompts: which serve() is the measured run

    def serve(self, requests, *, max_concurrency, deadline_s, follow=None):
        if len(requests) != self.measured:
            return super().serve(requests, max_concurrency=max_concurrency, deadline_s=deadline_s, follow=follow)

        async def lagging():
            return await type(self).lag(self.endpoint(), requests, max_concurrency, deadline_s)

        return asyncio.run(lagging())


def _trial_row(server: ServerProcess, tmp_path: Path, monkeypatch, lag, rate: float) -> tuple[dict, list[dict]]:
    """One serving trial through the actor's runner against the truth server, its client lagging
    as ``lag`` makes it; its requests written to and read back from Parquet."""
    from actors.actor import TrialRunner
    from sweeper.plan.expand import make_plan
    from sweeper.plan.spec import parse_sweep

    monkeypatch.setattr(_LaggingServer, "lag", staticmethod(lag))
    monkeypatch.setattr("actors.actor.create_backend", lambda name: _LaggingServer())
    trial = make_plan(parse_sweep({
        "name": "lag", "models": ["tiny-llama"], "backends": "server", "precisions": "bf16",
        "backend_options": {"server": {"base_url": server.base_url, "model": "truth", "dialect": "vllm"}},
        "workload": {"mode": "serving", "input_len": 8, "output_len": 4, "request_rate": rate,
                     "arrival": "constant", "num_prompts": _LaggingServer.measured},
        "measure": {"warmup_iters": 1, "idle_s": 0, "min_window_s": 0.05},
    }), "cuda").runnable[0]
    runner = TrialRunner()
    assert runner.load(trial).ok
    outcome = runner.run(trial)
    runner.close()
    path = tmp_path / "requests.parquet"
    pq.write_table(to_table("requests", outcome.tables["requests"]), path)
    return outcome.row, pq.read_table(path).to_pylist()


def _assert_flagged_and_left_out(row: dict, requests: list[dict]) -> None:
    assert row["status"] == "ok", row.get("error")
    assert row["client_behind"] is True and row["unstable"] is True
    assert "client behind: send lateness p99" in row["unstable_reason"]
    assert row["send_lateness_p99_s"] > row["send_lateness_bound_s"] >= 0.005
    late = [r for r in requests if r["send_lateness_s"] is not None and r["send_lateness_s"] > row["send_lateness_bound_s"]]
    assert late and all(r["send_lateness_s"] is not None for r in requests)
    # The steady window, where there is one, holds no stretch where the client was behind.
    if row["window_start_s"] is not None:
        for r in late:
            due = r["t_start_s"] - r["send_lateness_s"]
            assert r["t_start_s"] <= row["window_start_s"] or due >= row["window_end_s"]


def test_a_blocked_event_loop_is_flagged_not_reported_as_the_servers_latency(truth, tmp_path, monkeypatch):
    server, _ = truth
    block_at_s, block_s = 0.4, 0.25

    async def blocked(ep, reqs, cap, deadline_s):
        # The client's loop does nothing else for block_s: every request due meanwhile leaves late.
        asyncio.get_running_loop().call_later(block_at_s, time.sleep, block_s)
        return await send_requests(ep, reqs, max_concurrency=cap, deadline_s=deadline_s)

    # 40 requests 25 ms apart: a 1 s schedule the block falls inside.
    row, requests = _trial_row(server, tmp_path, monkeypatch, blocked, rate=40.0)
    _assert_flagged_and_left_out(row, requests)
    assert row["send_lateness_max_s"] > 0.1  # most of the block, whatever the machine


def test_a_rate_past_what_the_client_sends_is_flagged(truth, tmp_path, monkeypatch):
    server, _ = truth

    def slow_clock() -> float:
        # A send path too slow for the rate: every stamp costs the loop 2 ms (a request takes
        # several), so 400 requests/s are out of its reach on any machine.
        time.sleep(0.002)
        return time.monotonic()

    async def slow(ep, reqs, cap, deadline_s):
        return await send_requests(ep, reqs, max_concurrency=cap, deadline_s=deadline_s, clock=slow_clock)

    row, requests = _trial_row(server, tmp_path, monkeypatch, slow, rate=400.0)
    _assert_flagged_and_left_out(row, requests)
    # Not a hiccup: most requests left late, the client, not the server, setting the pace.
    bound = row["send_lateness_bound_s"]
    assert sum(r["send_lateness_s"] > bound for r in requests) > len(requests) / 2
