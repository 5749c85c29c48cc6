"""What the measured window did: its work and rate, lengths, latency, speculation, memory,
and the roofline figures of that work."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.results.part import Part, column


@dataclass(frozen=True)
class Throughput(Part):
    """What the measured window did and how fast: the work counted and the rate it was done at."""

    n_iterations: int | None = column("measured generate calls (offline; null in serving mode)")
    n_requests: int | None = column(
        "measured requests (sequences): offline n_iterations x batch_size; serving: the run's requests")
    duration_s: float | None = column(
        "measured window, device-synchronized at both ends; serving: the steady-state window "
        "(docs/METHOD.md)")
    output_tokens: int | None = column(
        "generated tokens in the measured window (the tokens actually produced: per-token figures divide "
        "by these)")
    throughput_tok_s: float | None = column("output_tokens / duration_s")
    requests_per_s: float | None = column("offline: n_requests / duration_s; serving: achieved_rate_req_s")


@dataclass(frozen=True)
class Lengths(Part):
    """How long the measured requests' prompts and replies were, and what mixed lengths cost a static batch (null where every request has the trial's lengths)."""

    input_len_mean: float | None = column(
        "mean prompt tokens of the measured requests (dataset prompts, natural/reference lengths; null "
        "for random prompts of one length and exact outputs)")
    output_len_mean: float | None = column(
        "mean reply tokens of the measured requests (null where every reply is output_len)")
    output_len_p50: float | None = column("median reply tokens")
    output_len_p90: float | None = column("90th percentile reply tokens")
    prompt_pad_share: float | None = column(
        "offline, varied prompts: share of the batches' prompt slots that were padding (each prompt "
        "padded to its batch's longest); null where the engine batches continuously inside a call (vLLM: "
        "no padding, early finishers leave)")
    decode_idle_slot_share: float | None = column(
        "offline, varied replies: share of decode slots (sequences x steps until the batch's longest "
        "reply ended) held by sequences already done: what early finishers cost a static batch; null for "
        "vLLM, as above")


@dataclass(frozen=True)
class Latency(Part):
    """Per-request latency over the measured requests (serving: the completed ones)."""

    ttft_s: float | None = column(
        "mean time to first generated token (prefill; serving: from submission, queueing included)")
    ttft_p50_s: float | None = column("median time to first token")
    ttft_p90_s: float | None = column("90th percentile time to first token")
    ttft_p99_s: float | None = column("99th percentile time to first token")
    tpot_s: float | None = column("mean time per output token after the first: (e2e - ttft) / (n - 1)")
    tpot_p50_s: float | None = column("median time per output token")
    tpot_p90_s: float | None = column("90th percentile time per output token")
    tpot_p99_s: float | None = column("99th percentile time per output token")
    e2e_s: float | None = column("mean end-to-end request latency")
    e2e_p50_s: float | None = column("median end-to-end request latency")
    e2e_p90_s: float | None = column("90th percentile end-to-end request latency")
    e2e_p99_s: float | None = column("99th percentile end-to-end request latency")
    itl_s: float | None = column("serving: mean inter-token latency, pooled over every gap of every request")
    itl_p50_s: float | None = column("serving: median inter-token latency")
    itl_p90_s: float | None = column("serving: 90th percentile inter-token latency")
    itl_p99_s: float | None = column("serving: 99th percentile inter-token latency")
    queue_s: float | None = column(
        "serving: mean time a request waited in the engine before it was scheduled (null where the engine "
        "does not say)")


@dataclass(frozen=True)
class Speculation(Part):
    """Speculative decoding over the measured window, from the engine's own counters (null without speculation)."""

    spec_drafts: float | None = column(
        "speculative decoding (vLLM, in-process or a server's /metrics): draft steps the engine ran over "
        "the window (offline) or the run (serving), from its spec_decode counters; null without "
        "speculation")
    spec_draft_tokens: float | None = column("speculative decoding: tokens the drafts proposed over the same span")
    spec_accepted_tokens: float | None = column(
        "speculative decoding: proposed tokens the model accepted over the same span")
    spec_acceptance_rate: float | None = column(
        "speculative decoding: spec_accepted_tokens / spec_draft_tokens; on a synthetic (random-weight) "
        "model it says nothing of real text")
    spec_tokens_per_step: float | None = column(
        "speculative decoding: tokens a draft step yields, 1 + spec_accepted_tokens / spec_drafts (its "
        "accepted drafts and the model's own token)")


@dataclass(frozen=True)
class Memory(Part):
    """Memory the measured window held: the backend's own peak and each GPU's."""

    peak_memory_bytes: int | None = column(
        "peak memory during the trial (transformers on CUDA: torch max_memory_allocated; vllm: NVML "
        "memory used on the trial's GPUs, i.e. what the engine reserves; CPU: the actor process's "
        "resident peak (VmHWM) since the trial's reset, null where the kernel cannot reset it)")
    gpu_peak_memory_bytes: list[int | None] | None = column(
        "per GPU: the highest device memory in use NVML read in the window (every process on the GPU; the "
        "sampler's slow fields, every few samples)")


@dataclass(frozen=True)
class Roofline(Part):
    """Analytic roofline figures from the architecture (sweeper/core/roofline.py): null for an architecture without formulas; mfu, mbu and the peaks null where a held GPU is unknown or on CPU."""

    flops_per_token: float | None = column(
        "analytic forward FLOPs of one request (prefill of the prompt + every decode step, causal "
        "attention; multiply-add = 2) / output_len: the window's FLOPs per generated token")
    weight_bytes_per_token: float | None = column(
        "weight bytes one decode step reads (matmul weights at their stored size, lm_head, biases, norms, "
        "the batch's embedding rows) / batch_size")
    kv_bytes_per_token: float | None = column(
        "K and V bytes one sequence reads per decode step, mean over its output_len - 1 decode steps "
        "(context input_len + j at step j)")
    mfu: float | None = column(
        "model FLOPs utilisation: flops_per_token x throughput_tok_s / gpu_peak_flop_per_s (= the "
        "window's FLOPs / duration_s / peak)")
    mbu: float | None = column(
        "memory bandwidth utilisation of decode: (weight_bytes_per_token + kv_bytes_per_token) x "
        "batch_size / tpot_s / gpu_peak_bandwidth_bytes_per_s")
    gpu_peak_flop_per_s: float | None = column(
        "datasheet peak dense FLOP/s (no sparsity) of the held GPUs at the precision's compute format "
        "(fp32: non-tensor), summed")
    gpu_peak_bandwidth_bytes_per_s: float | None = column("datasheet peak memory bandwidth of the held GPUs, summed")
