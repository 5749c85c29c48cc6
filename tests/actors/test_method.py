"""The measurement method's skeleton: one sequence of steps around every kind of window, and
prompt sources built once per loaded model."""

from __future__ import annotations

import pytest

from actors import workload
from actors.measure import OfflineWindow
from actors.method import Figures, Window, measure
from actors.serving_measure import ServingWindow
from actors.stability import Verdict
from actors.stages import StageClock
from actors.telemetry import NullTelemetry
from actors.workload import PromptSources
from sweeper.core.results import RequestRecord, Throughput
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.actors.test_measure import FakeClock

REQUEST = RequestRecord(trial_id="t", request_index=0, output_tokens=1)


def trials(**overrides):
    sweep = {"name": "m", "models": "tiny-llama", "backends": "noop", "precisions": "bf16", "batch_sizes": [1, 4],
             "workload": {"input_len": 8, "output_len": 4},
             "measure": {"warmup_iters": 0, "min_iters": 1, "min_duration_s": 0, "idle_s": 0}, **overrides}
    return expand(parse_sweep(sweep))[0]


class Scripted(Window):
    """A window that records when the skeleton calls it, on a fake clock."""

    def __init__(self, clock: FakeClock, telemetry: NullTelemetry) -> None:
        self.clock, self.telemetry, self.calls = clock, telemetry, []

    def prepare(self) -> None:
        self.calls.append("prepare")

    def warm_up(self) -> None:
        self.calls.append("warm_up")

    def run(self, telemetry) -> None:
        self.calls.append("run")
        self.clock.sleep(2.0)

    def figures(self, handle, telemetry, idle_power_w) -> Figures:
        self.calls.append("figures")
        assert handle.duration_s == pytest.approx(2.0)  # the telemetry window was held around run() alone
        verdict = Verdict()
        verdict.flag("planted")
        return Figures(parts=(Throughput(duration_s=handle.duration_s),), requests=[REQUEST],
                       verdict=verdict, t_zero_s=handle.t_start_s, t_end_s=handle.t_end_s)


def test_the_skeleton_runs_every_step_in_order_with_the_window_inside_the_energy_window():
    clock = FakeClock()
    telemetry = NullTelemetry(reason="test", clock=clock)
    window = Scripted(clock, telemetry)
    stages = StageClock(clock=clock)
    with stages.current():
        measured = measure(trials()[0], window, telemetry, clock)
    assert window.calls == ["prepare", "warm_up", "run", "figures"]
    # The window's verdict and the skeleton's columns land in one row; no GPU, no timeline.
    assert measured.row["unstable"] is True and measured.row["unstable_reason"] == "planted"
    assert measured.row["noisy_host"] is None  # the window judged no process noise
    assert measured.requests == [REQUEST] and measured.timeline is None
    # The stages the skeleton times: the measured window's 2 s in "measure".
    spans = {s.stage: s.duration_s for s in stages.take()}
    assert spans.get("measure") == pytest.approx(2.0)


def test_offline_and_serving_trials_are_windows_of_the_one_skeleton():
    assert issubclass(OfflineWindow, Window) and issubclass(ServingWindow, Window)


def test_a_groups_dataset_is_read_and_tokenized_once(monkeypatch):
    built = []
    real = workload.dataset_prompts
    monkeypatch.setattr(workload, "dataset_prompts", lambda *a, **k: built.append(1) or real(*a, **k))
    group = trials(workload={"dataset": "bundled", "output_len": 4, "num_prompts": 8})
    assert len(group) == 2  # batch 1 and 4: one model, one workload
    sources = PromptSources(vocab_size=1000)
    first, second = (sources.for_trial(t) for t in group)
    assert first is second and len(built) == 1
    # Another workload (here another seed) is another source.
    other = trials(workload={"dataset": "bundled", "output_len": 4, "num_prompts": 8, "seed": 1})[0]
    assert sources.for_trial(other) is not first and len(built) == 2
