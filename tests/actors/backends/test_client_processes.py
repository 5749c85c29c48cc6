"""One run's requests sent from several client processes (``actors.backends.server.fanout``),
held against the server whose timing is known (``tests/truth_server.py``, here with two
worker processes of its own): each request's TTFT and ITL are still the server's, the run is
one run (one zero, every request once), a concurrency cap holds across the processes, and a
client process that dies is an error, not a hang."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from actors.backends.server import fanout
from actors.backends.server.fanout import ClientProcessError, processes_for, run_http
from actors.serving.records import ServingRequest
from sweeper.core.servers import ServerOptions
from tests.actors.backends.test_client_truth import (
    MAX_ATTEMPTS,
    _disagreements,
    endpoint,
    requests,
    server_sends,
    truth_server,
)
from tests.truth_server import read_send_log


@pytest.fixture(scope="module")
def truth2(tmp_path_factory) -> Any:
    """The truth server with two worker processes on one port, each logging to a file of its own."""
    with truth_server(tmp_path_factory.mktemp("truth2"), workers=2) as served:
        yield served


def test_two_client_processes_read_the_servers_own_ttft_and_itl_request_by_request(truth2):
    """The light-load check of the one-process client (test_client_truth), with the requests
    dealt to two processes: their stamps are on the host's monotonic clock, like the server's,
    so each request still agrees with the server's log within the same bounds."""
    server, log = truth2
    ep = endpoint(server)
    missed: list[str] = []
    for attempt in range(MAX_ATTEMPTS):
        tag = 5_000 + 100 * attempt
        run = run_http(ep, requests(tag, 6, gap_s=0.15, output_len=16), max_concurrency=None,
                       deadline_s=time.monotonic() + 60, processes=2)
        assert run.client_processes == 2
        assert [r.index for r in run.requests] == list(range(6))  # each request once, the run's order
        sends = server_sends(log, tag, 6)
        for r, s in zip(run.requests, sends, strict=True):
            assert r.ok and r.output_tokens == 16, r.error
            # One zero for both processes: each request was due at its own offset from it.
            assert r.arrival_s == pytest.approx(run.t_start_s + 0.05 + r.index * 0.15, abs=1e-9)
            assert r.send_lateness_s is not None and r.send_lateness_s >= 0
            assert s.connection_opened_s < run.t_start_s  # each process opened its connections first
        missed = _disagreements(run, sends)
        if not missed:
            break
    assert not missed, f"every one of {MAX_ATTEMPTS} runs missed; the last: " + "; ".join(missed)


def test_a_concurrency_cap_is_shared_out_and_holds_across_the_processes(truth2):
    """Twelve requests due at once under a cap of 3, asked of 4 processes: 3 processes (one
    slot each), never more than 3 requests at the server at a time, every request served."""
    server, log = truth2
    tag = 7_000
    reqs = [ServingRequest(i, np.array([tag + i, 11, 12, 13]), 4, 0.05) for i in range(12)]
    run = run_http(endpoint(server), reqs, max_concurrency=3, deadline_s=time.monotonic() + 60, processes=4)
    assert run.client_processes == 3
    assert all(r.ok for r in run.requests), [r.error for r in run.requests if not r.ok]
    sends = server_sends(log, tag, 12)
    spans = sorted((s.received_s, s.sent_s[-1]) for s in sends)
    at_once = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert at_once <= 3
    # Those that waited for their process's slot were due when it freed, not at their arrival.
    assert sum(1 for r in run.requests if r.due_s is not None and r.due_s > r.arrival_s) >= 9 - 3


def test_the_truth_servers_workers_each_log_their_own_requests(truth2):
    server, log = truth2
    tag = 9_000
    run_http(endpoint(server), requests(tag, 8, gap_s=0.0), max_concurrency=None, deadline_s=time.monotonic() + 60,
             processes=2)
    assert len(server_sends(log, tag, 8)) == 8
    assert len(read_send_log(log)) >= 8


@pytest.mark.parametrize(("rate", "n", "out", "cap", "cpus", "expected"), [
    (4.0, 40, 32, None, 16, 1),  # 128 chunks/s
    (470.0, 2350, 64, None, 16, 5),  # 30,080 chunks/s: 5 processes of 7,000
    (470.0, 2350, 64, None, 4, 2),  # at most half the cores
    (470.0, 2350, 64, 8, 16, 1),  # 8 in flight at most: 4,000 chunks/s
    (float("inf"), 8, 64, None, 16, 1),  # a warm-up burst of 8
    (float("inf"), 1000, 64, None, 16, 8),  # a thousand at once
    (float("inf"), 1000, 64, None, 2, 1),  # ... on two cores
])
def test_the_processes_a_run_needs_follow_its_expected_chunk_rate(rate, n, out, cap, cpus, expected):
    offsets = [0.0] * n if rate == float("inf") else [i / rate for i in range(n)]
    reqs = [ServingRequest(i, np.zeros(4, dtype=np.int64), out, t) for i, t in enumerate(offsets)]
    assert processes_for(reqs, cap, cpus=cpus) == expected


def test_a_client_process_that_dies_is_an_error_not_a_hang(truth2, monkeypatch):
    server, _ = truth2

    def dying(cls: Any) -> Any:
        return cls(subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE))

    monkeypatch.setattr(fanout._Child, "start", classmethod(dying))
    t0 = time.monotonic()
    with pytest.raises(ClientProcessError, match="exit"):
        run_http(endpoint(server), requests(11_000, 4, gap_s=0.0), max_concurrency=None,
                 deadline_s=time.monotonic() + 60, processes=2)
    assert time.monotonic() - t0 < fanout.READY_TIMEOUT_S


def test_several_processes_need_the_hosts_monotonic_clock(truth2):
    server, _ = truth2
    with pytest.raises(ValueError, match="monotonic"):
        run_http(endpoint(server), requests(12_000, 2, gap_s=0.0), max_concurrency=None, deadline_s=1e12,
                 clock=lambda: time.monotonic(), processes=2)


@pytest.mark.parametrize("value", [0, 65, "many", 1.5])
def test_client_processes_is_a_count_or_auto(value):
    base = {"base_url": "http://127.0.0.1:8000/v1", "model": "m"}
    assert ServerOptions(**base).client_processes == "auto"
    assert ServerOptions(**base, client_processes=4).client_processes == 4
    assert ServerOptions(**base, client_processes="auto").client_processes == "auto"
    with pytest.raises(ValidationError, match="client_processes"):
        ServerOptions(**base, client_processes=value)
