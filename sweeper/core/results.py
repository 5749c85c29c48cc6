"""A trial's results as typed parts: every trials-table column beyond the trial's identity
and its axes.

Each part is a frozen dataclass of columns: the field's name carries the unit, its type the
column's type (``float | None`` is a double, ``list[float] | None`` a list of doubles,
``datetime | None`` a UTC timestamp) and its ``column`` the meaning that docs/SCHEMA.md
prints. The trials schema is generated from these classes (``sweeper.core.schema``), so a
column cannot exist in one and not the other, and a part built with a name it does not
have fails where it is built. A trial's result is a ``TrialResult`` of parts; ``row()``
flattens it, the one place a trials row is made from them. Every column is nullable: a
part that does not apply (serving figures of an offline trial) stays empty.
"""

from __future__ import annotations

import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from functools import cache
from typing import Any, TypeVar


class RowError(ValueError):
    """A row its table's schema cannot hold: the column, and why."""


def column(doc: str) -> Any:
    """A column of a part: null unless the producer sets it; ``doc`` is its meaning."""
    return field(default=None, metadata={"doc": doc})


@dataclass(frozen=True)
class ColumnSpec:
    """A column as a part declares it: its name, its Python type (None stripped), its meaning."""

    name: str
    type: Any
    doc: str


@dataclass(frozen=True)
class Part:
    """A set of columns that one producer computes together."""

    @classmethod
    @cache
    def specs(cls) -> tuple[ColumnSpec, ...]:
        hints = typing.get_type_hints(cls)
        return tuple(ColumnSpec(f.name, _not_none(hints[f.name]), f.metadata["doc"]) for f in fields(cls))

    @classmethod
    @cache
    def names(cls) -> frozenset[str]:
        return frozenset(f.name for f in fields(cls))

    @classmethod
    def of(cls: type[P], values: Mapping[str, Any]) -> P:
        """The part from columns by name (from a producer that still builds them by name);
        a name the part does not have is a ``RowError`` naming it."""
        unknown = sorted(set(values) - cls.names())
        if unknown:
            raise RowError(f"{cls.__name__}: column(s) it does not have: {', '.join(unknown)}")
        return cls(**values)

    def items(self) -> Iterator[tuple[str, Any]]:
        for f in fields(self):
            yield f.name, getattr(self, f.name)


P = TypeVar("P", bound="Part")


def _not_none(hint: Any) -> Any:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) != 1:
        raise TypeError(f"a column's type is one type or None, not {hint}")
    return args[0]


@dataclass(frozen=True)
class Outcome(Part):
    """Whether the trial produced its numbers, why not, and when it ran."""

    status: str | None = column("ok | failed | skipped")
    reason: str | None = column(
        "machine-readable cause for failed/skipped (null when ok): unsupported | predicted_oom | oom | "
        "exception | load_failed | load_timeout | actor_died | timeout | layer_profile_failed | "
        "invalid_row (sweeper.core.status.Reason says when each is used)")
    error: str | None = column("error text for failed/skipped trials")
    started_at: datetime | None = column("trial start (UTC)")
    finished_at: datetime | None = column("trial end (UTC)")


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
class ServingRun(Part):
    """A serving run as a whole (null offline): the load offered, what failed, the SLOs met."""

    n_failed_requests: int | None = column(
        "serving: requests that errored or did not finish within the run's time limit")
    offered_rate_req_s: float | None = column(
        "serving: requests / the span of their sends, the realised arrival rate (conversations: follow-up "
        "turns included; inf: all at once)")
    run_duration_s: float | None = column(
        "serving: the whole run, from its start (arrival time 0) to the last request's end")
    max_concurrency_reached: int | None = column("serving: most requests in flight (submitted, not finished) at once")
    goodput_req_s: float | None = column(
        "serving: requests meeting every SLO bound / run_duration_s (vLLM's definition); null without an "
        "slo")
    slo_attainment: float | None = column("serving: share of the run's requests meeting every SLO bound")


@dataclass(frozen=True)
class SteadyState(Part):
    """A serving run's steady window (null offline): where it lies, the load the engine held there, whether it kept up."""

    achieved_rate_req_s: float | None = column(
        "serving: requests completed per second in the steady window: its output tokens / duration_s / "
        "the mean output tokens of a request")
    total_throughput_tok_s: float | None = column(
        "serving: (output tokens + prompt tokens of requests whose first token came) in the steady window "
        "/ its duration")
    window_start_s: float | None = column("serving: steady window start, seconds from the run's start")
    window_end_s: float | None = column("serving: steady window end, seconds from the run's start")
    steady_batch: float | None = column(
        "serving: the steady level of requests running in the engine, which defines the window")
    mean_running_batch: float | None = column(
        "serving: time-weighted mean of requests running in the engine over the window")
    saturated: bool | None = column(
        "serving: the engine did not keep up with the offered rate: while requests arrived in the steady "
        "window, requests outstanding trended up by more than 3 standard errors (the count's spread about "
        "its least-squares line over its independent stretches) and at least 5 % of the offered rate, or "
        "the window's completions fell below the 95 % Poisson interval of the arrivals offered over it "
        "and more than 10 % short; with every request sent at once: requests waited behind a full engine "
        "as the window opened")
    saturation_reason: str | None = column(
        "serving: the figures behind saturated (the trend in req/s with its standard error, or the "
        "completions against the Poisson interval)")
    queue_growth: float | None = column(
        "serving: the rise of the least-squares line through requests outstanding (arrived, not finished) "
        "across the arrivals in the steady window, in requests; 0 with none there")


@dataclass(frozen=True)
class ClientTimeliness(Part):
    """Whether the serving client kept its own schedule (null offline): how late it sent, against which bound."""

    send_lateness_p50_s: float | None = column(
        "serving: median send lateness over the run's requests (requests.parquet send_lateness_s: sent "
        "less due; the client's delay, not the engine's)")
    send_lateness_p99_s: float | None = column(
        "serving: 99th percentile send lateness over the run's requests: what client_behind judges")
    send_lateness_max_s: float | None = column("serving: the latest any request of the run was sent")
    steady_send_lateness_p50_s: float | None = column(
        "serving: median send lateness of the requests due inside the steady window")
    steady_send_lateness_p99_s: float | None = column(
        "serving: 99th percentile send lateness of the requests due inside the steady window")
    steady_send_lateness_max_s: float | None = column(
        "serving: the latest a request due inside the steady window was sent (never past "
        "send_lateness_bound_s: the window leaves out every stretch where the client was behind)")
    send_lateness_bound_s: float | None = column(
        "serving: the bound send_lateness_p99_s is held to: the larger of 5 ms and 10 % of ttft_p50_s "
        "(docs/METHOD.md)")
    client_behind: bool | None = column(
        "serving: the client fell behind its own schedule: send_lateness_p99_s above "
        "send_lateness_bound_s (its latencies then hold its own delay; the trial is unstable)")
    client_behind_reason: str | None = column(
        "serving: the figures behind client_behind (the p99 and max lateness, the bound, TTFT p50, the "
        "steady window left out)")
    client_processes: int | None = column(
        "serving: processes the client sent the requests from (server backend: "
        "backend_options.server.client_processes, 'auto' resolved for the run; 1 for in-process engines)")


@dataclass(frozen=True)
class PrefixCacheUse(Part):
    """What a serving engine took from its prefix cache (null where no engine reported it)."""

    prefix_cache_hit_rate: float | None = column(
        "serving: of the completed requests' prompt tokens, the share the engine took from its prefix "
        "cache (requests.parquet cached_tokens over input_len, over the requests whose engine reported "
        "it); null where none did")


@dataclass(frozen=True)
class Conversations(Part):
    """Multi-turn conversations (null for single requests): how many, and what a conversation and its turns cost."""

    n_conversations: int | None = column(
        "conversations: conversations started (their first turns, by the arrival process)")
    conversations_completed: int | None = column("conversations: conversations whose every turn completed")
    turns_per_conversation: float | None = column(
        "conversations: user turns per conversation, mean over those started")
    energy_per_conversation_j: float | None = column(
        "conversations: energy of a completed conversation (the sum of its turns' requests.parquet "
        "energy_j), mean")
    first_turn_energy_j: float | None = column(
        "conversations: energy of a completed first turn (requests.parquet energy_j), mean")
    last_turn_energy_j: float | None = column(
        "conversations: energy of a completed conversation's last turn, the one with the longest history, "
        "mean")
    first_turn_ttft_s: float | None = column("conversations: TTFT of a completed first turn, mean")
    last_turn_ttft_s: float | None = column("conversations: TTFT of a completed conversation's last turn, mean")
    conversation_s: float | None = column(
        "conversations: from a completed conversation's first send to its last reply's end (replies, turn "
        "gaps and sends), mean")


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
class Setup(Part):
    """What the group's model load gave every trial of the group: its time, its weights' memory, the GPUs' idle power before it, and the launched or external server."""

    load_s: float | None = column("model load time of the trial's group (shared by its trials, not in duration_s)")
    weight_memory_bytes: int | None = column(
        "model footprint after loading and quantizing: parameters, buffers and quantization state (int8 "
        "row scales, 4-bit absmax)")
    pre_load_idle_power_w: float | None = column(
        "the same GPUs' settled idle power before the group's model loaded (no context of ours on them): "
        "the untouched GPU, for comparison with idle_power_w")
    server_engine: str | None = column(
        "server backend: the server measured (vllm | sglang | transformers: launched by sweeper; a "
        "command's program; an external server's base_url); null for in-process backends")
    server_version: str | None = column(
        "server backend: the engine's version as the server reports it (vLLM: GET /version), else the "
        "installed engine's")
    server_command: str | None = column(
        "server backend: the command line sweeper launched the server with (null: base_url)")
    server_url: str | None = column("server backend: the OpenAI-compatible base URL requests went to")
    server_log: str | None = column("server backend: the launched server's log file, on the node that ran it")
    server_ready_s: float | None = column(
        "server backend: seconds from the launch until the server first answered GET /v1/models (part of "
        "load_s)")


@dataclass(frozen=True)
class Compile(Part):
    """What preparing the trial's shape cost, outside the measured window."""

    compile_s: float | None = column(
        "one-time compilation for the trial's shape (torch.compile of the decode step, CUDA-graph "
        "capture): what the first generate calls took beyond as many steady-state calls, outside "
        "duration_s; a shape an earlier trial on the same actor compiled repeats that value; null: "
        "nothing compiled for the trial")
    compile_status: str | None = column(
        "compiled (with notes: graph breaks, skipped CUDA graphs) | eager (not requested) | fallback: why "
        "the trial ran eager instead; null: the backend has no compiled path")


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
class Energy(Part):
    """Energy and power over the measured window (null on CPU-only runs); per-GPU figures are lists in the order of gpu_uuids."""

    energy_j: float | None = column("GPU energy over the measured window, all GPUs the trial holds")
    energy_per_token_j: float | None = column("energy_j / output_tokens")
    avg_power_w: float | None = column("energy_j / duration_s")
    peak_power_w: float | None = column(
        "highest per-sample power (summed over the trial's GPUs) in the window; each sample is NVML's "
        "instantaneous power field where the driver has one (the mean of its ~100 ms update period), else "
        "nvmlDeviceGetPowerUsage (a 1 s trailing mean): one reading can set it, and a sub-second "
        "transient may exceed the power limit")
    p99_power_w: float | None = column(
        "99th percentile of the same per-sample power: what a few readings cannot dominate")
    gpu_energy_j: list[float] | None = column(
        "per GPU of gpu_uuids: its own counter's energy over the window's boundaries; they sum to "
        "energy_j")
    gpu_avg_power_w: list[float] | None = column("per GPU: gpu_energy_j / duration_s")
    gpu_peak_power_w: list[float | None] | None = column(
        "per GPU: its highest sampled power reading in the window (as peak_power_w, one GPU)")
    active_energy_j: float | None = column("energy_j - idle_power_w x duration_s")
    energy_method: str | None = column("nvml_counter_interpolated | nvml_counter | power_integral")
    energy_uncertainty_j: float | None = column("bound on the window-boundary error of energy_j")
    energy_per_token_uncertainty_j: float | None = column("energy_uncertainty_j / output_tokens")


@dataclass(frozen=True)
class Baseline(Part):
    """The idle baseline the trial's energy is judged against: the loaded GPUs' settled idle power, and whether it was taken for this trial or re-checked."""

    idle_power_w: float | None = column(
        "mean power over the idle-baseline window, summed over the trial's GPUs: taken after the warm-up, "
        "with the model loaded and the power settled (idle_settle_s); what active_energy_j subtracts")
    gpu_idle_power_w: list[float] | None = column(
        "per GPU: its mean power over the idle-baseline window; they sum to idle_power_w")
    idle_settle_s: float | None = column(
        "seconds the power took to stop falling after the warm-up, before the baseline window began (at "
        "most 10; longer is flagged unstable); null: no baseline, or a row from a version that did not "
        "settle")
    idle_baseline_reused: bool | None = column(
        "idle_power_w is the group's baseline, taken for an earlier trial and re-checked for this one "
        "(idle_recheck_power_w within idle_reuse_tolerance_w of it); false: taken for this trial; null: "
        "no baseline")
    idle_baseline_age_s: float | None = column(
        "seconds from the baseline's start to this trial's (0 when taken for this trial)")
    idle_recheck_power_w: float | None = column(
        "the settled power a 0.5 s re-check read before deciding whether the group's baseline stands "
        "(sampled power, summed over GPUs); null: the trial had no baseline to re-check")


@dataclass(frozen=True)
class PhaseEnergy(Part):
    """The window's energy by phase, on the telemetry timeline over the engine's phase marks."""

    prefill_energy_j: float | None = column("energy attributed to prefill (timeline over phase marks)")
    decode_energy_j: float | None = column("energy attributed to decode")
    decode_energy_per_token_j: float | None = column("decode_energy_j / decode tokens")
    between_phases_energy_j: float | None = column(
        "energy in the window outside every prefill and decode mark (the host's time between generate "
        "calls), on the same curve: prefill + decode + this equals energy_j within energy_uncertainty_j")


@dataclass(frozen=True)
class PerRequestEnergy(Part):
    """The window's (serving: the run's) energy split over its requests."""

    energy_per_request_j: float | None = column(
        "offline: energy_j / n_requests; serving: mean of the completed requests' attributed energies "
        "(requests.parquet energy_j, request_energy_method)")
    energy_per_request_p50_j: float | None = column(
        "median attributed energy of a completed request (energy per response; serving, and offline with "
        "varied prompts or replies)")
    energy_per_request_p90_j: float | None = column("90th percentile attributed energy of a completed request")
    request_energy_method: str | None = column(
        "how the energy was split over requests (token_share: serving, each instant's energy over the "
        "requests then in flight; offline, each generate call's energy over its sequences; by the tokens "
        "each processes; docs/METHOD.md)")
    attributed_energy_j: float | None = column(
        "serving: sum of the requests' attributed energies (= run_energy_j, up to rounding)")
    request_prefill_share: float | None = column(
        "serving: of the completed requests' energy (requests.parquet energy_j), the share spent in their "
        "prefills (prefill_energy_j): what prompts cost against replies, by the token-share split; null "
        "where unmetered")


@dataclass(frozen=True)
class RunEnergy(Part):
    """A serving run's whole energy, ramp-up and drain included (null offline)."""

    run_energy_j: float | None = column("serving: GPU energy over the whole run (ramp-up and drain included)")
    run_energy_uncertainty_j: float | None = column("serving: bound on the boundary error of run_energy_j")


@dataclass(frozen=True)
class HostEnergy(Part):
    """The host's energy over the window, from RAPL where readable."""

    cpu_energy_j: float | None = column("CPU package energy (RAPL) over the window, null when unreadable")
    dram_energy_j: float | None = column("DRAM energy (RAPL) over the window, null when unreadable")


@dataclass(frozen=True)
class Occupancy(Part):
    """Whose processes were on the metered GPUs around the window: whether the energy is the trial's alone."""

    gpu_processes: str | None = column(
        "the compute processes NVML saw on the metered GPUs at the measured window's start and end (pid "
        "name, ...)")
    energy_exclusive: bool | None = column(
        "every process on the metered GPUs at the window's start and end was the trial's own (the actor's "
        "process or one it started: engine workers, a launched server), so the energy is the trial's "
        "alone; false: another process used its GPUs; null: not known (an external server, whose "
        "processes sweeper cannot tell, no GPU, or a process whose parent could not be read)")


@dataclass(frozen=True)
class Intervals(Part):
    """The headline figures' 95 % intervals over the window's blocks of >= 1 s, and a precision target's outcome."""

    throughput_rel_ci95: float | None = column(
        "half-width of the 95 % confidence interval of the window's throughput over blocks of >= 1 s "
        "(Student's t, blocks as independent samples), as a share of the mean; null with fewer than 3 "
        "blocks or in serving mode")
    energy_per_token_rel_ci95: float | None = column("the same for J/token over the same blocks (GPUs only)")
    ci_blocks: int | None = column("blocks of >= 1 s the intervals were computed over")
    target_met: bool | None = column(
        "with target_rel_ci: every headline interval over the whole window is within it (false: "
        "max_duration_s came first, or the last blocks widened an interval the stop judged on settled "
        "blocks; the trial is then flagged unstable); null: no target")


@dataclass(frozen=True)
class IterationNoise(Part):
    """How much the window's iterations varied: information about the host, not an interval."""

    iteration_energy_cv: float | None = column(
        "coefficient of variation of energy per iteration over blocks of >= 1 s of iterations (null with "
        "fewer than two blocks)")
    iteration_throughput_cv: float | None = column(
        "coefficient of variation of output tokens/s across the window's generate calls (null with fewer "
        "than 3); CPU runs too")


@dataclass(frozen=True)
class Stability(Part):
    """The verdict on the window's figures: whether they can be trusted, and notes on the host."""

    unstable: bool | None = column(
        "the reported figures are imprecise or biased (see unstable_reason): a headline 95 % interval "
        "wider than max_rel_ci (or a missed target_rel_ci), a window too short to judge, no energy window "
        "on GPUs, an idle baseline taken before the power settled; serving: no or a short steady window, "
        "saturation, failed requests, a client behind its schedule (client_behind)")
    unstable_reason: str | None = column("why the trial is flagged unstable, every reason with its numbers")
    noisy_host: bool | None = column(
        "the host's per-iteration noise was above max_iteration_cv although the estimate may be tight: "
        "information about the machine, not a verdict on the figures (repeats judge run-to-run noise); "
        "null: not judged (serving, varied prompts or replies)")
    noisy_host_reason: str | None = column("which per-iteration CV exceeded max_iteration_cv, with its value")


@dataclass(frozen=True)
class LayerPass(Part):
    """The layer-profiling pass (a separate pass after the measured window; its rows are in layers.parquet)."""

    layer_profile_status: str | None = column(
        "ok, or why the profiling pass wrote no layer rows (not applicable: ..., failed: ...)")
    layer_profile_overhead: float | None = column(
        "profiling pass time per iteration / measured time per iteration - 1 (the hooks' slowdown)")
    layer_profile_energy_j: float | None = column(
        "GPU energy measured over the profiling pass; its layers rows' energy_j sum to it")


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


@dataclass(frozen=True)
class Fidelity(Part):
    """The outputs against the reference precision's (a separate pass once per loaded model,
    after the group's first measured trial)."""

    fidelity_reference: str | None = column(
        "precision this trial's outputs were compared with (the same model, options and seed), as "
        "backend/precision when the reference runs on a named backend")
    fidelity_reference_source: str | None = column(
        "where this group's reference outputs came from: computed (the group loaded the reference "
        "precision itself, before its own model) | node cache (read from the node's cache: written by the "
        "reference's own group of this sweep right after its load, or by an earlier group or sweep); null "
        "for the reference itself")
    fidelity_method: str | None = column(
        "full (KL over the whole vocabulary: both backends return full distributions) | topK (KL "
        "estimated over the reference's top K tokens and one bucket for the rest, vLLM; docs/METHOD.md); "
        "null unless fidelity_status is ok")
    fidelity_kl: float | None = column(
        "mean over prompts and positions of KL(reference || this) of next-token distributions (nats, "
        "float64), teacher-forced on the reference's greedy continuation; on synthetic models numerical "
        "deviation, not quality; null unless fidelity_status is ok")
    fidelity_top1: float | None = column(
        "share of those positions where this trial's top-1 next token equals the reference's")
    fidelity_status: str | None = column(
        "ok | reference (this is the reference precision) | not applicable: ... (the backend cannot "
        "score) | failed: ... (the trial's status stays ok: its headline numbers stand)")


@dataclass(frozen=True)
class Perplexity(Part):
    """Perplexity on a public text (with the fidelity pass, when the sweep asks for it)."""

    perplexity: float | None = column(
        "perplexity on the bundled public-domain text (actors/quality/corpus.py), teacher-forced; real "
        "checkpoints only")
    perplexity_tokens: int | None = column("tokens scored for perplexity")
    perplexity_status: str | None = column(
        "ok | not applicable: ... (synthetic model, no tokenizer) | failed: ...; null: not asked for")


@dataclass(frozen=True)
class Environment(Part):
    """Where the trial ran: the device, the held GPUs, the software and the node."""

    device: str | None = column("cuda | cpu")
    device_name: str | None = column("GPU (or CPU) model name")
    gpu_uuids: str | None = column("UUIDs of the GPUs the trial held, comma-separated")
    gpu_names: str | None = column("names of the GPUs the trial held, comma-separated")
    gpu_power_limit_w: float | None = column("sum of the held GPUs' power limits")
    driver_version: str | None = column("NVIDIA driver version")
    cuda_version: str | None = column("CUDA version torch was built with")
    torch_version: str | None = column("torch version on the worker")
    transformers_version: str | None = column("transformers version on the worker")
    accelerate_version: str | None = column("accelerate version on the worker")
    bitsandbytes_version: str | None = column("bitsandbytes version on the worker")
    vllm_version: str | None = column("vllm version on the worker")
    ray_version: str | None = column("ray version on the worker")
    python_version: str | None = column("Python version on the worker")
    sweeper_version: str | None = column("sweeper version on the worker")
    hostname: str | None = column("worker host name")
    ray_node_id: str | None = column("Ray node id of the worker")
    ray_gpu_ids: str | None = column(
        "GPU ids Ray assigned the trial's actor on its node (ray.get_gpu_ids()), comma-separated; null: "
        "none")
    energy_unmetered_reason: str | None = column(
        "why every energy column is null (no GPU; an external server whose GPUs the sweep does not "
        "locate); null where energy was metered")


# The parts an actor measures, in the trials table's order (after the trial's configuration).
@dataclass(frozen=True)
class TrialResult:
    """One trial's result as its actor (or, for a trial that never ran, the driver) sends it."""

    outcome: Outcome
    setup: Setup = Setup()
    compile: Compile = Compile()
    throughput: Throughput = Throughput()
    lengths: Lengths = Lengths()
    latency: Latency = Latency()
    serving_run: ServingRun = ServingRun()
    steady_state: SteadyState = SteadyState()
    client: ClientTimeliness = ClientTimeliness()
    prefix_cache: PrefixCacheUse = PrefixCacheUse()
    conversations: Conversations = Conversations()
    speculation: Speculation = Speculation()
    memory: Memory = Memory()
    energy: Energy = Energy()
    baseline: Baseline = Baseline()
    phases: PhaseEnergy = PhaseEnergy()
    request_energy: PerRequestEnergy = PerRequestEnergy()
    run_energy: RunEnergy = RunEnergy()
    host_energy: HostEnergy = HostEnergy()
    occupancy: Occupancy = Occupancy()
    intervals: Intervals = Intervals()
    noise: IterationNoise = IterationNoise()
    stability: Stability = Stability()
    layer_pass: LayerPass = LayerPass()
    roofline: Roofline = Roofline()
    fidelity: Fidelity = Fidelity()
    perplexity: Perplexity = Perplexity()
    environment: Environment = Environment()

    @staticmethod
    def part_types() -> tuple[type[Part], ...]:
        return tuple(_PART_TYPES.values())

    def row(self) -> dict[str, Any]:
        """The trials row's result columns: every part's, flattened (null where not set)."""
        return {name: value for f in fields(self) for name, value in getattr(self, f.name).items()}

    @classmethod
    def of(cls, outcome: Outcome, *parts: Part | None) -> TrialResult:
        """The result of ``outcome`` and its producers' parts, each under the field of its type
        (a part not given, or None, stays empty). A type given twice is a ``RowError``: every
        figure is computed, and sent, once."""
        by_field: dict[str, Part] = {}
        fields_of = _fields_by_type()
        for part in parts:
            if part is None:
                continue
            name = fields_of.get(type(part))
            if name is None:
                raise RowError(f"trials: {type(part).__name__} is not a part of a trial's result")
            if name in by_field:
                raise RowError(f"trials: {type(part).__name__} given twice")
            by_field[name] = part
        return cls(outcome, **by_field)  # type: ignore[arg-type]  # each part under its own field

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> TrialResult:
        """The result from a flat row (one that a producer built by name): each column to the
        part that declares it; a name no part declares is a ``RowError`` naming it."""
        by_part: dict[str, dict[str, Any]] = {}
        owners = _owners()
        unknown = sorted(set(row) - owners.keys())
        if unknown:
            raise RowError(f"trials: column(s) the schema does not know: {', '.join(unknown)}")
        for name, value in row.items():
            by_part.setdefault(owners[name], {})[name] = value
        parts = {attr: _PART_TYPES[attr].of(values) for attr, values in by_part.items()}
        if "outcome" not in parts:
            raise RowError("trials: a result needs its outcome (status)")
        return cls(**parts)  # type: ignore[arg-type]  # each part under its own field

    def replace(self, **parts: Part) -> TrialResult:
        from dataclasses import replace

        return replace(self, **parts)  # type: ignore[arg-type]


_PART_TYPES: dict[str, type[Part]] = {
    f.name: typing.get_type_hints(TrialResult)[f.name] for f in fields(TrialResult)
}


@cache
def _fields_by_type() -> dict[type[Part], str]:
    return {part: attr for attr, part in _PART_TYPES.items()}


@cache
def _owners() -> dict[str, str]:
    """Which of TrialResult's fields declares each column."""
    return {name: attr for attr, part in _PART_TYPES.items() for name in part.names()}
