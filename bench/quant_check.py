"""GPU check of quantized synthetic models before the study sweep (about 2-3 minutes on an H200).

What it proves, on the GPU the lead runs it on:
1. seeded weights for llama-3.2-1b materialize on the GPU, deterministically (two
   independent builds have identical bytes), and how long that takes;
2. int8 / nf4 / fp4 (and nf4 with double quantization) load through the real
   TransformersBackend with bitsandbytes layers in place (Linear8bitLt / Linear4bit),
   their true footprint (weight_memory_bytes, quantization state included) against
   get_memory_footprint and against bf16;
3. one exact-length generate each;
4. fidelity against bf16 (KL, top-1) through the same code the actor runs;
5. the time to materialize llama-3.1-8b (16 GB) — the study sweep's first int8 load pays it.

    PYTHONPATH=/tmp/site python3 -m bench quant-check --out /tmp/quant_check.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.benchkit import driver_version, version, write_record


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def _first_shard_sha(path: Path) -> str:
    shard = sorted(path.glob("model-*.safetensors"))[0]
    h = hashlib.sha256()
    with open(shard, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def materialize(preset: str, seed: int, root: Path) -> dict:
    from actors.models import materialize_weights

    t0 = time.monotonic()
    path = materialize_weights(preset, seed, root=root)
    seconds = time.monotonic() - t0
    size = _dir_bytes(path)
    return {"preset": preset, "path": str(path), "seconds": seconds, "bytes": size,
            "gb_per_s": size / seconds / 1e9, "shards": len(list(path.glob("model-*.safetensors")))}


def check_precision(precision: str, options: dict, args, reference, settings) -> dict:
    import torch

    from actors.backends.base import ModelSpec
    from actors.backends.transformers.eager import TransformersBackend
    from actors.quality.fidelity import compare
    from sweeper.core.backends import TransformersOptions

    backend = TransformersBackend()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.monotonic()
    info = backend.load(ModelSpec("synthetic", args.preset, precision, TransformersOptions(**options),
                                  seed=args.seed, weights_on_disk=True))
    load_s = time.monotonic() - t0
    layer_types: dict[str, int] = {}
    for m in backend.model.modules():
        if not list(m.children()) and hasattr(m, "weight"):
            layer_types[type(m).__name__] = layer_types.get(type(m).__name__, 0) + 1
    prompts = np.random.default_rng(0).integers(8, info.vocab_size, size=(args.batch, args.input_len))
    backend.generate(prompts, args.output_len)  # warm-up
    gen = backend.generate(prompts, args.output_len)
    out = {
        "precision": precision, "options": options, "load_s": load_s, "layer_types": layer_types,
        "weight_memory_bytes": info.weight_memory_bytes,
        "get_memory_footprint": int(backend.model.get_memory_footprint()),
        "compute_dtype": str(next(p for p in backend.model.parameters() if p.is_floating_point()).dtype),
        "generate_s": gen.t_end_s - gen.t_start_s, "output_tokens": gen.output_tokens,
        "exact_length": gen.output_tokens == args.batch * args.output_len,
        "tok_per_s": gen.output_tokens / (gen.t_end_s - gen.t_start_s),
        "ttft_s": gen.requests[0].t_first_token_s - gen.requests[0].t_start_s,
        "max_memory_allocated_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
    }
    if reference is not None:
        t0 = time.monotonic()
        result = compare(backend, reference, settings)
        out.update(fidelity_kl=result.kl, fidelity_top1=result.top1, fidelity_positions=result.positions,
                   fidelity_s=time.monotonic() - t0)
    backend.close()
    del backend
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="JSON file for everything measured")
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--big-preset", default="llama-3.1-8b", help="preset whose materialization is timed")
    ap.add_argument("--skip-big", action="store_true", help="do not materialize the big preset")
    ap.add_argument("--cache", default=None, help="cache root (default: a temporary directory, removed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--allow-cpu", action="store_true", help="smoke-test the bench on a CPU (tiny presets)")


def run(args: argparse.Namespace) -> int:

    import torch

    if not torch.cuda.is_available() and not args.allow_cpu:
        print("quant-check: no CUDA device (--allow-cpu runs it anyway)", file=sys.stderr)
        return 1
    root = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="quant_check-"))
    os.environ["SWEEPER_CACHE"] = str(root)  # the backend materializes through the same cache
    result: dict = {
        "device_name": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "driver": driver_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "transformers": version("transformers"),
        "bitsandbytes": version("bitsandbytes"), "date": time.strftime("%Y-%m-%d"),
        "preset": args.preset, "seed": args.seed, "cache": str(root),
        "workload": {"batch": args.batch, "input_len": args.input_len, "output_len": args.output_len},
    }

    def save() -> None:
        write_record(args.out, "quant-check", result, quiet=True)

    try:
        # 1. materialize twice (independent roots): time and determinism on this GPU
        first = materialize(args.preset, args.seed, root)
        twin_root = root / "twin"
        second = materialize(args.preset, args.seed, twin_root)
        first["identical_rebuild"] = _first_shard_sha(Path(first["path"])) == _first_shard_sha(Path(second["path"]))
        first["rebuild_seconds"] = second["seconds"]
        shutil.rmtree(twin_root, ignore_errors=True)
        result["materialize"] = first
        save()
        print(f"materialize {args.preset}: {first['bytes'] / 1e9:.2f} GB in {first['seconds']:.1f} s "
              f"({first['gb_per_s']:.2f} GB/s), identical rebuild: {first['identical_rebuild']}")

        # 2-4. each precision: layers, footprint, generate, fidelity vs bf16
        from actors.backends.base import ModelSpec
        from actors.backends.transformers.eager import TransformersBackend
        from actors.quality.reference import reference_outputs
        from sweeper.core.backends import TransformersOptions
        from sweeper.core.settings import FidelitySettings

        settings = FidelitySettings(reference="bf16", prompts=8, prompt_len=32, continuation_len=32)
        ref_backend = TransformersBackend()
        t0 = time.monotonic()
        ref_info = ref_backend.load(ModelSpec("synthetic", args.preset, "bf16", TransformersOptions(), seed=args.seed,
                                              weights_on_disk=True))
        reference = reference_outputs(ref_backend, settings, ref_info.vocab_size, args.seed)
        result["reference_s"] = time.monotonic() - t0
        ref_backend.close()
        del ref_backend
        runs = []
        for precision, options in [("bf16", {}), ("int8", {}), ("nf4", {}), ("fp4", {}),
                                   ("nf4", {"bnb_double_quant": True})]:
            try:
                runs.append(check_precision(precision, options, args, reference, settings))
            except Exception as exc:  # one broken precision must not hide the others
                runs.append({"precision": precision, "options": options, "error": f"{type(exc).__name__}: {exc}"})
            result["precisions"] = runs
            save()
        bf16 = next((r for r in runs if r["precision"] == "bf16" and "error" not in r), None)
        print(f"{'precision':<14} {'layers':<34} {'weights GB':>10} {'ratio':>6} {'footprint*':>10} "
              f"{'tok/s':>8} {'KL':>10} {'top1':>5}")
        for r in runs:
            label = r["precision"] + ("+dq" if r["options"].get("bnb_double_quant") else "")
            if "error" in r:
                print(f"{label:<14} ERROR {r['error'][:200]}")
                continue
            quant = {k: v for k, v in r["layer_types"].items() if "Linear" in k}
            r["ratio_vs_bf16"] = r["weight_memory_bytes"] / bf16["weight_memory_bytes"] if bf16 else None
            print(f"{label:<14} {json.dumps(quant)[:34]:<34} {r['weight_memory_bytes'] / 1e9:>10.3f} "
                  f"{r['ratio_vs_bf16'] or float('nan'):>6.3f} {r['get_memory_footprint'] / 1e9:>10.3f} "
                  f"{r['tok_per_s']:>8.1f} {r['fidelity_kl']:>10.3g} {r['fidelity_top1']:>5.2f}"
                  + ("" if r["exact_length"] else "  LENGTH MISMATCH"))
        print("(* get_memory_footprint: parameters and buffers only, no quantization state)")
        save()

        # 5. the big preset's materialization time
        if not args.skip_big:
            big = materialize(args.big_preset, args.seed, root)
            result["materialize_big"] = big
            save()
            print(f"materialize {args.big_preset}: {big['bytes'] / 1e9:.2f} GB in {big['seconds']:.1f} s "
                  f"({big['gb_per_s']:.2f} GB/s, {big['shards']} shards)")
    finally:
        save()
        if not args.cache:
            shutil.rmtree(root, ignore_errors=True)
    print(f"wrote {args.out}")
    return 0
