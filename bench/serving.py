"""Serving mode's harness cost on vLLM: sweeper's serving path against a bare ``AsyncLLM`` loop.

One async engine is loaded through sweeper's own vLLM backend in serving mode
(``VllmBackend`` + ``AsyncEngineRunner``), then, on that engine and its event loop,
the same arrival schedule (seeded Poisson arrivals of random-token prompts) runs
alternately:

  bare    a minimal client written here: one task per request that sleeps until its
          arrival, streams ``AsyncLLM.generate`` and stamps its first and last token;
  sweeper ``VllmBackend.serve``: the path a serving trial takes (per-token stamps,
          concurrency slots, the engine's scheduling stamps, deadline handling).

in ABBA order over ``--rounds``. Output throughput is output tokens over the time
from the first arrival's zero to the last token; TTFT and TPOT are per request, from
its submission, medians over the run. Reported: each round's sweeper/bare throughput
ratio, their mean with a 95 % interval, and the TTFT and TPOT p50 differences.

    python3 -m bench serving --model llama-3.1-8b --rate 16 --out $OUT/serving_harness.json
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from typing import Any

from bench.benchkit import write_record

_ids = itertools.count()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--rate", type=float, default=16.0, help="requests per second (Poisson)")
    parser.add_argument("--num-prompts", type=int, default=300)
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--max-num-seqs", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3, help="ABBA rounds (each runs both paths twice)")
    parser.add_argument("--out", required=True)


def _summary(t0: float, spans: list[tuple[float, float | None, float | None, int]]) -> dict[str, Any]:
    """Throughput, TTFT p50 and TPOT p50 from (submit, first token, last token, tokens) per request."""
    done = [(s, f, last, n) for s, f, last, n in spans if f is not None and last is not None and n > 0]
    end = max(last for _, _, last, _ in done)
    tokens = sum(n for *_, n in done)
    ttft = [f - s for s, f, _, _ in done]
    tpot = [(last - f) / (n - 1) for _, f, last, n in done if n > 1]
    return {"throughput_tok_s": tokens / (end - t0), "ttft_p50_s": statistics.median(ttft),
            "tpot_p50_s": statistics.median(tpot), "requests": len(done), "tokens": tokens}


async def bare_loop(engine: Any, requests: list[Any], output_len: int) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    params = SamplingParams(max_tokens=output_len, min_tokens=output_len, ignore_eos=True, temperature=0.0,
                            detokenize=False, output_kind=RequestOutputKind.DELTA)
    t0 = time.monotonic()

    async def one(request: Any) -> tuple[float, float | None, float | None, int]:
        await asyncio.sleep(max(t0 + request.arrival_offset_s - time.monotonic(), 0.0))
        start, first, last, n = time.monotonic(), None, None, 0
        async for out in engine.generate({"prompt_token_ids": request.prompt_ids.tolist()}, params,
                                         request_id=f"bare-{next(_ids)}"):
            now = time.monotonic()
            k = len(out.outputs[0].token_ids)
            if k and first is None:
                first = now
            n, last = n + k, now
        return start, first, last, n

    spans = await asyncio.gather(*(one(r) for r in requests))
    return _summary(t0, list(spans))


def sweeper_path(backend: Any, requests: list[Any]) -> dict[str, Any]:
    run = backend.serve(requests, max_concurrency=None, deadline_s=time.monotonic() + 600)
    spans = [(r.submit_s, r.first_token_s, r.finish_s, r.output_tokens) for r in run.requests if r.ok]
    return _summary(run.t_start_s, spans)


def _interval(values: list[float]) -> tuple[float, float, float]:
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    # Student's t at 95 % for the few rounds a device call holds.
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36}.get(len(values), 2.26)
    half = t * statistics.stdev(values) / len(values) ** 0.5
    return mean, mean - half, mean + half


def run(args: argparse.Namespace) -> int:
    from actors.backends.base import ModelSpec
    from actors.backends.vllm.backend import VllmBackend
    from actors.serving_measure import serving_requests
    from actors.workload import RandomSource
    from sweeper.core.backends import VllmOptions
    from sweeper.core.settings import ServingSettings

    backend = VllmBackend()
    t = time.monotonic()
    load = backend.load(ModelSpec("synthetic", args.model, args.precision,
                                  VllmOptions(max_num_seqs=args.max_num_seqs), serving=True))
    result: dict[str, Any] = {"config": vars(args), "load_s": time.monotonic() - t, "rounds": []}
    source = RandomSource(load.vocab_size, args.input_len, args.output_len, seed=0)
    requests = serving_requests(ServingSettings(num_prompts=args.num_prompts), request_rate=args.rate,
                                source=source, seed=0)
    warm = serving_requests(ServingSettings(num_prompts=16), request_rate=float("inf"),
                            source=RandomSource(load.vocab_size, args.input_len, args.output_len, seed=1), seed=1)
    sweeper_path(backend, warm)
    runner = backend.serving

    def bare() -> dict[str, Any]:
        return runner.call(bare_loop(runner.engine, requests, args.output_len), timeout_s=600)

    try:
        for k in range(args.rounds):
            order = [("sweeper", lambda: sweeper_path(backend, requests)), ("bare", bare)]
            if k % 2:
                order.reverse()
            measured: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in order}
            for name, path in order + order[::-1]:
                measured[name].append(path())
            round_: dict[str, Any] = {name: {key: statistics.fmean(m[key] for m in runs) for key in runs[0]}
                                      for name, runs in measured.items()}
            round_["throughput_ratio"] = (round_["sweeper"]["throughput_tok_s"]
                                          / round_["bare"]["throughput_tok_s"])
            result["rounds"].append(round_)
            print(f"round {k}: sweeper/bare throughput {round_['throughput_ratio']:.4f}", flush=True)
            write_record(args.out, "serving", result)
        ratios = [r["throughput_ratio"] for r in result["rounds"]]
        mean, lo, hi = _interval(ratios)

        def rel(key: str) -> float:
            s = statistics.fmean(r["sweeper"][key] for r in result["rounds"])
            b = statistics.fmean(r["bare"][key] for r in result["rounds"])
            return s / b - 1.0

        result["summary"] = {"throughput_ratio": mean, "ratio_95_lo": lo, "ratio_95_hi": hi,
                             "ttft_p50_rel_diff": rel("ttft_p50_s"), "tpot_p50_rel_diff": rel("tpot_p50_s")}
        print(result["summary"], flush=True)
        write_record(args.out, "serving", result)
    finally:
        backend.close()
    return 0
