"""The live display: the ETA's arithmetic on an injected clock, and a real run captured in a pseudo-terminal."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time

import pytest
from rich.console import Console

from tests.conftest import ROOT, on_the_shared_head

NOOP_SWEEP = """
name: progress
models: [tiny-llama, tiny-qwen2]
backends: noop
precisions: fp32
batch_sizes: [1, 2, 4]
workload: {input_len: 8, output_len: 4}
backend_options: {noop: {step_s: 0.05, load_s: 0.5}}
measure: {warmup_iters: 0, min_iters: 2, min_duration_s: 0.3, idle_s: 0}
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _trials(write_sweep, n: int):
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import load_sweep

    trials, _ = expand(load_sweep(write_sweep(NOOP_SWEEP)), check_hub=False)
    return trials[:n]


def test_the_eta_ticks_between_events_and_counts_pending_loads(write_sweep):
    from sweeper.live import ProgressView, format_duration
    from sweeper.run.events import Placement

    clock = FakeClock()
    trials = _trials(write_sweep, 6)
    view = ProgressView(6, slots=1, console=Console(file=io.StringIO()), quiet=True, clock=clock)
    view.group_waiting("a", "tiny-llama noop/fp32")
    view.group_waiting("b", "tiny-qwen2 noop/fp32")
    assert view.eta_s() is None  # nothing measured yet: no guess
    view.group_placed("a", Placement("host", "node0000", None))
    clock.now += 20.0  # a's load takes 20 s
    view.group_loaded("a")
    view.trial_started(trials[0], "a")
    clock.now += 4.0  # the first trial takes 4 s
    view.trial_finished(trials[0], "ok")
    # 5 trials x 4 s, plus group b's load (20 s, as a's took), on one slot
    assert view.eta_s() == pytest.approx(5 * 4.0 + 20.0)
    view.trial_started(trials[1], "a")
    clock.now += 3.0  # no event: the running trial's elapsed time counts down the estimate
    assert view.eta_s() == pytest.approx(4 * 4.0 + 1.0 + 20.0)
    clock.now += 5.0  # past its mean: the running trial is counted as finishing now
    assert view.eta_s() == pytest.approx(4 * 4.0 + 20.0)
    view.trial_finished(trials[1], "ok")  # it took 8 s: the mean is now 6 s
    view.group_done("a")
    view.group_placed("b", Placement("host", "node0000", None))
    clock.now += 15.0  # b has loaded for 15 of the 20 s a load takes
    assert view.eta_s() == pytest.approx(4 * 6.0 + 5.0)
    assert [format_duration(s) for s in (None, 42.4, 185, 3725)] == ["--", "42s", "3m05s", "1h02m"]


def test_the_live_observer_draws_a_runs_events_and_says_its_notices(write_sweep):
    from sweeper.core.results import Throughput, TrialResult
    from sweeper.core.status import Reason, Status, failed_outcome
    from sweeper.live import LiveObserver
    from sweeper.run.events import (
        ActorRequested,
        GroupPlaced,
        Placement,
        Retrying,
        RunEnded,
        RunStarted,
        TrialRecorded,
    )

    log = io.StringIO()
    observer = LiveObserver(Console(file=log, width=120), quiet=True)
    first, second = _trials(write_sweep, 2)
    cause = "server exited with code 3 before it was ready; " + "x" * 250 + " Install with pip install transformers[serving]"
    for event in (RunStarted(2, 1), ActorRequested("g", "tiny-llama noop/fp32", 0),
                  GroupPlaced("g", Placement("host", "node0000", None)),
                  TrialRecorded(first, TrialResult.of(failed_outcome(Reason.OOM, "out of memory " + "y" * 300),
                                                      Throughput(throughput_tok_s=1.0)), ran=True),
                  Retrying(1, 2, "actor died running it: node lost"),
                  TrialRecorded(second, TrialResult(failed_outcome(Reason.LOAD_FAILED, cause)), ran=False),
                  RunEnded(1.0, 0.0)):
        observer.on_event(event)
    lines = log.getvalue().splitlines()
    assert any(line.startswith("placed  tiny-llama noop/fp32 on host:node0000 CPU") for line in lines)
    assert "retry 1/2: actor died running it: node lost" in lines
    finished = [line for line in lines if line.startswith("[")]
    assert [line.split()[0] for line in finished] == ["[1/2]", "[2/2]"]
    assert all(Status.FAILED in line for line in finished)
    # A trial that ran shows its error cut to one screen; one that never ran shows its cause whole.
    assert "y" * 300 not in finished[0] and "transformers[serving]" in finished[1]
    assert observer.view is None  # the view ends with the run


def test_a_slot_per_group_spreads_the_remaining_work(write_sweep):
    from sweeper.live import ProgressView

    clock = FakeClock()
    trials = _trials(write_sweep, 4)
    view = ProgressView(4, slots=4, console=Console(file=io.StringIO()), quiet=True, clock=clock)
    for key in ("a", "b"):
        view.group_waiting(key, key)
        view.group_loaded(key)  # no load measured: loads add nothing yet
    view.trial_started(trials[0], "a")
    clock.now += 2.0
    view.trial_finished(trials[0], "ok")
    # 3 trials x 2 s over the 2 groups left (4 slots, but a group runs one trial at a time)
    assert view.eta_s() == pytest.approx(3 * 2.0 / 2)


def _run_in_pty(args: list[str], columns: int, timeout_s: float) -> tuple[int, str]:
    """Run the ``sweeper run`` of ``args`` on the tests' shared Ray head, with a pseudo-terminal
    of ``columns`` as its stdout and stderr; its output and status."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    args, head_env = on_the_shared_head(args)
    env = {k: v for k, v in head_env.items() if k not in ("COLUMNS", "LINES", "CI", "TERM")}
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(args, cwd=ROOT, stdin=terminal, stdout=terminal, stderr=terminal, env=env,
                            close_fds=True)
    os.close(terminal)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([controller], [], [], 0.5)
            if ready:
                try:
                    data = os.read(controller, 65536)
                except OSError:  # the terminal closed: the process has exited
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            pytest.fail(f"no exit within {timeout_s} s")
    finally:
        os.close(controller)
    return proc.wait(timeout=30), b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_a_real_run_in_a_terminal_shows_a_bar_results_and_a_best_table(tmp_path):
    sweep = tmp_path / "progress.yaml"
    sweep.write_text(NOOP_SWEEP)
    status, raw = _run_in_pty([sys.executable, "-m", "sweeper", "run", str(sweep), "-o", str(tmp_path / "out")],
                              columns=150, timeout_s=300)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", raw)  # colours and cursor moves
    assert status == 0, text[-3000:]
    # rich's bar, redrawn with the counts, the elapsed time and a ticking estimate
    frames = re.findall(r"sweeper ━[━╸╺ ]* +(\d+)/6 +(\d+) ok (\d+) failed (\d+) skipped", text)
    assert frames and frames[-1] == ("6", "6", "0", "0")
    assert "elapsed " in text and re.search(r"ETA \d+s", text)
    # the groups under the bar, with the node they run on
    assert re.search(r"tiny-(llama|qwen2) noop/fp32 +(loading|waiting|running|tiny-)", text)
    # each finished trial's one-line result without -q
    finished = re.findall(r"\[(\d)/6\] ok +(tiny-\w+) noop/fp32 bs=\d in=8 out=4 [^\n]*? [\d,.]+ tok/s", text)
    assert sorted(int(n) for n, _ in finished) == [1, 2, 3, 4, 5, 6]
    # and, at the end, the best row per model
    best = text.split("Best configuration per model")[1]
    assert re.search(r"tiny-llama +│ noop +│ fp32 +│ +4 │", best) and "tiny-qwen2" in best
    for header in ("tok/s", "TTFT", "TPOT"):  # headers may wrap ("TTFT" above "ms") to fit the width
        assert header in best
    assert "J/token" not in best  # a CPU run measured no energy: the column is left out, not printed empty


@pytest.mark.slow
def test_quiet_and_pipes_keep_the_plain_log(tmp_path):
    from sweeper.analysis.results import load_results
    from sweeper.core.plan_record import PLAN_FILE, PlanRecord
    from tests.conftest import run_cli

    sweep = tmp_path / "progress.yaml"
    sweep.write_text(NOOP_SWEEP + "report: {price_per_kwh: 0.15}\n")
    r = run_cli("run", str(sweep), "-o", str(tmp_path / "out"))  # stderr is a pipe: no live display
    assert r.returncode == 0, r.stderr
    assert "sweeper ━" not in r.stderr and "ETA" not in r.stderr
    lines = [line for line in r.stderr.splitlines() if re.match(r"\[\d/6\] ok ", line)]
    assert len(lines) == 6
    # The run records the sweep's pricing for the analysis; a CPU run has no energy to price.
    record = PlanRecord.parse((tmp_path / "out" / PLAN_FILE).read_bytes())
    assert record is not None and record.report.price_per_kwh == 0.15
    trials = load_results(tmp_path / "out").trials
    assert len(trials) == 6 and trials["cost_per_1m_tokens"].isna().all()
