"""The transformers backend's compiled path on a real tiny model, on this CPU.

The compiled path runs on GPUs only; tests let it run here (``compile_devices``)
to check what does not depend on the device: identical greedy tokens, one
compile per shape, no recompiles across calls, hooks forcing eager, and every
fallback with its reason. Numbers (speed, compile_s on a GPU) come from
``python -m bench compile-check``.
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from actors.backends.base import ModelSpec
from actors.backends.transformers.compiled import RecompiledError, compiled_graphs
from actors.backends.transformers.eager import TransformersBackend
from bench.benchkit import output_ids
from sweeper.core.backends import TransformersOptions
from sweeper.core.results import Compile
from tests.conftest import run_cli

# One worker builds the module's compiled and eager backends once (pytest-xdist).
pytestmark = pytest.mark.xdist_group("compile")

INPUT_LEN, OUTPUT_LEN = 12, 8


def _spec(precision: str = "fp32", **options) -> ModelSpec:
    return ModelSpec("synthetic", "tiny-llama", precision, TransformersOptions(**options))


def _prompts(seed: int, batch: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).integers(8, 2048, size=(batch, INPUT_LEN))


@pytest.fixture(scope="module")
def eager():
    b = TransformersBackend()
    b.load(_spec())
    yield b
    b.close()


@pytest.fixture(scope="module")
def inductor_cpu() -> None:
    """Skip unless inductor really builds and runs a kernel on this machine (it needs a C++ compiler)."""
    import torch

    try:
        fn = torch.compile(lambda x: x * 2 + 1, backend="inductor", dynamic=False)
        ok = torch.equal(fn(torch.arange(4.0)), torch.arange(4.0) * 2 + 1)
    except Exception as exc:
        pytest.skip(f"torch.compile (inductor) cannot build kernels on this CPU: {type(exc).__name__}: {exc}")
    assert ok


def _tokens(backend: TransformersBackend, prompts: np.ndarray):
    """The prompt + greedy tokens of one ``generate`` call, from whichever path ran it."""
    with output_ids(backend) as outputs:
        backend.generate(prompts, OUTPUT_LEN)
    return outputs[-1].clone()


def test_eager_and_cpu_fall_back_with_their_status(eager):
    assert eager.prepare(2, INPUT_LEN, OUTPUT_LEN) == Compile(None, "eager")
    b = TransformersBackend()  # the default: compiled on GPUs only
    b.load(_spec(compile=True))
    info = b.prepare(2, INPUT_LEN, OUTPUT_LEN)
    assert info.compile_s is None
    assert info.compile_status.startswith("fallback: CPU")
    # It runs, eager, with the eager path's tokens.
    graphs = compiled_graphs()
    p = _prompts(0)
    assert (_tokens(b, p) == _tokens(eager, p)).all()
    assert compiled_graphs() == graphs
    b.close()


def test_static_cache_path_gives_eager_tokens_across_calls_and_shapes(eager):
    """The static cache, reset in place between calls, with dynamo off: tokens equal to the
    dynamic cache's. The cache goes by the argument name this transformers takes, without its
    deprecation warning (``past_key_values`` is to go in transformers 5.40)."""
    import warnings

    import torch._dynamo

    b = TransformersBackend(compile_devices=("cuda", "cpu"))
    b.load(_spec(compile=True))
    graphs = compiled_graphs()
    with torch._dynamo.config.patch(disable=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seed, batch in [(1, 2), (2, 2), (3, 1), (4, 2)]:  # a shape change and back
            p = _prompts(seed, batch)
            assert b._compiled.applies()
            assert (_tokens(b, p) == _tokens(eager, p)).all(), (seed, batch)
    assert compiled_graphs() == graphs
    assert not [w for w in caught if "past_key_values" in str(w.message)]
    b.close()


@pytest.mark.slow
def test_compiled_tokens_equal_eager_and_one_compile_per_shape(eager, inductor_cpu):
    import torch._dynamo

    b = TransformersBackend(compile_devices=("cuda", "cpu"))
    b.load(_spec(compile=True, compile_mode="reduce-overhead"))
    info = b.prepare(2, INPUT_LEN, OUTPUT_LEN)
    assert info.compile_status.startswith("compiled"), info
    assert info.compile_s is not None and info.compile_s > 0

    graphs = compiled_graphs()
    for seed in (5, 6, 7):
        p = _prompts(seed)
        assert (_tokens(b, p) == _tokens(eager, p)).all(), seed
    assert compiled_graphs() == graphs, "a call of the prepared shape recompiled"

    # A new batch size compiles its own graph once; the old shape's info is kept.
    one = b.prepare(1, INPUT_LEN, OUTPUT_LEN)
    assert one.compile_status.startswith("compiled") and compiled_graphs() > graphs
    p = _prompts(8, batch=1)
    assert (_tokens(b, p) == _tokens(eager, p)).all()
    assert b.prepare(2, INPUT_LEN, OUTPUT_LEN) == info

    # Forward hooks (the layer-profiling pass) make the call run eager, and they see every step.
    calls = []
    handle = b.model.model.layers[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        graphs = compiled_graphs()
        p = _prompts(9)
        assert (_tokens(b, p) == _tokens(eager, p)).all()
    finally:
        handle.remove()
    assert len(calls) == OUTPUT_LEN  # prefill + OUTPUT_LEN - 1 decode steps
    assert compiled_graphs() == graphs

    # A recompile during a prepared shape's call is an error, not a slow iteration.
    torch._dynamo.reset()
    with pytest.raises(RecompiledError, match="batch 2, cache length 20"):
        b.generate(_prompts(10), OUTPUT_LEN)
    b.close()


@pytest.mark.slow
def test_compile_failure_falls_back_to_eager(eager, inductor_cpu):
    import torch._dynamo
    import torch._inductor.config

    b = TransformersBackend(compile_devices=("cuda", "cpu"))
    b.load(_spec(compile=True))
    torch._dynamo.reset()  # no compiled code from other tests may serve this shape
    # A real failure: inductor finds no C++ compiler (and no cached kernel to skip it).
    with torch._inductor.config.patch({"cpp.cxx": ("/nonexistent/c++",), "fx_graph_cache": False}):
        info = b.prepare(2, INPUT_LEN, OUTPUT_LEN)
    assert info.compile_s is None
    assert info.compile_status.startswith("fallback: torch.compile failed: ")
    assert "C++ compiler" in info.compile_status
    p = _prompts(11)
    assert (_tokens(b, p) == _tokens(eager, p)).all()
    b.close()


def test_bitsandbytes_layers_fall_back():
    b = TransformersBackend(compile_devices=("cuda", "cpu"))  # the device would allow it
    b.load(_spec("nf4", compile=True))
    info = b.prepare(1, INPUT_LEN, OUTPUT_LEN)
    assert info.compile_s is None
    assert info.compile_status.startswith("fallback: bitsandbytes layers do not compile")
    b.generate(_prompts(12, batch=1), OUTPUT_LEN)
    b.close()


@pytest.mark.slow
def test_trial_rows_carry_compile_columns(tmp_path):
    """Eager and compiled variants in one real sweep: both statuses land in trials.parquet."""
    sweep = tmp_path / "compile.yaml"
    sweep.write_text(
        "name: compile\n"
        "models: [tiny-llama]\n"
        "precisions: [fp32]\n"
        "batch_sizes: [1]\n"
        "backend_options: {transformers: [{compile: false}, {compile: true}]}\n"
        "workload: {input_len: 8, output_len: 4}\n"
        "measure: {warmup_iters: 1, min_iters: 2, min_duration_s: 0.1, idle_s: 0}\n"
    )
    r = run_cli("run", str(sweep), "--output", str(tmp_path / "out"), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    rows = pq.read_table(tmp_path / "out" / "trials.parquet",
                         columns=["backend_options", "status", "compile_s", "compile_status"]).to_pylist()
    by_option = {'"compile":true' in row["backend_options"]: row for row in rows}
    assert len(rows) == 2 and all(row["status"] == "ok" for row in rows)
    assert by_option[False]["compile_status"] == "eager" and by_option[False]["compile_s"] is None
    assert by_option[True]["compile_status"].startswith("fallback: CPU") and by_option[True]["compile_s"] is None


def test_compiled_trial_row_through_the_actor(monkeypatch, inductor_cpu):
    """A real trial on the compiled path (allowed on CPU here): compile_s set, window free of compiles."""
    from actors.actor import TrialRunner
    from actors.backends.transformers import compiled
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    monkeypatch.setattr(compiled, "COMPILE_DEVICES", ("cuda", "cpu"))
    (trial,), _ = expand(parse_sweep({
        "name": "compiled-row", "models": "tiny-llama", "precisions": "fp32", "batch_sizes": 2,
        "backend_options": {"transformers": {"compile": True}},
        "workload": {"input_len": INPUT_LEN, "output_len": OUTPUT_LEN},
        "measure": {"warmup_iters": 1, "min_iters": 3, "min_duration_s": 0.1, "idle_s": 0},
    }), check_hub=False)
    runner = TrialRunner()
    assert runner.load(trial).ok
    try:
        row = runner.run(trial).row
        assert row["status"] == "ok", row.get("error")
        assert row["compile_status"].startswith("compiled")
        assert row["compile_s"] > 0 and row["n_iterations"] >= 3
        # The same shape again: not compiled again, same compile_s, still no recompile.
        again = runner.run(trial).row
        assert again["status"] == "ok", again.get("error")
        assert again["compile_s"] == row["compile_s"]
    finally:
        runner.close()
