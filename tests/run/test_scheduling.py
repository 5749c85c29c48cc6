"""Scheduling on real Ray with the noop backend: multi-GPU placement, lost nodes, OOM pruning, progress.

The multi-node tests start a ``ray.cluster_utils.Cluster`` with logical GPUs in
a process of their own (``tests/cluster_scenarios.py``) and judge the run from
the trial rows it leaves: node, Ray GPU ids, start and finish times.
"""

from __future__ import annotations

import io
from collections import defaultdict

import numpy as np
import pytest
from rich.console import Console

from actors.backends import create_backend
from actors.backends.base import ModelSpec
from sweeper.core.backends import BACKENDS
from sweeper.core.errors import SweepFileError
from sweeper.core.presets import PRESETS
from sweeper.live import LiveObserver
from sweeper.plan.expand import make_plan
from sweeper.plan.spec import load_sweep
from sweeper.run.assembly import run_plan
from sweeper.run.storage import ResultStore
from sweeper.run.sweep_run import RunOptions
from tests.cluster_scenarios import run_scenario
from tests.conftest import ROOT
from tests.fake_nvml import FakeClock


def _plan(write_sweep, text: str, device: str = "cpu"):
    path = write_sweep(text)
    return make_plan(load_sweep(path), device, sweep_path=str(path))


# -- the noop backend, without Ray --------------------------------------------------------

def test_noop_plans_any_preset_and_every_dtype_precision_but_no_quantized_one(write_sweep):
    plan = _plan(write_sweep, """
name: noop-plan
models: [llama-3.1-8b, tiny-qwen2]
backends: noop
precisions: [fp32, bf16, fp16, int8, nf4]
tensor_parallel: [1, 8, 16]
batch_sizes: 1
workload: {input_len: 8, output_len: 4}
""", device="cuda")
    runnable = {(t.model, t.precision, t.tensor_parallel) for t in plan.runnable}
    assert runnable == {(m, p, tp) for m in ("llama-3.1-8b", "tiny-qwen2")
                        for p in ("fp32", "bf16", "fp16") for tp in (1, 8)}
    reasons = {p.skip_reason for p in plan.skipped}
    assert "backend noop does not support precision int8" in reasons
    assert "backend noop runs tensor_parallel <= 8, not 16" in reasons
    assert not BACKENDS["noop"].layer_hooks


def test_noop_loads_without_torch_and_generates_exact_timed_tokens():
    backend = create_backend("noop")
    # Virtual time, so the step times are exactly the configured ones on any machine.
    clock = FakeClock(100.0)
    backend.clock, backend.sleep = clock, clock.sleep
    options = BACKENDS["noop"].options.model_validate({"step_s": 0.01, "prefill_s": 0.03})
    info = backend.load(ModelSpec("synthetic", "llama-3.1-8b", "bf16", options))
    assert info.vocab_size == PRESETS["llama-3.1-8b"].config["vocab_size"] == 128256
    assert info.weight_memory_bytes == 0
    gen = backend.generate(np.zeros((3, 8), dtype=np.int64), output_len=6)
    assert len(gen.requests) == 3 and gen.output_tokens == 18
    r = gen.requests[0]
    assert r.t_first_token_s - r.t_start_s == pytest.approx(0.03)
    assert r.t_end_s - r.t_first_token_s == pytest.approx(5 * 0.01)
    assert [m[0] for m in gen.marks] == ["prefill", "decode"]
    # the backend never needed torch (it may be imported by other tests in this process)
    assert BACKENDS["noop"].requires == ()


def test_noop_options_are_validated_naming_the_field(write_sweep):
    path = write_sweep("""
name: bad
models: tiny-llama
backends: noop
precisions: fp32
batch_sizes: 1
workload: {input_len: 8, output_len: 4}
backend_options: {noop: {step_s: -1}}
""")
    with pytest.raises(SweepFileError, match=r"backend_options.noop.step_s"):
        load_sweep(path)


# -- OOM pruning end to end, and what the progress lines count -----------------------------

OOM_SWEEP = """
name: noop-oom
models: tiny-llama
backends: noop
precisions: fp32
batch_sizes: [1, 2, 4, 8]
workload: {input_len: 8, output_len: 4}
backend_options: {noop: {step_s: 0.001, oom_batch_size: 2}}
measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0, idle_s: 0}
"""


@pytest.mark.parametrize("pruning", [True, False])
def test_a_simulated_oom_fails_its_trial_and_prunes_larger_batches(ray_local, write_sweep, tmp_path, pruning):
    plan = _plan(write_sweep, OOM_SWEEP)
    store = ResultStore(str(tmp_path / "out"))
    log = io.StringIO()
    summary = run_plan(plan, store, ray_local, RunOptions(oom_pruning=pruning),
                       observer=LiveObserver(Console(file=log, width=300)))
    rows = {r["batch_size"]: r for r in store.read_shards("trials").to_pylist()}
    assert (rows[1]["status"], rows[2]["status"], rows[2]["reason"]) == ("ok", "failed", "oom")
    if pruning:
        assert {b: (rows[b]["status"], rows[b]["reason"]) for b in (4, 8)} == {
            4: ("skipped", "predicted_oom"), 8: ("skipped", "predicted_oom")}
        assert (summary.ok, summary.failed, summary.skipped) == (1, 1, 2)
    else:
        assert all((rows[b]["status"], rows[b]["reason"]) == ("failed", "oom") for b in (4, 8))
        assert (summary.ok, summary.failed, summary.skipped) == (1, 3, 0)
    assert summary.model_loads == 1  # the actor recovers: no reload after an OOM
    lines = [line for line in log.getvalue().splitlines() if line.startswith("[")]
    assert len(lines) == 4 and lines[-1].startswith("[4/4]")
    statuses = [line.split()[1] for line in lines]
    assert statuses.count("skipped") == (2 if pruning else 0)  # a predicted OOM is a skip, not a failure
    assert statuses.count("failed") == (1 if pruning else 3)
    assert any(line.startswith("placed  tiny-llama noop/fp32 on ") for line in log.getvalue().splitlines())


def test_the_progress_view_counts_skips_apart_and_estimates_from_measured_trials(ray_local, write_sweep):
    from sweeper.live import ProgressView
    from sweeper.run.events import Placement

    trials = _plan(write_sweep, OOM_SWEEP).runnable
    view = ProgressView(4, slots=2, console=Console(file=io.StringIO()))
    view.group_waiting("g", "tiny-llama noop/fp32", num_gpus=1)
    assert "1 waiting" in view.counts_text() and "ETA --" in view.counts_text()
    view.group_placed("g", Placement("host", "abcdef0123", "1"))
    view.group_loaded("g")
    view.trial_started(trials[0], "g")
    view.running[trials[0].trial_id].since -= 3.0  # it ran 3 s
    view.trial_finished(trials[0], "ok")
    view.trial_finished(trials[1], "failed")
    view.trial_finished(trials[2], "skipped")
    text = view.counts_text()
    assert "3/4 done (1 ok, 1 failed, 1 skipped)" in text
    assert view.eta_s() == pytest.approx(3.0, abs=0.1)  # one trial left, ~3 s each
    rendered = view._render()  # the live table: the group's node and GPU
    console = Console(file=io.StringIO(), width=200)
    console.print(rendered)
    assert "host:abcdef01" in console.file.getvalue() and "GPU 1" in console.file.getvalue()


# -- multi-node: tensor parallel placement, lost nodes ------------------------------------------

def _run_scenario(tmp_path, scenario: str, sweep_text: str) -> tuple[dict, list[dict]]:
    sweep = tmp_path / f"{scenario}.yaml"
    sweep.write_text(sweep_text)
    out = tmp_path / "out"
    info = run_scenario(scenario, sweep, out, ROOT)
    return info, ResultStore(str(out)).read_shards("trials").to_pylist()


def _assert_no_gpu_shared(rows: list[dict]) -> None:
    """Per node and Ray GPU id, the trials that held it never overlap in time."""
    spans: dict[tuple, list] = defaultdict(list)
    for r in rows:
        assert r["ray_gpu_ids"], r  # every trial on a GPU cluster holds GPUs
        ids = r["ray_gpu_ids"].split(",")
        assert len(ids) == r["tensor_parallel"]
        for gpu in ids:
            spans[(r["ray_node_id"], gpu)].append((r["started_at"], r["finished_at"]))
    for held in spans.values():
        held.sort()
        assert all(prev_end <= start for (_, prev_end), (start, _) in zip(held, held[1:], strict=False))


TP_SWEEP = """
name: tp
models: [tiny-llama, tiny-qwen2]
backends: noop
backend_options: {{noop: {{gate_file: "{gate}"}}}}
precisions: [fp32, bf16]
tensor_parallel: [1, 2]
batch_sizes: [1, 2]
workload: {{input_len: 8, output_len: 4}}
measure: {{warmup_iters: 0, min_iters: 1, min_duration_s: 0.5, idle_s: 0}}
"""


@pytest.mark.slow
def test_tp2_groups_wait_for_a_two_gpu_node_without_blocking_one_gpu_groups(tmp_path):
    """A 1-GPU and a 2-GPU node: four tp=2 groups, four tp=1 groups, 16 trials. Every trial waits
    at a gate that opens once a one-GPU trial runs on the one-GPU node (tests/cluster_scenarios.py),
    so no tp=2 group can finish first: if the waiting tp=2 groups held the one-GPU groups back,
    the gate would open only on its time limit."""
    info, rows = _run_scenario(tmp_path, "tp", TP_SWEEP.format(gate=tmp_path / "gate"))
    one_gpu, two_gpu = info["workers"]
    assert info["gate"] == "a one-GPU trial on the one-GPU node"
    assert (info["gpus"], info["ok"], info["failed"], info["model_loads"]) == (3, 16, 0, 8)
    assert len(rows) == len({r["trial_id"] for r in rows}) == 16
    tp2 = [r for r in rows if r["tensor_parallel"] == 2]
    tp1 = [r for r in rows if r["tensor_parallel"] == 1]
    assert len(tp2) == len(tp1) == 8
    assert {r["ray_node_id"] for r in tp2} == {two_gpu}  # only the node with 2 GPUs
    assert all(len(r["ray_gpu_ids"].split(",")) == 2 for r in tp2)
    assert one_gpu in {r["ray_node_id"] for r in tp1}
    # The tp=2 groups ran one at a time, on the one 2-GPU node, and no GPU held two trials at once.
    _assert_no_gpu_shared(rows)
    # logical GPUs have no NVML: the actor measured anyway, with no energy (NullTelemetry)
    assert all(r["status"] == "ok" and r["device"] == "cuda" and r["energy_j"] is None for r in rows)


REMOVE_SWEEP = """
name: remove
models: [tiny-llama, tiny-qwen2, tiny-mistral]
backends: noop
precisions: fp32
batch_sizes: [1, 2, 3, 4, 5, 6]
workload: {input_len: 8, output_len: 4}
measure: {warmup_iters: 0, min_iters: 1, min_duration_s: 0.5, idle_s: 0}
"""


@pytest.mark.slow
def test_a_lost_node_loses_no_finished_shard_and_its_group_finishes_elsewhere(tmp_path):
    info, rows = _run_scenario(tmp_path, "remove", REMOVE_SWEEP)
    [lost] = info["removed"]
    assert lost in info["workers"]
    assert (info["ok"], info["failed"]) == (18, 0)
    assert len(rows) == len({r["trial_id"] for r in rows}) == 18  # every trial exactly once
    assert all(r["status"] == "ok" for r in rows)
    on_lost = [r for r in rows if r["ray_node_id"] == lost]
    assert on_lost  # the shards finished there are kept
    lost_group = {r["model"] for r in on_lost}
    assert len(lost_group) == 1
    rest = [r for r in rows if r["model"] in lost_group and r["ray_node_id"] != lost]
    assert rest and min(r["started_at"] for r in rest) > max(r["finished_at"] for r in on_lost)
    assert {r["ray_node_id"] for r in rest} <= set(info["workers"]) - {lost}
    # One fresh actor for the lost group; a group split onto a slot that fell idle (whether one
    # does depends on how far the groups got when it did) is one load more.
    assert info["retries"] == 1 and info["model_loads"] == 4 + info["group_splits"]
    _assert_no_gpu_shared(rows)
