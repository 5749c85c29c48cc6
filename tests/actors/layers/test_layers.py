"""Layer profiling: selection, timing, attribution, the pass, the table, end to end.

Real tiny transformers models of every preset family on the CPU (host timing, and
the kernel-time timer's attribution over CPU ops under the real torch.profiler);
the CUDA kernel and event timers are exercised on a GPU by ``python -m bench layers``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
from types import SimpleNamespace

import duckdb
import pyarrow.parquet as pq
import pytest

from actors.backends.base import ModelSpec
from actors.backends.transformers.eager import TransformersBackend
from actors.layers import LayerProfileError
from actors.layers.attribute import METHOD_PHASE, METHOD_WINDOW, attribute_energy
from actors.layers.profile_pass import pass_iterations
from actors.layers.profiler import DECODE, PREFILL, LayerProfiler, ModuleTime
from actors.layers.select import (
    Unit,
    assert_disjoint,
    find_decoder_layers,
    rest_units,
    select_units,
)
from actors.layers.timers import HostTimer, KernelTimer, range_name, timer_for
from actors.workload import RandomPrompts
from sweeper.core.backends import BACKENDS, TransformersOptions
from sweeper.core.errors import SweepFileError
from sweeper.core.schema import arrow_schema, to_table
from sweeper.plan.expand import expand, make_plan
from sweeper.plan.spec import load_sweep, parse_sweep
from sweeper.run.assembly import run_plan
from sweeper.run.storage import ResultStore
from tests.conftest import ROOT

FAMILIES = ["tiny-llama", "tiny-qwen2", "tiny-mistral"]
LAYER_COLUMNS = ["trial_id", "module", "module_type", "layer_index", "phase", "calls", "gpu_time_s",
                 "gpu_time_method", "time_share", "energy_j", "method"]
OPTIONS = TransformersOptions(attn_implementation="sdpa")


@pytest.fixture(scope="module")
def backends():
    """One loaded tiny model per preset family (loaded once for the whole module)."""
    loaded = {}
    for name in FAMILIES:
        b = TransformersBackend()
        info = b.load(ModelSpec(source="synthetic", location=name, precision="fp32", options=OPTIONS))
        loaded[name] = (b, info)
    yield loaded
    for b, _ in loaded.values():
        b.close()


def leaf_modules(model):
    return {id(m) for m in model.modules() if next(m.children(), None) is None}


def generate(backend, info, profiler, n_calls: int, input_len: int, output_len: int, batch: int = 2):
    prompts = RandomPrompts(info.vocab_size, input_len, batch, seed=0)
    for i in range(n_calls):
        profiler.begin_generate()
        backend.generate(prompts.batch(i), output_len)


# -- selection --------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_block_units_are_each_decoder_layer_plus_the_top_level(backends, family):
    model = backends[family][0].model
    name, layers = find_decoder_layers(model)
    assert name == "model.layers" and layers is model.model.layers  # discovered, not hard-coded
    units = select_units(model, "block")
    blocks = [u for u in units if u.module_type == "decoder_block"]
    n = model.config.num_hidden_layers
    assert [u.layer_index for u in blocks] == list(range(n))
    assert [u.name for u in blocks] == [f"model.layers.{i}" for i in range(n)]
    assert all(u.module is layers[u.layer_index] for u in blocks)
    top = {u.module_type: u.name for u in units if u.layer_index is None}
    assert top == {"embedding": "model.embed_tokens", "rotary_embedding": "model.rotary_emb",
                   "final_norm": "model.norm", "lm_head": "lm_head"}


@pytest.mark.parametrize("family", FAMILIES)
def test_submodule_units_are_attention_mlp_and_norms_by_role(backends, family):
    model = backends[family][0].model
    units = select_units(model, "submodule")
    for i in range(model.config.num_hidden_layers):
        roles = {u.name.rsplit(".", 1)[1]: u.module_type for u in units if u.layer_index == i}
        assert roles == {"self_attn": "attention", "mlp": "mlp", "input_layernorm": "norm",
                         "post_attention_layernorm": "norm"}
    assert {u.module_type for u in units if u.layer_index is None} == {
        "embedding", "rotary_embedding", "final_norm", "lm_head"}


@pytest.mark.parametrize("family", FAMILIES)
def test_leaf_units_are_exactly_the_leaf_modules(backends, family):
    model = backends[family][0].model
    units = select_units(model, "leaf")
    assert {id(u.module) for u in units} == leaf_modules(model)
    assert all(next(u.module.children(), None) is None for u in units)
    by_name = {u.name: u for u in units}
    q = by_name["model.layers.1.self_attn.q_proj"]
    assert (q.module_type, q.layer_index) == ("attention", 1)
    assert by_name["model.layers.0.mlp.down_proj"].module_type == "mlp"
    assert by_name["lm_head"].module_type == "lm_head"


@pytest.mark.parametrize("granularity", ["block", "submodule", "leaf"])
@pytest.mark.parametrize("family", FAMILIES)
def test_no_unit_contains_another_and_together_they_cover_every_leaf(backends, family, granularity):
    model = backends[family][0].model
    units = select_units(model, granularity)
    names = [u.name for u in units]
    assert len(set(names)) == len(names)
    for a in units:
        inside = {id(m) for m in a.module.modules()}
        for b in units:
            if b is not a:
                assert id(b.module) not in inside, f"{a.name} contains {b.name}"
    covered = [id(m) for u in units for m in u.module.modules() if next(m.children(), None) is None]
    assert sorted(covered) == sorted(leaf_modules(model))  # every leaf exactly once


def test_overlapping_units_are_refused(backends):
    model = backends["tiny-llama"][0].model
    block = model.model.layers[0]
    with pytest.raises(LayerProfileError, match="overlap"):
        assert_disjoint([Unit("model.layers.0", "decoder_block", 0, block),
                         Unit("model.layers.0.mlp", "mlp", 0, block.mlp)])
    with pytest.raises(LayerProfileError, match="overlap"):  # either order
        assert_disjoint([Unit("model.layers.0.mlp", "mlp", 0, block.mlp),
                         Unit("model.layers.0", "decoder_block", 0, block)])
    with pytest.raises(LayerProfileError, match="twice"):
        LayerProfiler(model, [Unit("a", "mlp", 0, block.mlp), Unit("b", "mlp", 0, block.mlp)])
    with pytest.raises(LayerProfileError, match="unknown granularity"):
        select_units(model, "kernel")


def test_decoder_blocks_are_found_in_other_layouts(tiny_gpt2_dir):
    b = TransformersBackend()
    b.load(ModelSpec(source="path", location=str(tiny_gpt2_dir), precision="fp32", options=OPTIONS))
    units = select_units(b.model, "submodule")
    assert find_decoder_layers(b.model)[0] == "transformer.h"
    assert {u.name.rsplit(".", 1)[1]: u.module_type for u in units if u.layer_index == 1} == {
        "ln_1": "norm", "attn": "attention", "ln_2": "norm", "mlp": "mlp"}
    assert {u.name: u.module_type for u in units if u.layer_index is None} == {
        "transformer.wte": "embedding", "transformer.wpe": "embedding", "transformer.drop": "other",
        "transformer.ln_f": "final_norm", "lm_head": "lm_head"}
    b.close()


# -- timing ---------------------------------------------------------------------------------


@pytest.mark.parametrize("granularity", ["block", "submodule", "leaf"])
def test_call_counts_split_prefill_and_decode(backends, granularity):
    backend, info = backends["tiny-qwen2"]
    units = select_units(backend.model, granularity)
    n_calls, output_len = 2, 5
    with LayerProfiler(backend.model, units) as profiler:
        generate(backend, info, profiler, n_calls, input_len=6, output_len=output_len)
    assert profiler.forwards == {PREFILL: n_calls, DECODE: n_calls * (output_len - 1)}
    times = profiler.results()
    ranged = units + profiler.rests  # every unit, and a rest row per container
    assert {(t.module, t.phase) for t in times} == {(u.name, p) for u in ranged for p in (PREFILL, DECODE)}
    for t in times:
        # every range runs once per forward in these models: 1 prefill + (output_len - 1) decodes per generate
        assert t.calls == (n_calls if t.phase == PREFILL else n_calls * (output_len - 1)), t
        assert t.gpu_time_s > 0 and t.gpu_time_method == "host_clock"
    # hooks are gone after the block: another generate adds nothing
    generate(backend, info, profiler, 1, input_len=6, output_len=2)
    assert profiler.results() == times


def test_a_one_token_prompt_is_still_prefill(backends):
    backend, info = backends["tiny-llama"]
    with LayerProfiler(backend.model, select_units(backend.model, "block")) as profiler:
        generate(backend, info, profiler, 2, input_len=1, output_len=3)
    assert profiler.forwards == {PREFILL: 2, DECODE: 4}


class CountingTimer(HostTimer):
    """Host timing that counts synchronizes: there must be one per flush, none per hook."""

    def __init__(self) -> None:
        super().__init__()
        self.finishes = 0
        self.marks = 0

    def mark(self) -> float:
        self.marks += 1
        return super().mark()

    def finish(self) -> None:
        self.finishes += 1


def test_hooks_only_mark_and_one_flush_synchronizes_once(backends):
    backend, info = backends["tiny-mistral"]
    assert isinstance(timer_for(backend.model), HostTimer)  # CPU: host clock, not CUDA events
    units = select_units(backend.model, "submodule")
    timer = CountingTimer()
    with LayerProfiler(backend.model, units, timer) as profiler:
        generate(backend, info, profiler, 2, input_len=4, output_len=3)
        assert timer.finishes == 0  # nothing synchronized inside the pass
    profiler.results()
    assert timer.finishes == 1
    n_ranges = len(units) + len(profiler.rests)  # root, model, 2 blocks
    assert len(profiler.rests) == 4
    assert timer.marks == 2 * n_ranges * 2 * 3  # two marks per range per forward


def test_a_full_buffer_flushes_early_and_loses_nothing(backends):
    backend, info = backends["tiny-llama"]
    units = select_units(backend.model, "block")
    timer = CountingTimer()
    with LayerProfiler(backend.model, units, timer, max_pending=7) as profiler:
        generate(backend, info, profiler, 1, input_len=4, output_len=4)
    times = profiler.results()
    assert timer.finishes > 1
    assert sum(t.calls for t in times) == (len(units) + len(profiler.rests)) * 4


def test_time_shares_sum_to_one_per_phase(backends):
    backend, info = backends["tiny-llama"]
    with LayerProfiler(backend.model, select_units(backend.model, "leaf")) as profiler:
        generate(backend, info, profiler, 1, input_len=5, output_len=4)
    rows = attribute_energy(profiler.results(), trial_id="t", pass_energy_j=None, phase_energy_j=None)
    for phase in (PREFILL, DECODE):
        assert sum(r.time_share for r in rows if r.phase == phase) == pytest.approx(1.0)
    assert all(r.energy_j is None and r.method is None for r in rows)  # no energy measured: null


@pytest.mark.parametrize("granularity,expected", [
    ("block", {"": "model_rest", "model": "model_rest"}),
    ("submodule", {"": "model_rest", "model": "model_rest", "model.layers.0": "decoder_block_rest",
                   "model.layers.1": "decoder_block_rest"}),
])
def test_rests_are_the_called_containers_of_the_units(backends, granularity, expected):
    model = backends["tiny-llama"][0].model
    rests = rest_units(model, select_units(model, granularity))
    assert {r.name: r.module_type for r in rests} == expected
    assert {r.name: r.layer_index for r in rests if r.layer_index is not None} == {
        n: int(n.rsplit(".", 1)[1]) for n in expected if n.startswith("model.layers.")}
    leaf = {r.name: r.module_type for r in rest_units(model, select_units(model, "leaf"))}
    # at leaf granularity the attention kernel itself runs between leaves: attention's rest holds it
    assert leaf["model.layers.1.self_attn"] == "attention_rest" and leaf["model.layers.0.mlp"] == "mlp_rest"
    assert "model.layers" not in leaf  # a ModuleList is never called


def test_timer_choice(backends):
    from bench.layer_timers import event_timer_for

    model = backends["tiny-llama"][0].model
    assert isinstance(timer_for(model), HostTimer)  # CPU default
    kernel = timer_for(model, "kernel_time")
    assert isinstance(kernel, KernelTimer) and kernel.kind == "cpu_op_time"
    with pytest.raises(LayerProfileError, match="needs a CUDA model"):
        event_timer_for(model)  # the CUDA-event timer is the GPU bench's, not a production method
    with pytest.raises(LayerProfileError, match="unknown timing method"):
        timer_for(model, "wallclock")


@dataclasses.dataclass
class Ev:
    """A Kineto event as ``_KinetoEvent`` exposes it (the fields the attribution reads)."""

    activity: str
    name_: str = ""
    start: int = 0
    end: int = 0
    corr: int = 0
    linked: int = 0
    thread: int = 1

    def activity_type(self): return self.activity  # noqa: E704
    def name(self): return self.name_  # noqa: E704
    def start_ns(self): return self.start  # noqa: E704
    def end_ns(self): return self.end  # noqa: E704
    def duration_ns(self): return self.end - self.start  # noqa: E704
    def correlation_id(self): return self.corr  # noqa: E704
    def linked_correlation_id(self): return self.linked  # noqa: E704
    def start_thread_id(self): return self.thread  # noqa: E704


def kernel(linked, corr, duration_ns, activity="kernel"):
    return Ev(activity, "k", 10**6, 10**6 + duration_ns, corr, linked)


def test_kernels_go_to_every_range_open_at_their_launch():
    # ranges (host ns): key 0 = [0, 100) holds key 2 = [10, 50); key 1 = [200, 300) (another phase)
    events = [
        Ev("cpu_op", range_name(0), 0, 100, corr=100), Ev("cpu_op", range_name(2), 10, 50, corr=101),
        Ev("user_annotation", range_name(1), 200, 300, corr=102),
        Ev("cpu_op", "aten::mm", 20, 30, corr=1), Ev("cpu_op", "aten::add", 60, 70, corr=2),
        Ev("cpu_op", "aten::argmax", 150, 160, corr=3), Ev("cpu_op", "aten::mul", 250, 260, corr=4),
        Ev("cuda_runtime", "cudaLaunchKernel", 30, 31, corr=9),  # a kernel with no linked op: its launch
        Ev("cpu_op", "aten::mm", 50, 55, corr=5, thread=2),  # other thread: no range open there
        kernel(1, 11, 5_000), kernel(2, 12, 7_000), kernel(3, 13, 11_000), kernel(4, 14, 3_000),
        kernel(0, 9, 13_000), kernel(0, 99, 17_000),  # the last: no op, no launch -> unlinked
        kernel(1, 15, 2_000, "gpu_memset"), kernel(5, 16, 19_000),
        kernel(101, 0, 10**6, "gpu_user_annotation"),  # the range's own GPU span: not work
    ]
    timer = KernelTimer("cuda")
    out = timer.attribute(events)
    us = 1e-6
    assert out == pytest.approx({0: (5 + 7 + 13 + 2) * us, 2: (5 + 13 + 2) * us, 1: 3 * us})
    assert timer.stats["outside_ranges_s"] == pytest.approx((11 + 19) * us)  # sampling etc., other threads
    assert timer.stats["unlinked_s"] == pytest.approx(17 * us)
    assert (timer.stats["linked_via_op"], timer.stats["linked_via_launch"], timer.stats["unlinked"]) == (6, 1, 1)


def test_kernel_timer_on_cpu_ops_matches_torchs_own_tree(backends):
    """Real torch.profiler on the CPU: our per-range op time against torch's FunctionEvent tree."""
    backend, info = backends["tiny-llama"]
    units = select_units(backend.model, "submodule")
    timer = KernelTimer("cpu")
    with LayerProfiler(backend.model, units, timer) as profiler:
        generate(backend, info, profiler, 2, input_len=5, output_len=3)
        with pytest.raises(LayerProfileError, match="detach first"):
            profiler.results()
    prof = timer.profiles[0]
    ours = timer.attribute(prof.profiler.kineto_results.events())

    def outer_op_us(event):  # the outermost ops below a range, through nested ranges
        total = 0.0
        for child in event.cpu_children:
            if child.name.startswith("sweeper.layers#"):
                total += outer_op_us(child)
            elif not child.name.startswith("profiler::"):
                total += child.cpu_time_total
        return total

    theirs: dict[int, float] = {}
    for e in prof.events():
        if e.name.startswith("sweeper.layers#"):
            key = int(e.name.rsplit("#", 1)[1])
            theirs[key] = theirs.get(key, 0.0) + outer_op_us(e) * 1e-6
    assert set(ours) == set(theirs) and len(ours) == 2 * (len(units) + len(profiler.rests))
    assert ours == pytest.approx(theirs, rel=1e-6, abs=1e-8)

    times = profiler.results()
    forward = profiler.forward_time_s()
    assert {p: c for p, (c, _) in forward.items()} == {PREFILL: 2, DECODE: 4}
    for phase in (PREFILL, DECODE):
        rows = [t for t in times if t.phase == phase]
        assert {t.gpu_time_method for t in rows} == {"cpu_op_time"}
        # rests complete the units: the rows add up to the forward, nothing counted twice
        assert sum(t.gpu_time_s for t in rows) == pytest.approx(forward[phase][1])
        assert all(t.gpu_time_s >= 0 for t in rows)
        assert all(t.gpu_time_s > 0 for t in rows if t.module_type in ("attention", "mlp", "lm_head"))
        blocks = {t.layer_index: 0.0 for t in rows if t.layer_index is not None}
        for t in rows:
            if t.layer_index is not None:
                blocks[t.layer_index] += t.gpu_time_s
        assert sorted(blocks) == [0, 1]
    assert timer.profiles == []  # read once: a second results() adds nothing
    assert profiler.results() == times


# -- attribution --------------------------------------------------------------------------


def mt(module, phase, seconds, layer=None, calls=1):
    return ModuleTime(module, "decoder_block" if layer is not None else "lm_head", layer, phase, calls, seconds)


TIMES = [mt("a", PREFILL, 3.0, 0), mt("b", PREFILL, 1.0, 1), mt("a", DECODE, 2.0, 0), mt("b", DECODE, 6.0, 1)]


def test_energy_follows_phase_energy_then_gpu_time_share():
    # 100 J measured; the timeline puts 30 J in prefill and 60 J in decode (10 J between calls)
    rows = attribute_energy(TIMES, trial_id="t", pass_energy_j=100.0, phase_energy_j={PREFILL: 30.0, DECODE: 60.0})
    e = {(r.module, r.phase): r.energy_j for r in rows}
    assert sum(e.values()) == pytest.approx(100.0)  # sums to the pass's measured energy
    prefill_j, decode_j = 100.0 * 30 / 90, 100.0 * 60 / 90
    assert e[("a", PREFILL)] == pytest.approx(prefill_j * 0.75)
    assert e[("b", PREFILL)] == pytest.approx(prefill_j * 0.25)
    assert e[("a", DECODE)] == pytest.approx(decode_j * 0.25)
    assert e[("b", DECODE)] == pytest.approx(decode_j * 0.75)
    assert {r.method for r in rows} == {METHOD_PHASE}
    assert [r.time_share for r in rows] == pytest.approx([0.75, 0.25, 0.25, 0.75])


def test_without_a_phase_split_energy_follows_gpu_time_over_the_pass():
    for phases in (None, {PREFILL: 5.0}, {PREFILL: 0.0, DECODE: 0.0}):
        rows = attribute_energy(TIMES, trial_id="t", pass_energy_j=24.0, phase_energy_j=phases)
        assert {r.method for r in rows} == {METHOD_WINDOW}
        assert [r.energy_j for r in rows] == pytest.approx([6.0, 2.0, 4.0, 12.0])  # 24 J x t / 12 s


def test_a_phase_with_no_measured_time_is_split_evenly():
    rows = attribute_energy(trial_id="t", times=[mt("a", DECODE, 0.0, 0), mt("b", DECODE, 0.0, 1)], pass_energy_j=10.0,
                            phase_energy_j={DECODE: 3.0})
    assert [r.time_share for r in rows] == [0.5, 0.5]
    assert sum(r.energy_j for r in rows) == pytest.approx(10.0)


# -- the pass in the actor ------------------------------------------------------------------


def profiled_trial(granularity="submodule", output_len=4, **measure):
    trials, _ = expand(parse_sweep({
        "name": "lp", "models": "tiny-llama", "precisions": "fp32", "batch_sizes": 2,
        "workload": {"input_len": 6, "output_len": output_len},
        "measure": {"warmup_iters": 1, "min_iters": 2, "min_duration_s": 0.05, "idle_s": 0, **measure},
        "profile": {"layers": granularity},
    }))
    return trials[0]


@pytest.fixture(scope="module")
def runner():
    from actors.actor import TrialRunner

    r = TrialRunner()
    assert r.load(profiled_trial()).ok
    yield r
    r.close()


def test_the_pass_runs_after_the_headline_and_reports_itself(runner):
    trial = profiled_trial(output_len=4)
    outcome = runner.run(trial)
    row = outcome.row
    assert row["status"] == "ok", row.get("error")
    assert (trial.layer_profile, row["layer_profile_status"]) == ("submodule", "ok")  # the former: the trial's own column
    assert row["layer_profile_overhead"] > -1 and row["layer_profile_energy_j"] is None  # CPU: no energy
    rows = outcome.tables["layers"].to_pylist()
    units = select_units(runner.backend.model, "submodule")
    n_ranges = len(units) + len(rest_units(runner.backend.model, units))
    assert len(rows) == 2 * n_ranges and {r["trial_id"] for r in rows} == {trial.trial_id}
    iterations = pass_iterations(trial)
    for r in rows:
        assert r["calls"] == (iterations if r["phase"] == PREFILL else iterations * 3)
        assert r["gpu_time_s"] > 0 and r["energy_j"] is None and r["method"] is None
        assert r["gpu_time_method"] == "host_clock"  # CPU: the default timer
    assert set(rows[0]) == set(LAYER_COLUMNS)
    table = to_table("layers", rows)  # the shard's schema takes the rows as they are
    assert table.schema == arrow_schema("layers") and table.column_names == LAYER_COLUMNS
    # the headline window never saw a hook: its requests are the measured ones
    assert len(outcome.tables["requests"]) == row["n_requests"]


class StubTelemetry:
    """An active telemetry whose pass window measured ``energy_j`` and whose
    timeline puts ``phase_share`` of it in each phase's intervals."""

    active = True

    def __init__(self, energy_j: float, phase_share: dict[str, float]) -> None:
        self.energy_j, self.phase_share, self.marks, self.names = energy_j, phase_share, [], []

    @contextlib.contextmanager
    def measure(self, name):
        self.names.append(name)
        handle = SimpleNamespace(window=None, error=None)
        yield handle
        handle.window = SimpleNamespace(energy_j=self.energy_j)

    def phase_energy(self, marks):
        self.marks = list(marks)
        return {p: self.energy_j * s for p, s in self.phase_share.items()}


def test_pass_energy_is_split_by_phase_and_sums_to_the_window(runner):
    from actors.layers.profile_pass import profile_layers

    trial = profiled_trial("block", output_len=3)
    tel = StubTelemetry(50.0, {PREFILL: 0.2, DECODE: 0.7})
    profile = profile_layers(runner.backend, trial, runner.load_info, tel, headline_s_per_iter=1.0)
    assert tel.names == [f"{trial.trial_id}/layers"]
    assert [m[0] for m in tel.marks] == [PREFILL, DECODE] * pass_iterations(trial)  # each call's intervals
    rows = profile.rows
    assert profile.columns.layer_profile_energy_j == 50.0 and profile.columns.layer_profile_status == "ok"
    assert sum(r.energy_j for r in rows) == pytest.approx(50.0)
    assert sum(r.energy_j for r in rows if r.phase == PREFILL) == pytest.approx(50.0 * 0.2 / 0.9)
    assert {r.method for r in rows} == {METHOD_PHASE}


def test_backends_without_layer_hooks_say_so_and_write_no_rows(runner, monkeypatch):
    monkeypatch.setitem(BACKENDS, "transformers", dataclasses.replace(BACKENDS["transformers"], layer_hooks=False))
    outcome = runner.run(profiled_trial("block"))
    assert outcome.row["status"] == "ok"
    assert outcome.row["layer_profile_status"] == "not applicable: backend transformers has no layer hooks"
    assert outcome.row["layer_profile_overhead"] is None
    assert "layers" not in outcome.tables


def test_a_broken_pass_fails_the_trial_but_keeps_the_headline(runner, monkeypatch):
    import actors.actor

    def broken(*args, **kwargs):
        raise RuntimeError("hook exploded")

    monkeypatch.setattr(actors.actor, "profile_layers", broken)
    outcome = runner.run(profiled_trial("block"))
    row = outcome.row
    assert (row["status"], row["reason"]) == ("failed", "layer_profile_failed")
    assert "hook exploded" in row["error"] and row["layer_profile_status"].startswith("failed: RuntimeError")
    assert row["throughput_tok_s"] > 0 and "layers" not in outcome.tables


# -- sweep option and identity ----------------------------------------------------------------

MINIMAL = {"name": "x", "models": "tiny-llama", "precisions": "fp32", "batch_sizes": 1,
           "workload": {"input_len": 8, "output_len": 4}}


def test_profile_option_is_validated():
    assert parse_sweep(MINIMAL).profile is None
    assert parse_sweep({**MINIMAL, "profile": {"layers": "leaf"}}).profile.layers == "leaf"
    for bad, field, words in [({"layers": "kernel"}, "profile.layers", "'block', 'submodule' or 'leaf'"),
                              ({"layers": "block", "every": 2}, "profile.every", "unknown key"),
                              ({}, "profile.layers", "required")]:
        with pytest.raises(SweepFileError) as info:
            parse_sweep({**MINIMAL, "profile": bad}, "f.yaml")
        assert info.value.field == field and words in str(info.value)


def test_profiling_is_identity_but_leaves_unprofiled_ids_alone():
    from tests.plan.test_plan import KNOWN_ID

    plain, _ = expand(parse_sweep(MINIMAL))
    assert plain[0].trial_id == KNOWN_ID and plain[0].layer_profile is None
    assert "layer_profile" not in plain[0].identity()
    ids = {g: expand(parse_sweep({**MINIMAL, "profile": {"layers": g}}))[0][0] for g in ("block", "leaf")}
    assert ids["block"].layer_profile == "block" and ids["block"].columns()["layer_profile"] == "block"
    assert len({KNOWN_ID, ids["block"].trial_id, ids["leaf"].trial_id}) == 3
    assert ids["block"].load_key == plain[0].load_key  # profiling reuses the loaded model


# -- end to end -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_profiled_sweep_writes_layers_parquet(ray_local, write_sweep, tmp_path):
    path = write_sweep("""
name: layers-e2e
models: [tiny-llama, tiny-qwen2]
precisions: fp32
batch_sizes: [1, 2]
workload: {input_len: 8, output_len: 4}
measure: {warmup_iters: 1, min_iters: 2, min_duration_s: 0.1, idle_s: 0}
profile: {layers: submodule}
""")
    plan = make_plan(load_sweep(path), ray_local.device, sweep_path=str(path))
    store = ResultStore(str(tmp_path / "out"))
    summary = run_plan(plan, store, ray_local)
    assert (summary.ok, summary.failed) == (4, 0), summary.failures
    counts = store.aggregate()
    out = tmp_path / "out"
    assert len(list((out / "shards" / "layers").glob("*.parquet"))) == 4
    # 2 layers x 4 submodules + 4 top-level units + 4 rests (root, model, 2 blocks), in 2 phases, per trial
    assert counts["layers"] == 4 * 16 * 2
    table = pq.read_table(out / "layers.parquet")
    assert table.schema == arrow_schema("layers")
    con = duckdb.connect()
    trials = con.execute(f"""SELECT trial_id, layer_profile, layer_profile_status, layer_profile_overhead
                             FROM '{out}/trials.parquet'""").fetchall()
    assert {(lp, st) for _, lp, st, _ in trials} == {("submodule", "ok")}
    assert all(ovh is not None for *_, ovh in trials)
    per_phase = con.execute(f"""
        SELECT trial_id, phase, sum(time_share), min(calls), max(calls), count(*),
               count(energy_j), count(DISTINCT module)
        FROM '{out}/layers.parquet' GROUP BY 1, 2""").fetchall()
    assert len(per_phase) == 8
    for _tid, phase, share, lo, hi, n, n_energy, n_modules in per_phase:
        assert share == pytest.approx(1.0) and n == n_modules == 16 and n_energy == 0  # CPU: null energy
        assert (lo, hi) == ((2, 2) if phase == PREFILL else (6, 6))  # 2 passes x (1 | output_len - 1)
    assert {r[0] for r in trials} == {r[0] for r in per_phase}
    # the guide's queries run as written
    guide = (ROOT / "docs" / "GUIDE.md").read_text().split("## Layer profiling", 1)[1].split("\n## ", 1)[0]
    sql = guide.split("```sql", 1)[1].split("```", 1)[0].replace("results/quantization", str(out))
    statements = [s for s in sql.split(";") if s.strip()]
    assert len(statements) == 2
    top, by_role = (con.execute(s).fetchall() for s in statements)
    assert len(top) == 10 and len({m for m, *_ in top}) == 10
    assert {r[2] for r in by_role} == {"attention", "mlp", "norm", "embedding", "rotary_embedding",
                                      "final_norm", "lm_head", "decoder_block_rest", "model_rest"}


# -- the GPU bench's CPU path -------------------------------------------------------------------------


@pytest.mark.slow
def test_gpu_bench_runs_on_cpu(tmp_path):
    out = tmp_path / "layers.json"
    r = subprocess.run(
        [sys.executable, "-m", "bench", "layers", "--model", "tiny-llama", "--precision", "fp32", "--batches", "1",
         "--granularities", "block,submodule", "--input-len", "8", "--output-len", "4", "--iters", "2",
         "--window-s", "0.05", "--idle-s", "0", "--device", "cpu", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads(out.read_text())["results"]
    assert report["errors"] == [] and len(report["runs"]) == 2
    for run in report["runs"]:
        assert run["reference"]["timer"] == "host_clock" and run["reference"]["prefill_forwards"] == 2
        assert run["prefill_time_share_sum"] == pytest.approx(1.0)
        assert run["decode_block_share_max_over_min"] >= 1 and run["coverage"] > 0
        assert run["decode_time_share_sum"] == pytest.approx(1.0) and run["gpu_time_method"] == ["host_clock"]
        assert run["energy_within_2pct"] is None  # no energy on the CPU
    assert set(report["checks"]) >= {"coverage_within_10pct", "energy_within_2pct", "overhead"}
