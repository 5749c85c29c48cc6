"""The prefix_repetition dataset: random prompts that share prefixes, planned and drawn."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import numpy as np
import pytest

from actors.workload import SharedPrefixSource, prompt_source
from sweeper.core.errors import SweepFileError
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.conftest import ROOT, run_cli

PREFIXES = {"prefix_repetition": {"prefix_len": 12, "suffix_len": 4, "num_prefixes": 3}}


def _sweep(dataset=PREFIXES, **workload):
    return parse_sweep({"name": "p", "models": "tiny-llama", "precisions": "fp32", "batch_sizes": [6],
                        "workload": {"dataset": dataset, "output_len": 4, **workload}})


def test_prompts_are_prefix_plus_suffix_long_and_the_prefixes_are_identity():
    (trial,), _ = expand(_sweep())
    assert trial.input_len == 16 and trial.dataset == "prefix_repetition"
    assert (trial.shared_prefix.prefix_len, trial.shared_prefix.num_prefixes) == (12, 3)
    assert "in=16 (3 prefixes of 12)" in trial.label()
    columns = trial.columns()  # the trials row says it too, beside input_len
    assert (columns["dataset"], columns["prefix_len"], columns["num_prefixes"], columns["input_len"]) == \
        ("prefix_repetition", 12, 3, 16)
    from sweeper.core.schema import TRIALS
    assert {"prefix_len", "num_prefixes"} <= {c.name for c in TRIALS}
    (other,), _ = expand(_sweep({"prefix_repetition": {"prefix_len": 12, "suffix_len": 4, "num_prefixes": 2}}))
    (plain,), _ = expand(_sweep("random", input_len=16))
    assert len({trial.trial_id, other.trial_id, plain.trial_id}) == 3
    assert plain.shared_prefix is None


@pytest.mark.parametrize(("dataset", "workload", "field", "words"), [
    ({"prefix_repetition": {"prefix_len": 0, "suffix_len": 4, "num_prefixes": 3}}, {},
     "workload.dataset.prefix_repetition.prefix_len", "greater than 0"),
    ({"prefix_repetition": {"prefix_len": 8, "suffix_len": -1, "num_prefixes": 3}}, {},
     "workload.dataset.prefix_repetition.suffix_len", "greater than 0"),
    ({"prefix_repetition": {"prefix_len": 8, "suffix_len": 4, "num_prefixes": 0}}, {},
     "workload.dataset.prefix_repetition.num_prefixes", "greater than 0"),
    ({"prefix_repetition": {"prefix_len": 8, "suffix_len": 4, "num_prefixes": 3, "seed": 1}}, {},
     "workload.dataset.prefix_repetition.seed", "unknown key"),
    (PREFIXES, {"input_len": 16}, "workload", "input_len: a prefix_repetition dataset's prompts are"),
    ({"prefix_repetition": {"prefix_len": 8, "suffix_len": 4, "num_prefixes": 9}},
     {"mode": "serving", "request_rate": 2, "num_prompts": 4}, "workload", "9 prefixes for 4 prompts"),
])
def test_bad_values_name_their_field(dataset, workload, field, words):
    with pytest.raises(SweepFileError) as info:
        if workload.get("mode") == "serving":
            parse_sweep({"name": "p", "models": "tiny-llama", "precisions": "fp32",
                         "workload": {"dataset": dataset, "output_len": 4, **workload}})
        else:
            _sweep(dataset, **workload)
    assert info.value.field == field and words in info.value.message, str(info.value)
    assert len(info.value.problems) == 1  # one line: no second complaint from the other kind of dataset


def test_the_command_line_says_it_on_one_line_with_exit_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: p\nmodels: tiny-llama\nprecisions: fp32\nbatch_sizes: [1]\nworkload:\n"
                    "  dataset: {prefix_repetition: {prefix_len: 0, suffix_len: 8, num_prefixes: 2}}\n"
                    "  output_len: 4\n")
    proc = run_cli("plan", str(path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: {path}: workload.dataset.prefix_repetition.prefix_len: " \
                                  "Input should be greater than 0"


def test_each_prompt_is_a_shared_prefix_and_its_own_suffix():
    (trial,), _ = expand(_sweep())
    source = prompt_source(trial, vocab_size=1000)
    assert isinstance(source, SharedPrefixSource)
    prefixes = {tuple(p) for p in source.prefixes}
    assert len(prefixes) == 3
    calls = [source.batch(0, 6).prompts, source.batch(1, 6).prompts, source.batch(-1, 6).prompts,
             tuple(p.ids for p in source.requests(6, 0)), tuple(p.ids for p in source.requests(6, 1))]
    suffixes = set()
    for prompts in calls:
        assert all(len(ids) == 16 for ids in prompts)  # exact lengths, as random prompts
        used = [tuple(ids[:12]) for ids in prompts]
        assert set(used) == prefixes and all(used.count(p) == 2 for p in prefixes)  # dealt evenly
        suffixes |= {tuple(ids[12:]) for ids in prompts}
    assert len(suffixes) == 6 * len(calls)  # every prompt its own suffix
    assert source.batch(0, 6).output_lens == (4,) * 6


def _digest(trial) -> str:
    source = prompt_source(trial, vocab_size=32000)
    ids = np.concatenate([*source.batch(0, 6).prompts, *(p.ids for p in source.requests(5, 0))])
    return hashlib.sha256(ids.tobytes()).hexdigest()


def test_the_same_sweep_draws_the_same_prompts_in_another_process():
    (trial,), _ = expand(_sweep())
    code = ("from tests.plan.test_prefix_repetition import _sweep, _digest; from sweeper.plan.expand import expand; "
            "(t,), _ = expand(_sweep()); print(_digest(t))")
    other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                           env={"PYTHONHASHSEED": "123", "PATH": "/usr/bin:/bin"})
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.strip() == _digest(trial)


class _Clock:
    """Time that moves only when the noop backend sleeps: a window of exact calls, at once."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_offline_calls_smaller_than_num_prefixes_send_every_prefix_in_turn(batch_size):
    # 8 prefixes: each call deals on from where the one before it stopped, so a batch of 1 or 2
    # sends every prefix over the trial's calls (a deal from prefix 0 sent prefix 0, or 0-1, always).
    from actors.backends.base import ModelSpec
    from actors.backends.noop import NoopBackend
    from actors.measure import measure_trial
    from actors.telemetry import NullTelemetry

    sweep = parse_sweep({"name": "p", "models": "tiny-llama", "backends": "noop", "precisions": "bf16",
                         "batch_sizes": batch_size,
                         "workload": {"dataset": {"prefix_repetition": {"prefix_len": 12, "suffix_len": 4,
                                                                        "num_prefixes": 8}}, "output_len": 2},
                         "backend_options": {"noop": {"step_s": 0.01}},
                         "measure": {"warmup_iters": 2, "min_iters": 8, "min_duration_s": 0, "idle_s": 0}})
    (trial,), _ = expand(sweep)
    assert "(8 prefixes of 12)" in trial.label()
    backend, clock = NoopBackend(), _Clock()
    backend.clock, backend.sleep = clock, clock.sleep
    load = backend.load(ModelSpec("synthetic", "tiny-llama", "bf16", trial.backend_options))
    prefixes = {tuple(p): i for i, p in enumerate(prompt_source(trial, load.vocab_size).prefixes)}
    sent: list[list[int]] = []
    generate = backend.generate_batch
    backend.generate_batch = lambda batch: sent.append(  # type: ignore[method-assign]
        [prefixes[tuple(ids[:12])] for ids in batch.prompts]) or generate(batch)
    row = measure_trial(backend, trial, load, NullTelemetry(reason="test"), clock=clock).row
    measured = sent[-row["n_iterations"]:]
    assert row["n_iterations"] >= 8 and all(len(set(call)) == batch_size for call in measured)
    assert sorted({p for call in measured for p in call}) == list(range(8)), measured
    # Over a cycle of 8 calls, every prefix equally often, batch_size times.
    counts = np.bincount([p for call in measured[:8] for p in call], minlength=8)
    assert counts.tolist() == [batch_size] * 8


def test_offline_trials_that_deal_prefixes_across_calls_are_measured_again_on_resume():
    # Results stored before the deal across calls sent fewer prefixes than their label says:
    # those trials' ids change; a call that holds every prefix, and serving, keep theirs.
    def trial(batch_size: int):
        sweep = parse_sweep({"name": "p", "models": "tiny-llama", "backends": "noop", "precisions": "bf16",
                             "batch_sizes": batch_size, "workload": {"dataset": {"prefix_repetition": {
                                 "prefix_len": 12, "suffix_len": 4, "num_prefixes": 8}}, "output_len": 2}})
        return expand(sweep)[0][0]

    assert trial(2).identity()["prefixes_dealt_across_calls"] is True
    assert "prefixes_dealt_across_calls" not in trial(8).identity()
    assert "prefixes_dealt_across_calls" not in trial(16).identity()
