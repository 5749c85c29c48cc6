"""The fidelity metric: hand-built distributions, real tiny models, the actor's pass, and a real sweep."""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest
import torch

from actors.backends import create_backend
from actors.backends.base import ModelSpec
from actors.quality.divergence import kl_topk
from actors.quality.fidelity import compare, kl_per_position, top1_agreement
from actors.quality.reference import fidelity_prompts, load_reference, reference_outputs
from actors.records import TopK, topk_of
from sweeper.core.backends import BACKENDS
from sweeper.core.settings import FidelitySettings
from sweeper.core.trial import GroupLoad
from sweeper.plan.expand import expand
from sweeper.plan.spec import parse_sweep
from tests.conftest import run_cli

OPTIONS = BACKENDS["transformers"].default_options()
SETTINGS = FidelitySettings(reference="fp32", prompts=3, prompt_len=6, continuation_len=5)


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SWEEPER_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _load(precision: str = "fp32", seed: int = 0):
    b = create_backend("transformers")
    info = b.load(ModelSpec("synthetic", "tiny-llama", precision, OPTIONS, seed=seed, weights_on_disk=True))
    return b, info


def _trials(**sweep):
    trials, _ = expand(parse_sweep({
        "name": "fid", "models": "tiny-llama", "batch_sizes": [1, 2],
        "workload": {"input_len": 4, "output_len": 2},
        "measure": {"warmup_iters": 0, "min_iters": 1, "min_duration_s": 0, "idle_s": 0}, **sweep}))
    return trials


# -- the arithmetic ------------------------------------------------------------------

def test_kl_and_top1_on_a_hand_built_three_token_case():
    p = np.log(np.array([[0.5, 0.25, 0.25], [0.7, 0.2, 0.1]], dtype=np.float32))
    q = np.log(np.array([[0.25, 0.5, 0.25], [0.6, 0.3, 0.1]], dtype=np.float32))
    kl = kl_per_position(p, q)
    # 0.5 ln(0.5/0.25) + 0.25 ln(0.25/0.5) + 0 = 0.25 ln 2
    assert kl[0] == pytest.approx(0.25 * math.log(2), rel=1e-6)
    assert kl[1] == pytest.approx(0.7 * math.log(7 / 6) + 0.2 * math.log(2 / 3), rel=1e-6)
    assert kl_per_position(p, p).tolist() == [0.0, 0.0]
    assert top1_agreement(p, q).tolist() == [False, True]


def test_kl_where_either_side_has_zero_probability():
    with np.errstate(divide="ignore"):
        p = np.log(np.array([0.5, 0.5, 0.0]))
    q = np.log(np.array([0.25, 0.25, 0.5]))
    assert kl_per_position(p, q) == pytest.approx(math.log(2))  # p's empty token adds nothing
    assert kl_per_position(q, p) == math.inf  # the trial rules out a token the reference allows
    # log-probs a little off normalization (float32 log-softmax) never give a negative KL
    assert kl_per_position(p[:2] + 1e-6, p[:2]) == pytest.approx(0.0, abs=1e-12)


def test_topk_kl_is_exact_over_the_coarse_space_when_every_token_is_listed():
    p = np.log(np.array([0.5, 0.3, 0.1, 0.1]))
    q = np.log(np.array([0.4, 0.4, 0.1, 0.1]))
    ref, trial = topk_of(p[None], 2), topk_of(q[None], 2)
    assert ref.ids.tolist() == [[0, 1]] and trial.ids[0, :2].tolist() in ([0, 1], [1, 0])
    # {0}, {1}, rest {2, 3}: 0.5 ln(0.5/0.4) + 0.3 ln(0.3/0.4) + 0.2 ln(0.2/0.2)
    expected = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4)
    assert kl_topk(ref, trial)[0] == pytest.approx(expected)
    assert expected <= kl_per_position(p, q) + 1e-12  # merging tokens never raises KL
    assert kl_topk(ref, ref)[0] == pytest.approx(0.0, abs=1e-12)


def test_topk_kl_puts_a_missing_token_at_the_trial_s_kth_probability():
    ref = TopK(np.array([[7, 3]]), np.log(np.array([[0.6, 0.3]])))
    trial = TopK(np.array([[7, 5]]), np.log(np.array([[0.5, 0.2]])))
    # token 3 is missing from the trial's top 2: taken at 0.2; rest 0.1 vs 1 - 0.7 = 0.3
    expected = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.2) + 0.1 * math.log(0.1 / 0.3)
    assert kl_topk(ref, trial)[0] == pytest.approx(expected)


# -- real tiny models ----------------------------------------------------------------

@pytest.mark.slow
def test_identical_models_agree_exactly_and_a_perturbed_one_does_not():
    ref_backend, info = _load()
    ref = reference_outputs(ref_backend, SETTINGS, info.vocab_size, seed=0)
    assert ref.tokens.shape == (3, 6 + 5) and ref.logprobs.shape == (3, 5, info.vocab_size)
    assert (ref.tokens[:, :6] == fidelity_prompts(SETTINGS, info.vocab_size, 0)).all()
    # the continuation is the reference's own greedy choice at each position
    assert (ref.logprobs.argmax(-1) == ref.tokens[:, 6:]).all()

    twin, _ = _load()  # a second, independent load of the same weights
    same = compare(twin, ref, SETTINGS)
    assert (same.kl, same.top1, same.positions) == (0.0, 1.0, 15)

    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in twin.model.parameters():
            if p.dim() == 2:
                p.add_(torch.randn(p.shape, generator=gen) * 0.02)
    perturbed = compare(twin, ref, SETTINGS)
    assert perturbed.kl > 1e-4 and perturbed.top1 < 1.0
    # The top-k method on the same pair: top-1 agreement exact, KL an estimate near the full one.
    ref20 = reference_outputs(ref_backend, SETTINGS, info.vocab_size, seed=0, top_k=20)
    assert np.array_equal(ref20.tokens, ref.tokens) and ref20.topk.ids.shape == (3, 5, 20)
    topk = compare(twin, ref20, SETTINGS)
    assert topk.top1 == perturbed.top1 and 0 < topk.kl <= 1.5 * perturbed.kl
    ref_backend.close()
    twin.close()


def test_reference_is_cached_on_disk_and_reused(cache):
    trial = _trials(precisions="bf16", fidelity={"reference": "fp32", "prompts": 2, "prompt_len": 4,
                                                   "continuation_len": 3})[0]
    settings = trial.fidelity
    backend, info = _load("bf16")
    opened = []

    def open_backend(name: str):
        opened.append(create_backend(name))
        return opened[-1]

    first = load_reference(trial, open_backend)
    again = load_reference(trial, open_backend)
    assert len(opened) == 1 and opened[0].model is None  # loaded once, then closed
    assert len(list((cache / "fidelity").glob("*.npz"))) == 1
    assert np.array_equal(first.tokens, again.tokens) and np.array_equal(first.logprobs, again.logprobs)
    assert settings is not None and info.vocab_size == first.logprobs.shape[-1]
    backend.close()


# -- the actor's pass ----------------------------------------------------------------

@pytest.mark.slow
def test_actor_computes_once_per_group_and_marks_reference_rows(cache):
    from actors.actor import TrialRunner

    fidelity = {"reference": "fp32", "prompts": 2, "prompt_len": 4, "continuation_len": 3}
    for precision, expect in (("fp32", "reference"), ("bf16", "ok")):
        trials = _trials(precisions=precision, fidelity=fidelity)
        runner = TrialRunner()
        assert runner.load(trials[0]).ok
        # The reference was computed in its own step, before the trial's model loaded.
        assert len(list((cache / "fidelity").glob("*.npz"))) == (expect == "ok")
        rows = [runner.run(t).row for t in trials]
        runner.close()
        for row in rows:
            assert row["status"] == "ok" and row["fidelity_status"] == expect
            assert row["fidelity_reference"] == "fp32"
        if expect == "reference":
            assert rows[0]["fidelity_kl"] is None and rows[0]["fidelity_top1"] is None
        else:
            assert rows[0]["fidelity_kl"] > 0 and 0 < rows[0]["fidelity_top1"] <= 1
            assert rows[0]["fidelity_kl"] == rows[1]["fidelity_kl"]  # one pass per load
            assert rows[0]["fidelity_method"] == "full"
    assert len(list((cache / "fidelity").glob("*.npz"))) == 1


def test_the_plan_starts_the_reference_group_first_and_hands_it_the_groups_it_serves():
    from sweeper.plan.expand import make_plan

    fidelity = {"reference": "fp32", "prompts": 2, "prompt_len": 4, "continuation_len": 3}
    sweep = {"name": "fid", "models": "tiny-llama", "batch_sizes": [1, 2], "precisions": ["bf16", "fp16", "fp32"],
             "workload": {"input_len": 4, "output_len": 2}, "fidelity": fidelity}
    # fp32 first although the grid lists it last
    groups = make_plan(parse_sweep(sweep), "cuda").groups()
    assert [g.trials[0].precision for g in groups] == ["fp32", "bf16", "fp16"]
    assert [t.precision for t in groups[0].serves_reference] == ["bf16", "fp16"]
    assert all(not g.serves_reference for g in groups[1:])
    # Naming the trials' own backend is the same reference.
    named = {**fidelity, "reference": {"backend": "transformers", "precision": "fp32"}}
    groups = make_plan(parse_sweep({**sweep, "fidelity": named}), "cuda").groups()
    assert [t.precision for t in groups[0].serves_reference] == ["bf16", "fp16"]
    # A reference precision outside the grid: nobody serves it.
    other = {**sweep, "precisions": ["bf16", "fp16"]}
    assert not any(g.serves_reference for g in make_plan(parse_sweep(other), "cuda").groups())
    # Without the reference's group (done already, or not in the grid) nobody serves.
    plan = make_plan(parse_sweep(sweep), "cuda")
    assert not any(g.serves_reference for g in plan.groups([t for t in plan.runnable if t.precision != "fp32"]))


@pytest.mark.slow
def test_the_reference_group_computes_the_reference_the_others_read(cache, monkeypatch):
    from actors.actor import TrialRunner

    fidelity = {"reference": "fp32", "prompts": 2, "prompt_len": 4, "continuation_len": 3}
    reference = _trials(precisions="fp32", fidelity=fidelity)
    dependent = _trials(precisions="bf16", fidelity=fidelity)
    first = TrialRunner()
    loaded = first.load(reference[0], GroupLoad(serves_reference=(dependent[0],)))
    assert loaded.ok
    # Computed with the group's own model right after its load, in the reference stage.
    assert [sp.stage for sp in loaded.stages].count("reference") == 1
    assert [sp.stage for sp in loaded.stages].index("reference") > [sp.stage for sp in loaded.stages].index("load")
    assert len(list((cache / "fidelity").glob("*.npz"))) == 1
    own = first.run(reference[0]).row
    first.close()
    assert own["fidelity_status"] == "reference" and own["fidelity_reference_source"] is None

    second = TrialRunner()
    opened = []
    import actors.actor as actor_module

    real_create = actor_module.create_backend
    monkeypatch.setattr(actor_module, "create_backend", lambda name: opened.append(name) or real_create(name))
    assert second.load(dependent[0]).ok
    row = second.run(dependent[0]).row
    second.close()
    assert opened == ["transformers"]  # its own model only: no reference load
    assert row["fidelity_status"] == "ok" and row["fidelity_reference_source"] == "node cache"
    assert row["fidelity_kl"] > 0


def test_a_reference_another_actor_is_computing_is_left_to_it(cache):
    from actors.quality.reference import ReferenceDuty, _cache_path, _lock_file

    fidelity = {"reference": "fp32", "prompts": 2, "prompt_len": 4, "continuation_len": 3}
    dependent = _trials(precisions="bf16", fidelity=fidelity)[0]
    import fcntl

    with _lock_file(_cache_path(dependent)) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        duty = ReferenceDuty([dependent, dependent])
        duty.claim()
        assert duty.claimed == 0  # never blocks: whoever holds the lock writes the file
    duty = ReferenceDuty([dependent, dependent])
    duty.claim()
    assert duty.claimed == 1  # once per reference
    # While claimed, nobody else can take the lock; released, they can.
    with _lock_file(_cache_path(dependent)) as other:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        duty.release()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_reference_that_cannot_run_leaves_the_trial_ok():
    from actors.actor import TrialRunner

    trial = _trials(precisions="bf16", fidelity={"reference": "fp16"})[0]
    runner = TrialRunner()
    assert runner.load(trial).ok
    row = runner.run(trial).row
    runner.close()
    assert row["status"] == "ok" and row["throughput_tok_s"] > 0
    assert row["fidelity_status"].startswith("failed: reference precision fp16 on cpu:")
    assert row["fidelity_kl"] is None


def test_the_reference_may_name_another_backend_and_the_top_k_method():
    from actors.quality.reference import method_top_k, reference_key

    named = _trials(precisions="bf16", fidelity={"reference": {"backend": "noop", "precision": "fp32"}})[0]
    own = _trials(precisions="bf16", fidelity={"reference": "fp32"})[0]
    top = _trials(precisions="bf16", fidelity={"reference": "fp32", "top_k": 5})[0]
    assert named.fidelity.reference_label() == "noop/fp32" and own.fidelity.reference_label() == "fp32"
    assert len({reference_key(t) for t in (named, own, top)}) == 3
    assert (method_top_k(own), method_top_k(top), method_top_k(named)) == (None, 5, 20)
    # Settings that leave the new keys alone keep their trial ids.
    assert "reference_backend" not in own.fidelity.canonical_json() and "top_k" not in own.fidelity.canonical_json()
    from actors.actor import TrialRunner

    runner = TrialRunner()
    assert runner.load(named).ok
    row = runner.run(named).row
    runner.close()
    assert row["fidelity_status"] == "not applicable: backend noop has no model to score tokens with"
    assert row["fidelity_reference"] == "noop/fp32"


def test_a_backend_that_cannot_score_is_not_applicable():
    if "noop" not in BACKENDS:
        pytest.skip("no noop backend in this tree")
    from actors.actor import TrialRunner

    trial = _trials(backends="noop", precisions="fp32", fidelity={"reference": "bf16"})[0]
    runner = TrialRunner()
    assert runner.load(trial).ok
    row = runner.run(trial).row
    assert row["status"] == "ok"
    assert row["fidelity_status"] == "not applicable: backend noop has no model to score tokens with"


# -- a real sweep on a local Ray ----------------------------------------------------

@pytest.mark.slow
def test_sweep_writes_fidelity_columns(write_sweep, tmp_path):
    out = tmp_path / "out"
    r = run_cli("run", str(write_sweep("""
name: fidelity
models: [tiny-llama]
precisions: [fp32, bf16]
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
measure: {warmup_iters: 1, min_iters: 2, min_duration_s: 0.1, idle_s: 0}
fidelity: {reference: fp32, prompts: 2, prompt_len: 8, continuation_len: 4}
""")), "-o", str(out), "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = duckdb.sql(f"SELECT precision, status, fidelity_reference, fidelity_kl, fidelity_top1, fidelity_status "
                      f"FROM '{out}/trials.parquet' ORDER BY precision, batch_size").fetchall()
    assert [r[:3] for r in rows] == [("bf16", "ok", "fp32")] * 2 + [("fp32", "ok", "fp32")] * 2
    (_, _, _, kl, top1, status), second = rows[0], rows[1]
    assert status == "ok" and kl > 0 and 0 < top1 <= 1 and second[3:] == rows[0][3:]
    assert all(r[3] is None and r[4] is None and r[5] == "reference" for r in rows[2:])
    # The fp32 group (the reference) started first (the bf16 group's actor is asked for only once
    # fp32's is placed) and computed the reference right after its own load; the bf16 group read
    # it from the node's cache instead of loading fp32 itself.
    sources = duckdb.sql(f"SELECT precision, fidelity_reference_source FROM '{out}/trials.parquet' "
                         "ORDER BY precision").fetchall()
    assert sources == [("bf16", "node cache")] * 2 + [("fp32", None)] * 2
    spans = duckdb.sql(f"SELECT t.precision, count(*) FROM '{out}/stages.parquet' s JOIN '{out}/trials.parquet' t "
                       "USING (trial_id) WHERE s.stage = 'reference' GROUP BY 1 ORDER BY 1").fetchall()
    assert ("fp32", 1) in spans
