"""GPU evidence for the vLLM backend: sweeper's path against bare ``LLM.generate``.

For each model config, ONE engine is loaded through sweeper's own actor code
(``TrialRunner.load``: ``VllmBackend`` + NVML telemetry, no Ray), then for each
batch size, interleaved on that engine:

  bare   ``LLM.generate`` timed around the call alone (prompts built outside the
         timer, same SamplingParams object, same random-token prompts source),
         repeated until ``--iters`` and ``--window-s`` are both reached;
  sweeper ``TrialRunner.run`` of the vllm trial (warm-up, idle baseline, measured
         window with telemetry on): throughput, J/token, TTFT, TPOT, power;
  bare   again (drift check),

and reports sweeper / mean(bare) throughput per config. Done when every bf16
ratio is >= 0.97 (``--threshold``).

    PYTHONPATH=/tmp/site python3 -m bench vllm-compare --out $OUT/vllm_compare.json
    # split if short of time:
    ... --model llama-3.2-1b --out $OUT/vllm_1b.json
    ... --model llama-3.1-8b --out $OUT/vllm_8b.json          # bf16 and fp8
    # 2 GPUs:
    ... --tp 2 --model llama-3.1-8b --no-fp8 --out $OUT/vllm_tp2.json

``--default-engine`` also times bare ``LLM.generate`` on an engine with vLLM's own
defaults (stats off, prefix caching on), i.e. the reference "bare vLLM" bar, at the
cost of a second engine start per config. The reference numbers (``ISSUE_BAR_TOK_S``)
are in the output for comparison. ``--out`` is rewritten after every step; a failing config is
recorded and the rest still run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback
from typing import Any

from bench.benchkit import write_record
from sweeper.core.status import Status

# The reference bare vLLM 0.26 numbers on an H200 that the vLLM backend was asked to match
# (output tok/s, 128 in / 128 out).
ISSUE_BAR_TOK_S = {"llama-3.2-1b": {1: 781, 16: 10_800, 64: 30_800},
                   "llama-3.1-8b": {1: 200, 16: 2_900, 32: 5_200, 64: 8_600}}
ROW_KEYS = ("status", "error", "throughput_tok_s", "duration_s", "n_iterations", "output_tokens",
            "ttft_s", "ttft_p50_s", "tpot_s", "tpot_p50_s", "e2e_s", "energy_j", "energy_per_token_j",
            "avg_power_w", "peak_power_w", "idle_power_w", "prefill_energy_j", "decode_energy_j",
            "energy_uncertainty_j", "unstable", "unstable_reason", "peak_memory_bytes",
            "weight_memory_bytes", "gpu_uuids", "gpu_names", "compile_status")


def environment() -> dict[str, Any]:
    import importlib.metadata as md

    env: dict[str, Any] = {"python": sys.version.split()[0], "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    for dist in ("torch", "transformers", "vllm", "nvidia-ml-py", "ray"):
        with contextlib.suppress(md.PackageNotFoundError):
            env[dist] = md.version(dist)
    try:
        import pynvml

        pynvml.nvmlInit()
        env["driver"] = pynvml.nvmlSystemGetDriverVersion()
        env["gpus"] = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                       for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception as exc:
        env["nvml_error"] = str(exc)
    return env


def make_trials(model: str, precision: str, batches: list[int], args, options: dict):
    from sweeper.plan.expand import expand
    from sweeper.plan.spec import parse_sweep

    sweep = parse_sweep({
        "name": "vllm-compare", "models": model, "backends": "vllm", "precisions": precision,
        "batch_sizes": batches, "tensor_parallel": args.tp,
        "workload": {"input_len": args.input_len, "output_len": args.output_len},
        "measure": {"warmup_iters": 1, "min_iters": args.iters, "min_duration_s": args.window_s,
                    "idle_s": args.idle_s, "min_window_s": args.window_s},
        "backend_options": {"vllm": options},
    })
    trials, _ = expand(sweep)
    return trials


def bare_generate(llm, params, vocab_size: int, batch: int, args, seed: int) -> dict:
    """``LLM.generate`` timed around the call only, on fresh random-token prompts each call."""
    from actors.workload import RandomPrompts

    prompts = RandomPrompts(vocab_size, args.input_len, batch, seed)

    def build(i: int) -> list[dict]:
        return [{"prompt_token_ids": row} for row in prompts.batch(i).tolist()]

    llm.generate(build(-1), params, use_tqdm=False)  # warm-up
    calls_s: list[float] = []
    tokens, i = 0, 0
    while len(calls_s) < args.iters or sum(calls_s) < args.window_s:
        batch_prompts = build(i)
        t0 = time.perf_counter()
        outs = llm.generate(batch_prompts, params, use_tqdm=False)
        calls_s.append(time.perf_counter() - t0)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        i += 1
    return {"throughput_tok_s": tokens / sum(calls_s), "calls": len(calls_s), "time_s": sum(calls_s),
            "output_tokens": tokens, "call_s_median": statistics.median(calls_s)}


def wait_gpu_memory_freed(limit_s: float = 90.0, below_bytes: int = 3 * 2**30) -> float:
    """Seconds until every visible GPU's used memory is under ``below_bytes`` (engine processes gone)."""
    from actors.telemetry.nvml import DeviceReader, resolve_gpus

    readers = [DeviceReader(g) for g in resolve_gpus()]
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit_s:
        if all((r.memory_used_bytes() or 0) < below_bytes for r in readers):
            break
        time.sleep(0.5)
    return time.monotonic() - t0


def default_engine_bare(model: str, precision: str, batches: list[int], args) -> dict:
    """Bare ``LLM.generate`` on an engine with vLLM's defaults: the reference bar, measured here."""
    import vllm

    from actors.backends.vllm.backend import VLLM_QUANTIZATION, architecture_overrides
    from actors.models import materialize_synthetic
    from sweeper.core.precisions import PRECISIONS

    path = materialize_synthetic(model)
    p = PRECISIONS[precision]
    kwargs = {"model": str(path), "dtype": p.torch_dtype, "load_format": "dummy", "skip_tokenizer_init": True,
              "tensor_parallel_size": args.tp,
              "hf_overrides": architecture_overrides(json.loads((path / "config.json").read_text()))}
    if p.quantization:
        kwargs["quantization"] = VLLM_QUANTIZATION[p.quantization]
    if args.tp > 1:
        kwargs["distributed_executor_backend"] = "mp"
    t0 = time.monotonic()
    llm = vllm.LLM(**kwargs)
    out: dict[str, Any] = {"engine_kwargs": {k: v for k, v in kwargs.items() if k != "hf_overrides"},
           "load_s": time.monotonic() - t0, "batches": {}}
    params = vllm.SamplingParams(max_tokens=args.output_len, min_tokens=args.output_len, ignore_eos=True,
                                 temperature=0.0, detokenize=False)
    vocab = int(llm.llm_engine.model_config.get_vocab_size())
    for b in batches:
        out["batches"][b] = bare_generate(llm, params, vocab, b, args, seed=0)
    from actors.backends.vllm.backend import VllmBackend

    backend = VllmBackend()
    backend.llm = llm
    backend.close()
    out["freed_s"] = wait_gpu_memory_freed()
    return out


def run_config(model: str, precision: str, batches: list[int], args, result: dict, save) -> None:
    from actors.actor import TrialRunner

    key = f"{model}/{precision}" + (f"/tp{args.tp}" if args.tp > 1 else "")
    entry = result["configs"].setdefault(key, {"model": model, "precision": precision, "tp": args.tp})
    if args.default_engine:
        try:
            entry["default_engine"] = default_engine_bare(model, precision, batches, args)
        except Exception:
            entry["default_engine"] = {"error": traceback.format_exc()[-3000:]}
        save()
    trials = make_trials(model, precision, batches, args, json.loads(args.options))
    runner = TrialRunner()
    load = runner.load(trials[0])
    info = runner.load_info
    entry["load"] = {"ok": load.ok, "load_s": load.load_s, "error": load.error,
                     "info": {"device": info.device, "device_name": info.device_name,
                              "weight_memory_bytes": info.weight_memory_bytes} if info else {},
                     "engine_kwargs": {k: v for k, v in (runner.load_info.extra.get("engine_kwargs", {})
                                                         if runner.load_info else {}).items()
                                       if k != "hf_overrides"}}
    save()
    if not load.ok:
        runner.close()
        return
    backend: Any = runner.backend  # a VllmBackend: its engine and sampling parameters
    assert runner.load_info is not None
    vocab = runner.load_info.vocab_size
    entry["batches"] = {}
    try:
        for trial in trials:
            b = trial.batch_size
            step: dict = {"trial_id": trial.trial_id}
            entry["batches"][b] = step
            try:
                params = backend._sampling_params(trial.output_len)  # the very object sweeper's path uses
                step["bare_before"] = bare_generate(backend.llm, params, vocab, b, args, seed=1)
                outcome = runner.run(trial)
                step["sweeper"] = {k: outcome.row.get(k) for k in ROW_KEYS}
                step["bare_after"] = bare_generate(backend.llm, params, vocab, b, args, seed=2)
                bare = statistics.mean([step["bare_before"]["throughput_tok_s"],
                                        step["bare_after"]["throughput_tok_s"]])
                ours = outcome.row.get("throughput_tok_s")
                step["bare_tok_s"] = bare
                step["ratio"] = ours / bare if ours else None
                step["bare_drift"] = (step["bare_after"]["throughput_tok_s"]
                                      / step["bare_before"]["throughput_tok_s"] - 1)
                bar = ISSUE_BAR_TOK_S.get(model, {}).get(b)
                if bar and precision == "bf16" and args.tp == 1:
                    step["issue_bar_tok_s"] = bar
                    step["vs_issue_bar"] = ours / bar if ours else None
                default = entry.get("default_engine", {}).get("batches", {}).get(b)
                if default and ours:
                    step["vs_default_engine"] = ours / default["throughput_tok_s"]
            except Exception:
                step["error"] = traceback.format_exc()[-3000:]
            save()
    finally:
        runner.close()
        entry["freed_s"] = wait_gpu_memory_freed()
        save()


def summary(result: dict, threshold: float) -> list[str]:
    lines = [f"{'config':28} {'batch':>5} {'bare tok/s':>11} {'sweeper':>10} {'ratio':>6} "
             f"{'J/tok':>8} {'TTFT ms':>8} {'TPOT ms':>8} {'W':>6}  verdict"]
    verdicts = []
    for key, entry in result["configs"].items():
        if "error" in entry:
            lines.append(f"{key:28} error: {entry['error'][-160:]}")
            verdicts.append(False)
            continue
        if not entry.get("load", {}).get("ok", True):
            lines.append(f"{key:28} load failed: {(entry['load'].get('error') or '')[:160]}")
            verdicts.append(False)
            continue
        for b, step in entry.get("batches", {}).items():
            s = step.get("sweeper") or {}
            if "error" in step or s.get("status") != Status.OK:
                lines.append(f"{key:28} {b:>5} error: {(step.get('error') or s.get('error') or '')[-160:]}")
                verdicts.append(False)
                continue
            ok = step["ratio"] is not None and step["ratio"] >= threshold
            verdicts.append(ok)

            def f(v, scale=1.0, fmt="{:.1f}"):
                return fmt.format(v * scale) if v is not None else "-"

            lines.append(f"{key:28} {b:>5} {step['bare_tok_s']:>11,.0f} {s['throughput_tok_s']:>10,.0f} "
                         f"{step['ratio']:>6.3f} {f(s['energy_per_token_j'], fmt='{:.4f}'):>8} "
                         f"{f(s['ttft_s'], 1e3):>8} {f(s['tpot_s'], 1e3, '{:.2f}'):>8} "
                         f"{f(s['avg_power_w'], fmt='{:.0f}'):>6}  {'ok' if ok else 'BELOW'}"
                         + (f"  (reference bar {step['issue_bar_tok_s']:,}: x{step['vs_issue_bar']:.2f})"
                            if step.get("issue_bar_tok_s") else ""))
    lines.append(f"done criterion (sweeper >= {threshold} x bare on every config): "
                 f"{'MET' if verdicts and all(verdicts) else 'NOT MET'}")
    return lines


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", choices=["all", "llama-3.2-1b", "llama-3.1-8b"], default="all")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--window-s", type=float, default=6.0, help="measured window, bare and sweeper alike")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=1.0)
    ap.add_argument("--tp", type=int, default=1, help="tensor parallel degree (GPUs 0..tp-1)")
    ap.add_argument("--no-fp8", action="store_true", help="skip llama-3.1-8b fp8")
    ap.add_argument("--fp8-only", action="store_true", help="only llama-3.1-8b fp8 (bf16 measured before)")
    ap.add_argument("--fp8-batches", default=None, help="batches of the fp8 config (default: --batches)")
    ap.add_argument("--default-engine", action="store_true",
                    help="also time bare generate on an engine with vLLM's defaults (one more start per config)")
    ap.add_argument("--options", default="{}", help="backend_options.vllm as JSON, e.g. '{\"max_model_len\": 4096}'")
    ap.add_argument("--threshold", type=float, default=0.97)
    ap.add_argument("--out", default="vllm_compare.json")


def run(args: argparse.Namespace) -> None:

    # Telemetry and the engine must see the same GPUs: the first tp of them.
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(args.tp)))
    batches = [int(b) for b in args.batches.split(",")]
    fp8_batches = [int(b) for b in args.fp8_batches.split(",")] if args.fp8_batches else batches
    configs = []
    for model in ("llama-3.2-1b", "llama-3.1-8b"):
        if args.model in ("all", model) and not args.fp8_only:
            configs.append((model, "bf16", batches))
    if not args.no_fp8 and args.model in ("all", "llama-3.1-8b"):
        configs.append(("llama-3.1-8b", "fp8", fp8_batches))

    result: dict[str, Any] = {"args": vars(args), "environment": environment(), "configs": {},
                              "started": time.time()}

    def save() -> None:
        result["elapsed_s"] = time.time() - result["started"]
        write_record(args.out, "vllm-compare", result, quiet=True)

    for model, precision, bs in configs:
        t0 = time.monotonic()
        try:
            run_config(model, precision, bs, args, result, save)
        except Exception:
            result["configs"].setdefault(f"{model}/{precision}", {})["error"] = traceback.format_exc()[-3000:]
        print(f"{model}/{precision}: {time.monotonic() - t0:.0f} s", flush=True)
        save()
    result["summary"] = summary(result, args.threshold)
    save()
    print("\n".join(result["summary"]))
    print(f"wrote {args.out} ({result['elapsed_s']:.0f} s)")
