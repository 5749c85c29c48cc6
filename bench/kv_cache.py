"""The host memory transformers' continuous batching takes on a CPU: its own sizing against
sweeper's bound (``sweeper/core/continuous_batching.py``), side by side in one run.

Each measurement is a fresh process (resident memory is per process): it loads the model as a
sweep's actor does, notes its resident set, starts a continuous-batching manager (transformers'
defaults, or sweeper's bound: 64 pages and 2,048 tokens a step), serves one request, and
notes the resident set again, the process's peak and the cache transformers built. The
sizing is transformers' own, from the free memory, so the default's figure depends on what
else the machine holds at that moment; the record keeps the machine's available memory.

    python3 -m bench kv-cache --models tiny-llama,smollm2-135m --out kv_cache.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import resource
from typing import Any

from bench.benchkit import environment, write_record

SIZINGS = ("transformers", "sweeper")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--models", default="tiny-llama,smollm2-135m",
                    help="synthetic presets or the bundled model, comma-separated")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--out", default="kv_cache.json")


def _resident_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**30


def _available_gb() -> float:
    with open("/proc/meminfo") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["MemAvailable"].split()[0]) / 2**20


def measure_one(model: str, precision: str, sizing: str) -> dict[str, Any]:
    """In a fresh process: the manager's memory under one sizing. sweeper's is the engine a
    serving trial runs (``ContinuousBatchingEngine``), so the figure is the shipped path's."""
    import torch
    from transformers import ContinuousBatchingConfig, GenerationConfig

    from actors.backends import create_backend
    from actors.backends.base import ModelSpec
    from actors.backends.transformers.serving import ContinuousBatchingEngine
    from sweeper.core.backends import BACKENDS
    from sweeper.core.bundled import BUNDLED_MODELS

    backend: Any = create_backend("transformers")  # its model, which the Backend interface does not name
    source = "bundled" if model in BUNDLED_MODELS else "synthetic"
    backend.load(ModelSpec(source, model, precision, BACKENDS["transformers"].default_options()))
    available_gb, loaded_gb = _available_gb(), _resident_gb()
    with torch.inference_mode():
        if sizing == "sweeper":
            manager = ContinuousBatchingEngine(backend.model, None).manager
        else:  # transformers' defaults but for block sharing, which the engine turns off too
            manager = backend.model.init_continuous_batching(
                generation_config=GenerationConfig(do_sample=False, num_beams=1, eos_token_id=-1, pad_token_id=0),
                continuous_batching_config=ContinuousBatchingConfig(allow_block_sharing=False))
            manager.start()
        manager.add_request(list(range(8, 40)), request_id="r", max_new_tokens=16)
        next(out for out in manager if out.request_id == "r")
        cache = manager.batch_processor.cache
        served_gb = _resident_gb()
        manager.stop(block=True, timeout=60)
    return {"model": model, "precision": precision, "sizing": sizing, "available_before_gb": available_gb,
            "loaded_rss_gb": loaded_gb, "served_rss_gb": served_gb, "manager_gb": served_gb - loaded_gb,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "cache_pages": cache.num_blocks, "max_batch_tokens": cache.max_batch_tokens}


def run(args: argparse.Namespace) -> int:
    results: dict[str, Any] = {"environment": environment(), "rows": []}
    spawn = multiprocessing.get_context("spawn")
    for model in args.models.split(","):
        for sizing in SIZINGS:
            with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                row = pool.submit(measure_one, model, args.precision, sizing).result(timeout=600)
            results["rows"].append(row)
            print(f"{model:14s} {sizing:12s} manager {row['manager_gb']:6.2f} GB  peak {row['peak_rss_gb']:6.2f} GB  "
                  f"pages {row['cache_pages']:5d}  step tokens {row['max_batch_tokens']:5d}  "
                  f"(available before {row['available_before_gb']:.1f} GB)", flush=True)
            write_record(args.out, "kv-cache", results, quiet=True)
    print(f"wrote {args.out}")
    return 0
