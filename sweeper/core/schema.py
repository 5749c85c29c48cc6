"""The result tables' schemas: one place, units in every name, documented.

Shards are cast to these schemas when written, so every shard of a kind has the
same columns and types, and ``docs/SCHEMA.md`` is generated from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from sweeper.core.status import Reason, Status


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    doc: str


def _c(name: str, type_: pa.DataType, doc: str) -> Column:
    return Column(name, type_, doc)


S, I, F, B = pa.string(), pa.int64(), pa.float64(), pa.bool_()  # noqa: E741 - short type aliases keep the table readable
TS = pa.timestamp("us", tz="UTC")
FL, IL = pa.list_(F), pa.list_(I)  # per-GPU figures, one element per GPU

_IDENTITY: tuple[Column, ...] = (
    _c("trial_id", S, "content hash of the trial's configuration (stable across runs)"),
    _c("sweep", S, "sweep name"),
)

_ARROW = {str: S, int: I, float: F, bool: B}


def _axis_columns() -> tuple[Column, ...]:
    """The columns of the grid's axes, from the axis table (each axis declares its own)."""
    from sweeper.core.axes import AXES

    return tuple(_c(name, _ARROW[kind], doc) for axis in AXES for name, kind, doc in axis.column_schema())


_RESULT: tuple[Column, ...] = (
    # configuration beyond the axes
    _c("dataset", S, "prompt source: random (token ids of input_len), prefix_repetition (random token ids "
                     "after shared prefixes), bundled (sweeper's prompt set) or a prompt file as written in the "
                     "sweep file"),
    _c("prefix_len", I, "prefix_repetition: tokens of each shared prefix, the first of input_len (null: no "
                        "shared prefixes)"),
    _c("num_prefixes", I, "prefix_repetition: distinct prefixes the prompts share, dealt evenly"),
    _c("dataset_sha256", S, "the prompt file's content hash (null: random prompts)"),
    _c("min_input_len", I, "dataset prompts shorter than this (tokens) were left out"),
    _c("max_input_len", I, "dataset prompts longer than this (tokens) were left out"),
    _c("chat", B, "dataset prompts were wrapped in the model's chat template"),
    _c("conversations", B, "serving: the prompt file's records were replayed as multi-turn conversations "
                            "(num_prompts and request_rate count conversations; null: one prompt per record)"),
    _c("turn_gap_s", F, "conversations: seconds between a reply's end and the next turn's send"),
    _c("history", S, "conversations: earlier replies in each turn's prompt: model (what the model replied) | "
                     "reference (the file's replies)"),
    _c("output_lengths", S, "fixed (exactly output_len, EOS ignored) | natural (until EOS, at most output_len) | "
                            "reference (the dataset's reply length, EOS ignored, at most output_len)"),
    _c("seed", I, "prompt seed"),
    _c("warmup_iters", I, "unrecorded generate calls before measuring"),
    _c("warmup_s", F, "warm-up lasted at least this long (seconds)"),
    _c("min_iters", I, "measured generate calls, at least"),
    _c("min_duration_s", F, "measured window length, at least"),
    _c("idle_s", F, "idle-baseline window before the measured phase"),
    _c("sample_interval_s", F, "telemetry sampling interval"),
    _c("target_rel_ci", F, "the window measured until the 95 % interval of throughput (and, on GPUs, J/token) "
                           "was within this share of the mean; null: a fixed window of min_duration_s"),
    _c("max_duration_s", F, "with target_rel_ci, where the window ended regardless (null: 60 s, or no target)"),
    _c("idle_reuse_tolerance_w", F, "a later trial of a group kept the group's idle baseline when a 0.5 s re-check of the settled power read within this many W per GPU of it (null: a fresh baseline every trial)"),
    _c("idle_reuse_max_age_s", F, "idle baselines older than this were taken afresh"),
    _c("min_window_s", F, "windows (serving: steady windows) shorter than this are flagged unstable "
                          "(min_duration_s unless the sweep set it)"),
    _c("max_rel_ci", F, "a headline figure whose 95 % interval was wider than this share of its mean flagged "
                        "the trial unstable (target_rel_ci, when set, was the bound instead)"),
    _c("max_iteration_cv", F, "per-iteration throughput or energy CV above this raised noisy_host"),
    _c("layer_profile", S, "layer-profiling granularity (block | submodule | leaf); null: no profiling pass"),
    _c("fidelity", S, "fidelity-pass settings (reference precision, prompts), canonical JSON; null: no fidelity pass"),
    _c("mode", S, "offline (static batches of generate calls) | serving (requests arriving at request_rate, "
                  "batched by the engine); null: a row from before serving mode (offline)"),
    _c("arrival", S, "serving: arrival process of the requests (poisson | gamma | constant)"),
    _c("burstiness", F, "serving: the gamma arrival process's shape (1 = Poisson)"),
    _c("num_prompts", I, "serving: requests per run (null: as many as arrive within arrivals_duration_s); "
                         "offline with a dataset: the prompts sampled from it (null: all)"),
    _c("arrivals_duration_s", F, "serving: requests arrive for at most this long"),
    _c("slo_ttft_s", F, "serving: SLO bound on time to first token (goodput counts requests meeting every bound)"),
    _c("slo_tpot_s", F, "serving: SLO bound on time per output token"),
    _c("slo_e2e_s", F, "serving: SLO bound on end-to-end latency"),
    # outcome
    _c("status", S, " | ".join(Status)),
    _c("reason", S, "machine-readable cause for failed/skipped (null when ok): "
                    + " | ".join(Reason) + " (sweeper.core.status.Reason says when each is used)"),
    _c("error", S, "error text for failed/skipped trials"),
    _c("started_at", TS, "trial start (UTC)"),
    _c("finished_at", TS, "trial end (UTC)"),
    # timing
    _c("n_iterations", I, "measured generate calls (offline; null in serving mode)"),
    _c("n_requests", I, "measured requests (sequences): offline n_iterations x batch_size; serving: the run's requests"),
    _c("duration_s", F, "measured window, device-synchronized at both ends; serving: the steady-state window "
                        "(docs/METHOD.md)"),
    _c("output_tokens", I, "generated tokens in the measured window (the tokens actually produced: per-token "
                           "figures divide by these)"),
    _c("input_len_mean", F, "mean prompt tokens of the measured requests (dataset prompts, natural/reference "
                            "lengths; null for random prompts of one length and exact outputs)"),
    _c("output_len_mean", F, "mean reply tokens of the measured requests (null where every reply is output_len)"),
    _c("output_len_p50", F, "median reply tokens"),
    _c("output_len_p90", F, "90th percentile reply tokens"),
    _c("prompt_pad_share", F, "offline, varied prompts: share of the batches' prompt slots that were padding "
                              "(each prompt padded to its batch's longest); null where the engine batches continuously "
                              "inside a call (vLLM: no padding, early finishers leave)"),
    _c("decode_idle_slot_share", F, "offline, varied replies: share of decode slots (sequences x steps until the "
                                    "batch's longest reply ended) held by sequences already done: what early "
                                    "finishers cost a static batch; null for vLLM, as above"),
    _c("throughput_tok_s", F, "output_tokens / duration_s"),
    _c("requests_per_s", F, "offline: n_requests / duration_s; serving: achieved_rate_req_s"),
    _c("ttft_s", F, "mean time to first generated token (prefill; serving: from submission, queueing included)"),
    _c("ttft_p50_s", F, "median time to first token"),
    _c("ttft_p90_s", F, "90th percentile time to first token"),
    _c("ttft_p99_s", F, "99th percentile time to first token"),
    _c("tpot_s", F, "mean time per output token after the first: (e2e - ttft) / (n - 1)"),
    _c("tpot_p50_s", F, "median time per output token"),
    _c("tpot_p90_s", F, "90th percentile time per output token"),
    _c("tpot_p99_s", F, "99th percentile time per output token"),
    _c("e2e_s", F, "mean end-to-end request latency"),
    _c("e2e_p50_s", F, "median end-to-end request latency"),
    _c("e2e_p90_s", F, "90th percentile end-to-end request latency"),
    _c("e2e_p99_s", F, "99th percentile end-to-end request latency"),
    # serving mode (null offline)
    _c("itl_s", F, "serving: mean inter-token latency, pooled over every gap of every request"),
    _c("itl_p50_s", F, "serving: median inter-token latency"),
    _c("itl_p90_s", F, "serving: 90th percentile inter-token latency"),
    _c("itl_p99_s", F, "serving: 99th percentile inter-token latency"),
    _c("queue_s", F, "serving: mean time a request waited in the engine before it was scheduled (null where the engine does not say)"),
    _c("n_failed_requests", I, "serving: requests that errored or did not finish within the run's time limit"),
    _c("offered_rate_req_s", F, "serving: requests / the span of their sends, the realised arrival rate (conversations: follow-up turns included; inf: all at once)"),
    _c("achieved_rate_req_s", F, "serving: requests completed per second in the steady window: its output "
                                 "tokens / duration_s / the mean output tokens of a request"),
    _c("total_throughput_tok_s", F, "serving: (output tokens + prompt tokens of requests whose first token came) "
                                    "in the steady window / its duration"),
    _c("run_duration_s", F, "serving: the whole run, from its start (arrival time 0) to the last request's end"),
    _c("window_start_s", F, "serving: steady window start, seconds from the run's start"),
    _c("window_end_s", F, "serving: steady window end, seconds from the run's start"),
    _c("steady_batch", F, "serving: the steady level of requests running in the engine, which defines the window"),
    _c("mean_running_batch", F, "serving: time-weighted mean of requests running in the engine over the window"),
    _c("max_concurrency_reached", I, "serving: most requests in flight (submitted, not finished) at once"),
    _c("saturated", B, "serving: the engine did not keep up with the offered rate: while requests arrived in the "
                       "steady window, requests outstanding trended up by more than 3 standard errors (the count's "
                       "spread about its least-squares line over its independent stretches) and at least 5 % of "
                       "the offered rate, or the window's completions fell below the 95 % Poisson interval of the "
                       "arrivals offered over it and more than 10 % short; with every request sent at once: "
                       "requests waited behind a full engine as the window opened"),
    _c("saturation_reason", S, "serving: the figures behind saturated (the trend in req/s with its standard error, "
                               "or the completions against the Poisson interval)"),
    _c("prefix_cache_hit_rate", F, "serving: of the completed requests' prompt tokens, the share the engine took "
                                    "from its prefix cache (requests.parquet cached_tokens over input_len, over the "
                                    "requests whose engine reported it); null where none did"),
    _c("request_prefill_share", F, "serving: of the completed requests' energy (requests.parquet energy_j), the "
                                    "share spent in their prefills (prefill_energy_j): what prompts cost against "
                                    "replies, by the token-share split; null where unmetered"),
    _c("n_conversations", I, "conversations: conversations started (their first turns, by the arrival process)"),
    _c("conversations_completed", I, "conversations: conversations whose every turn completed"),
    _c("turns_per_conversation", F, "conversations: user turns per conversation, mean over those started"),
    _c("energy_per_conversation_j", F, "conversations: energy of a completed conversation (the sum of its turns' "
                                       "requests.parquet energy_j), mean"),
    _c("first_turn_energy_j", F, "conversations: energy of a completed first turn (requests.parquet energy_j), mean"),
    _c("last_turn_energy_j", F, "conversations: energy of a completed conversation's last turn, the one with the "
                                "longest history, mean"),
    _c("first_turn_ttft_s", F, "conversations: TTFT of a completed first turn, mean"),
    _c("last_turn_ttft_s", F, "conversations: TTFT of a completed conversation's last turn, mean"),
    _c("conversation_s", F, "conversations: from a completed conversation's first send to its last reply's end "
                            "(replies, turn gaps and sends), mean"),
    _c("spec_drafts", F, "speculative decoding (vLLM, in-process or a server's /metrics): draft steps the engine ran "
                         "over the window (offline) or the run (serving), from its spec_decode counters; null "
                         "without speculation"),
    _c("spec_draft_tokens", F, "speculative decoding: tokens the drafts proposed over the same span"),
    _c("spec_accepted_tokens", F, "speculative decoding: proposed tokens the model accepted over the same span"),
    _c("spec_acceptance_rate", F, "speculative decoding: spec_accepted_tokens / spec_draft_tokens; on a synthetic "
                                  "(random-weight) model it says nothing of real text"),
    _c("spec_tokens_per_step", F, "speculative decoding: tokens a draft step yields, 1 + spec_accepted_tokens / "
                                  "spec_drafts (its accepted drafts and the model's own token)"),
    _c("queue_growth", F, "serving: the rise of the least-squares line through requests outstanding (arrived, not "
                          "finished) across the arrivals in the steady window, in requests; 0 with none there"),
    _c("send_lateness_p50_s", F, "serving: median send lateness over the run's requests (requests.parquet "
                                 "send_lateness_s: sent less due; the client's delay, not the engine's)"),
    _c("send_lateness_p99_s", F, "serving: 99th percentile send lateness over the run's requests: what "
                                 "client_behind judges"),
    _c("send_lateness_max_s", F, "serving: the latest any request of the run was sent"),
    _c("steady_send_lateness_p50_s", F, "serving: median send lateness of the requests due inside the steady window"),
    _c("steady_send_lateness_p99_s", F, "serving: 99th percentile send lateness of the requests due inside the "
                                        "steady window"),
    _c("steady_send_lateness_max_s", F, "serving: the latest a request due inside the steady window was sent "
                                        "(never past send_lateness_bound_s: the window leaves out every stretch "
                                        "where the client was behind)"),
    _c("send_lateness_bound_s", F, "serving: the bound send_lateness_p99_s is held to: the larger of 5 ms and "
                                   "10 % of ttft_p50_s (docs/METHOD.md)"),
    _c("client_behind", B, "serving: the client fell behind its own schedule: send_lateness_p99_s above "
                           "send_lateness_bound_s (its latencies then hold its own delay; the trial is unstable)"),
    _c("client_processes", I, "serving: processes the client sent the requests from (server backend: "
                               "backend_options.server.client_processes, 'auto' resolved for the run; 1 for "
                               "in-process engines)"),
    _c("client_behind_reason", S, "serving: the figures behind client_behind (the p99 and max lateness, the bound, "
                                  "TTFT p50, the steady window left out)"),
    _c("server_engine", S, "server backend: the server measured (vllm | sglang | transformers: launched by "
                           "sweeper; a command's program; an external server's base_url); null for in-process backends"),
    _c("server_version", S, "server backend: the engine's version as the server reports it (vLLM: GET /version), "
                            "else the installed engine's"),
    _c("server_command", S, "server backend: the command line sweeper launched the server with (null: base_url)"),
    _c("server_url", S, "server backend: the OpenAI-compatible base URL requests went to"),
    _c("server_log", S, "server backend: the launched server's log file, on the node that ran it"),
    _c("server_ready_s", F, "server backend: seconds from the launch until the server first answered GET /v1/models "
                            "(part of load_s)"),
    _c("gpu_processes", S, "the compute processes NVML saw on the metered GPUs at the measured window's start "
                           "and end (pid name, ...)"),
    _c("energy_exclusive", B, "every process on the metered GPUs at the window's start and end was the trial's "
                              "own (the actor's process or one it started: engine workers, a launched server), "
                              "so the energy is the trial's alone; false: another process used its GPUs; null: "
                              "not known (an external server, whose processes sweeper cannot tell, no GPU, or a "
                              "process whose parent could not be read)"),
    _c("energy_unmetered_reason", S, "why every energy column is null (no GPU; an external server whose GPUs the "
                                     "sweep does not locate); null where energy was metered"),
    _c("goodput_req_s", F, "serving: requests meeting every SLO bound / run_duration_s (vLLM's definition); null without an slo"),
    _c("slo_attainment", F, "serving: share of the run's requests meeting every SLO bound"),
    _c("load_s", F, "model load time of the trial's group (shared by its trials, not in duration_s)"),
    _c("compile_s", F, "one-time compilation for the trial's shape (torch.compile of the decode step, CUDA-graph capture): what the first generate calls took beyond as many steady-state calls, outside duration_s; a shape an earlier trial on the same actor compiled repeats that value; null: nothing compiled for the trial"),
    _c("compile_status", S, "compiled (with notes: graph breaks, skipped CUDA graphs) | eager (not requested) | fallback: why the trial ran eager instead; null: the backend has no compiled path"),
    # memory
    _c("peak_memory_bytes", I, "peak memory during the trial (transformers on CUDA: torch max_memory_allocated; vllm: NVML memory used on the trial's GPUs, i.e. what the engine reserves; CPU: the actor process's resident peak (VmHWM) since the trial's reset, null where the kernel cannot reset it)"),
    _c("weight_memory_bytes", I, "model footprint after loading and quantizing: parameters, buffers and quantization state (int8 row scales, 4-bit absmax)"),
    # energy (null on CPU-only runs)
    _c("energy_j", F, "GPU energy over the measured window, all GPUs the trial holds"),
    _c("energy_per_token_j", F, "energy_j / output_tokens"),
    _c("energy_per_request_j", F, "offline: energy_j / n_requests; serving: mean of the completed requests' "
                                  "attributed energies (requests.parquet energy_j, request_energy_method)"),
    _c("energy_per_request_p50_j", F, "median attributed energy of a completed request (energy per response; "
                                      "serving, and offline with varied prompts or replies)"),
    _c("energy_per_request_p90_j", F, "90th percentile attributed energy of a completed request"),
    _c("request_energy_method", S, "how the energy was split over requests (token_share: serving, each instant's "
                                   "energy over the requests then in flight; offline, each generate call's energy "
                                   "over its sequences; by the tokens each processes; docs/METHOD.md)"),
    _c("attributed_energy_j", F, "serving: sum of the requests' attributed energies (= run_energy_j, up to rounding)"),
    _c("run_energy_j", F, "serving: GPU energy over the whole run (ramp-up and drain included)"),
    _c("run_energy_uncertainty_j", F, "serving: bound on the boundary error of run_energy_j"),
    _c("avg_power_w", F, "energy_j / duration_s"),
    _c("peak_power_w", F, "highest per-sample power (summed over the trial's GPUs) in the window; each sample is NVML's instantaneous power field where the driver has one (the mean of its ~100 ms update period), else nvmlDeviceGetPowerUsage (a 1 s trailing mean): one reading can set it, and a sub-second transient may exceed the power limit"),
    _c("p99_power_w", F, "99th percentile of the same per-sample power: what a few readings cannot dominate"),
    # per GPU: list columns in the order of gpu_uuids (docs/SCHEMA.md says why lists)
    _c("gpu_energy_j", FL, "per GPU of gpu_uuids: its own counter's energy over the window's boundaries; they sum "
                           "to energy_j"),
    _c("gpu_avg_power_w", FL, "per GPU: gpu_energy_j / duration_s"),
    _c("gpu_peak_power_w", FL, "per GPU: its highest sampled power reading in the window (as peak_power_w, one GPU)"),
    _c("gpu_peak_memory_bytes", IL, "per GPU: the highest device memory in use NVML read in the window (every "
                                    "process on the GPU; the sampler's slow fields, every few samples)"),
    _c("gpu_idle_power_w", FL, "per GPU: its mean power over the idle-baseline window; they sum to idle_power_w"),
    _c("idle_power_w", F, "mean power over the idle-baseline window, summed over the trial's GPUs: taken after the warm-up, with the model loaded and the power settled (idle_settle_s); what active_energy_j subtracts"),
    _c("idle_settle_s", F, "seconds the power took to stop falling after the warm-up, before the baseline window began (at most 10; longer is flagged unstable); null: no baseline, or a row from a version that did not settle"),
    _c("idle_baseline_reused", B, "idle_power_w is the group's baseline, taken for an earlier trial and re-checked for this one (idle_recheck_power_w within idle_reuse_tolerance_w of it); false: taken for this trial; null: no baseline"),
    _c("idle_baseline_age_s", F, "seconds from the baseline's start to this trial's (0 when taken for this trial)"),
    _c("idle_recheck_power_w", F, "the settled power a 0.5 s re-check read before deciding whether the group's baseline stands (sampled power, summed over GPUs); null: the trial had no baseline to re-check"),
    _c("pre_load_idle_power_w", F, "the same GPUs' settled idle power before the group's model loaded (no context of ours on them): the untouched GPU, for comparison with idle_power_w"),
    _c("active_energy_j", F, "energy_j - idle_power_w x duration_s"),
    _c("prefill_energy_j", F, "energy attributed to prefill (timeline over phase marks)"),
    _c("decode_energy_j", F, "energy attributed to decode"),
    _c("decode_energy_per_token_j", F, "decode_energy_j / decode tokens"),
    _c("between_phases_energy_j", F, "energy in the window outside every prefill and decode mark (the host's time between generate calls), on the same curve: prefill + decode + this equals energy_j within energy_uncertainty_j"),
    _c("energy_method", S, "nvml_counter_interpolated | nvml_counter | power_integral"),
    _c("energy_uncertainty_j", F, "bound on the window-boundary error of energy_j"),
    _c("energy_per_token_uncertainty_j", F, "energy_uncertainty_j / output_tokens"),
    _c("iteration_energy_cv", F, "coefficient of variation of energy per iteration over blocks of >= 1 s of iterations (null with fewer than two blocks)"),
    _c("iteration_throughput_cv", F, "coefficient of variation of output tokens/s across the window's generate calls (null with fewer than 3); CPU runs too"),
    _c("cpu_energy_j", F, "CPU package energy (RAPL) over the window, null when unreadable"),
    _c("dram_energy_j", F, "DRAM energy (RAPL) over the window, null when unreadable"),
    _c("throughput_rel_ci95", F, "half-width of the 95 % confidence interval of the window's throughput over "
                                 "blocks of >= 1 s (Student's t, blocks as independent samples), as a share of "
                                 "the mean; null with fewer than 3 blocks or in serving mode"),
    _c("energy_per_token_rel_ci95", F, "the same for J/token over the same blocks (GPUs only)"),
    _c("ci_blocks", I, "blocks of >= 1 s the intervals were computed over"),
    _c("target_met", B, "with target_rel_ci: every headline interval over the whole window is within it "
                        "(false: max_duration_s came first, or the last blocks widened an interval the stop "
                        "judged on settled blocks; the trial is then flagged unstable); null: no target"),
    _c("unstable", B, "the reported figures are imprecise or biased (see unstable_reason): a headline 95 % "
                      "interval wider than max_rel_ci (or a missed target_rel_ci), a window too short to judge, "
                      "no energy window on GPUs, an idle baseline taken before the power settled; serving: no "
                      "or a short steady window, saturation, failed requests, a client behind its schedule "
                      "(client_behind)"),
    _c("unstable_reason", S, "why the trial is flagged unstable, every reason with its numbers"),
    _c("noisy_host", B, "the host's per-iteration noise was above max_iteration_cv although the estimate may "
                        "be tight: information about the machine, not a verdict on the figures (repeats judge "
                        "run-to-run noise); null: not judged (serving, varied prompts or replies)"),
    _c("noisy_host_reason", S, "which per-iteration CV exceeded max_iteration_cv, with its value"),
    # layer profiling (a separate pass after the measured window; rows in layers.parquet)
    _c("layer_profile_status", S, "ok, or why the profiling pass wrote no layer rows (not applicable: ..., failed: ...)"),
    _c("layer_profile_overhead", F, "profiling pass time per iteration / measured time per iteration - 1 (the hooks' slowdown)"),
    _c("layer_profile_energy_j", F, "GPU energy measured over the profiling pass; its layers rows' energy_j sum to it"),
    # roofline (analytic, from the architecture: sweeper/core/roofline.py, docs/METHOD.md "Roofline: MFU and MBU";
    # all null for an architecture without formulas; mfu, mbu and the peaks null where a held GPU is unknown or on CPU)
    _c("flops_per_token", F, "analytic forward FLOPs of one request (prefill of the prompt + every decode step, "
                             "causal attention; multiply-add = 2) / output_len: the window's FLOPs per generated token"),
    _c("weight_bytes_per_token", F, "weight bytes one decode step reads (matmul weights at their stored size, lm_head, "
                                    "biases, norms, the batch's embedding rows) / batch_size"),
    _c("kv_bytes_per_token", F, "K and V bytes one sequence reads per decode step, mean over its output_len - 1 "
                                "decode steps (context input_len + j at step j)"),
    _c("mfu", F, "model FLOPs utilisation: flops_per_token x throughput_tok_s / gpu_peak_flop_per_s "
                 "(= the window's FLOPs / duration_s / peak)"),
    _c("mbu", F, "memory bandwidth utilisation of decode: (weight_bytes_per_token + kv_bytes_per_token) x batch_size "
                 "/ tpot_s / gpu_peak_bandwidth_bytes_per_s"),
    _c("gpu_peak_flop_per_s", F, "datasheet peak dense FLOP/s (no sparsity) of the held GPUs at the precision's "
                                 "compute format (fp32: non-tensor), summed"),
    _c("gpu_peak_bandwidth_bytes_per_s", F, "datasheet peak memory bandwidth of the held GPUs, summed"),
    # fidelity (a separate pass once per loaded model, after the group's first measured trial)
    _c("fidelity_reference", S, "precision this trial's outputs were compared with (the same model, options and "
                                "seed), as backend/precision when the reference runs on a named backend"),
    _c("fidelity_reference_source", S, "where this group's reference outputs came from: computed (the group loaded "
                                       "the reference precision itself, before its own model) | node cache (read "
                                       "from the node's cache: written by the reference's own group of this sweep "
                                       "right after its load, or by an earlier group or sweep); null for the "
                                       "reference itself"),
    _c("fidelity_method", S, "full (KL over the whole vocabulary: both backends return full distributions) | topK "
                             "(KL estimated over the reference's top K tokens and one bucket for the rest, vLLM; "
                             "docs/METHOD.md); null unless fidelity_status is ok"),
    _c("fidelity_kl", F, "mean over prompts and positions of KL(reference || this) of next-token distributions "
                         "(nats, float64), teacher-forced on the reference's greedy continuation; on synthetic "
                         "models numerical deviation, not quality; null unless fidelity_status is ok"),
    _c("fidelity_top1", F, "share of those positions where this trial's top-1 next token equals the reference's"),
    _c("fidelity_status", S, "ok | reference (this is the reference precision) | not applicable: ... (the backend "
                             "cannot score) | failed: ... (the trial's status stays ok: its headline numbers stand)"),
    _c("perplexity", F, "perplexity on the bundled public-domain text (actors/quality/corpus.py), teacher-forced; real checkpoints only"),
    _c("perplexity_tokens", I, "tokens scored for perplexity"),
    _c("perplexity_status", S, "ok | not applicable: ... (synthetic model, no tokenizer) | failed: ...; null: not asked for"),
    # environment
    _c("device", S, "cuda | cpu"),
    _c("device_name", S, "GPU (or CPU) model name"),
    _c("gpu_uuids", S, "UUIDs of the GPUs the trial held, comma-separated"),
    _c("gpu_names", S, "names of the GPUs the trial held, comma-separated"),
    _c("gpu_power_limit_w", F, "sum of the held GPUs' power limits"),
    _c("driver_version", S, "NVIDIA driver version"),
    _c("cuda_version", S, "CUDA version torch was built with"),
    _c("torch_version", S, "torch version on the worker"),
    _c("transformers_version", S, "transformers version on the worker"),
    _c("accelerate_version", S, "accelerate version on the worker"),
    _c("bitsandbytes_version", S, "bitsandbytes version on the worker"),
    _c("vllm_version", S, "vllm version on the worker"),
    _c("ray_version", S, "ray version on the worker"),
    _c("python_version", S, "Python version on the worker"),
    _c("sweeper_version", S, "sweeper version on the worker"),
    _c("hostname", S, "worker host name"),
    _c("ray_node_id", S, "Ray node id of the worker"),
    _c("ray_gpu_ids", S, "GPU ids Ray assigned the trial's actor on its node (ray.get_gpu_ids()), comma-separated; null: none"),
)

REQUESTS: tuple[Column, ...] = (
    _c("trial_id", S, "trial the request belongs to"),
    _c("iteration", I, "measured generate call (0-based); null in serving mode"),
    _c("request_index", I, "sequence index within the batch; serving: the request's number in arrival order "
                           "(conversations: numbered by conversation, then turn)"),
    _c("conversation_id", I, "conversations: the conversation the request is a turn of (0-based, in the order "
                             "the conversations arrived); null outside conversations"),
    _c("turn", I, "conversations: the request's turn in its conversation (0-based); its prompt holds every "
                  "earlier turn and reply"),
    _c("input_len", I, "prompt tokens"),
    _c("output_tokens", I, "generated tokens"),
    _c("t_start_s", F, "request start, seconds from the start of the measured window; serving: when the client "
                       "sent it (arrival_s + send_lateness_s, later still when max_concurrency held it back)"),
    _c("ttft_s", F, "time to first generated token"),
    _c("tpot_s", F, "time per output token after the first"),
    _c("e2e_s", F, "end-to-end latency"),
    # serving mode: times in seconds from the run's start
    _c("arrival_s", F, "serving: when the request arrived (its place in the arrival process)"),
    _c("send_lateness_s", F, "serving: how late the client sent it: t_start_s less when it was due (arrival_s, or "
                             "the moment a slot came free where max_concurrency held it back); the client's own "
                             "delay, never the engine's (null: never sent)"),
    _c("cached_tokens", I, "serving: of its prompt tokens, those the engine took from its prefix cache (vLLM's "
                           "num_cached_tokens; a server's usage.prompt_tokens_details.cached_tokens); null where "
                           "the engine does not say"),
    _c("scheduled_s", F, "serving: when the engine first scheduled it (null where the engine does not say)"),
    _c("first_token_s", F, "serving: when its first token reached the client"),
    _c("finish_s", F, "serving: when its last token reached the client"),
    _c("queue_s", F, "serving: scheduled_s - t_start_s, time queued inside the engine"),
    _c("itl_s", pa.list_(F), "serving: the gaps between its consecutive tokens (0 for tokens delivered together)"),
    _c("in_window", B, "serving: it finished inside the trial's steady window"),
    _c("meets_slo", B, "serving: it met every SLO bound (null without an slo)"),
    _c("energy_j", F, "its share of the GPU energy (the trial's request_energy_method): a serving run's "
                      "requests sum to its run_energy_j, an offline window's to its energy_j; null where "
                      "not attributed (random prompts of one shape offline: energy_per_request_j says it)"),
    _c("prefill_energy_j", F, "serving: of energy_j, the part spent in the request's prefill (from its scheduling to "
                              "its first token, by token share: the prompt tokens the engine computed against the "
                              "tokens others processed beside it)"),
    _c("error", S, "serving: why the request failed or did not finish; null if it completed"),
)

TIMELINE: tuple[Column, ...] = (
    _c("trial_id", S, "trial the sample belongs to"),
    _c("t_s", F, "seconds from the start of the measured window (negative: idle baseline)"),
    _c("gpu_index", I, "NVML (physical) index of the GPU"),
    _c("gpu_uuid", S, "GPU UUID"),
    _c("power_w", F, "instantaneous power"),
    _c("energy_mj", F, "NVML total-energy counter (raw, mJ since driver load)"),
    _c("util_gpu_pct", F, "GPU utilisation"),
    _c("memory_used_bytes", I, "device memory used (whole GPU)"),
    _c("sm_clock_mhz", F, "SM clock"),
    _c("temperature_c", F, "GPU temperature"),
    _c("phase", S, "offline: prefill | decode when the sample falls in a generate call's phase, else null; "
                   "serving: ramp | steady | drain (the run's steady-state window and either side)"),
)

LAYERS: tuple[Column, ...] = (
    _c("trial_id", S, "trial the profiling pass belongs to"),
    _c("module", S, "qualified module name in the model (e.g. model.layers.3.self_attn; the root model: '')"),
    _c("module_type", S, "role: decoder_block | attention | mlp | norm | embedding | rotary_embedding | "
                         "final_norm | lm_head | other (leaf modules: the role of the unit they sit in); "
                         "<role>_rest (decoder_block_rest, model_rest, ...): what a module holding profiled "
                         "modules runs outside them (residual adds, mask set-up), so a phase's rows cover "
                         "the whole forward"),
    _c("layer_index", I, "decoder block index, null for modules outside the blocks"),
    _c("phase", S, "prefill (forwards over the prompt) | decode (one-token forwards)"),
    _c("calls", I, "forward calls of the module in this phase over the whole pass"),
    _c("gpu_time_s", F, "the module's time over the whole pass, as gpu_time_method says; on CUDA the summed "
                        "duration of the GPU kernels (and memcpy/memset) launched inside its forward, "
                        "idle gaps between them excluded"),
    _c("gpu_time_method", S, "cuda_kernel_time (torch.profiler/CUPTI kernel durations, the CUDA default) | "
                             "host_clock (CPU runs: synchronous there) | cpu_op_time (the profiler's CPU op "
                             "durations, a kernel-time pass run on a CPU)"),
    _c("time_share", F, "gpu_time_s / the phase's summed gpu_time_s over all its rows (rests included)"),
    _c("energy_j", F, "energy attributed to the module in this phase (null on CPU-only runs)"),
    _c("method", S, "energy attribution method: gpu_time_share_of_phase_energy | gpu_time_share_of_window_energy"),
)


STAGES: tuple[Column, ...] = (
    _c("trial_id", S, "trial the span is recorded with (a group's stages: with the first trial recorded after "
                      "its load)"),
    _c("stage", S, "actor_start | close | pre_load_idle | reference | materialize | load | engine_start | weights | "
                   "engine_compile | kv_cache | cuda_graphs | engine_warmup (scope group; the last six: a vLLM "
                   "engine's start, from its log) | compile | warmup | idle_baseline | measure | fidelity | layer_pass | harness "
                   "(scope trial); sweeper/core/stages.py says what each holds"),
    _c("scope", S, "group (once per loaded model) | trial"),
    _c("started_at", TS, "when the span began (the actor's clock, UTC)"),
    _c("duration_s", F, "the span's length; stages are timed exclusively (a stage nested in another pauses it), "
                        "so one slot's spans never overlap"),
    _c("node", S, "the node it ran on (host:ray-node-id prefix)"),
    _c("gpu_ids", S, "node-local GPU ids the actor held, comma-separated; null: a CPU-only node"),
)


def trials_columns() -> tuple[Column, ...]:
    """The trials table: identity, one column set per axis of the axis table, then results."""
    return _IDENTITY + _axis_columns() + _RESULT


TRIALS = trials_columns()  # as built in; ``columns("trials")`` also sees axes added since

TABLES: dict[str, tuple[Column, ...]] = {
    "trials": TRIALS,
    "requests": REQUESTS,
    "timeline": TIMELINE,
    "layers": LAYERS,
    "stages": STAGES,
}


def columns(kind: str) -> tuple[Column, ...]:
    return trials_columns() if kind == "trials" else TABLES[kind]


def arrow_schema(kind: str) -> pa.Schema:
    return pa.schema([pa.field(c.name, c.type) for c in columns(kind)])


def to_table(kind: str, rows: list[dict[str, Any]] | pa.Table) -> pa.Table:
    """Rows (or a table) as a table of exactly ``kind``'s schema.

    Missing columns become nulls; an unknown column is a programming error and
    raises, so the schema cannot drift silently.
    """
    schema = arrow_schema(kind)
    names = set(schema.names)
    if isinstance(rows, pa.Table):
        unknown = set(rows.column_names) - names
        if unknown:
            raise KeyError(f"{kind}: unknown columns {sorted(unknown)}")
        cols = [rows.column(f.name).cast(f.type) if f.name in rows.column_names
                else pa.nulls(rows.num_rows, f.type) for f in schema]
        return pa.Table.from_arrays(cols, schema=schema)
    for row in rows:
        unknown = set(row) - names
        if unknown:
            raise KeyError(f"{kind}: unknown columns {sorted(unknown)}")
    return pa.Table.from_pylist(rows, schema=schema)


class RowError(ValueError):
    """A row its table's schema cannot hold: the column, and why."""


def check_rows(kind: str, rows: list[dict[str, Any]]) -> None:
    """Raise ``RowError`` naming the first column of ``rows`` that ``kind``'s schema does not
    know, or whose values its type cannot hold. Actors check their rows with this before
    they leave the process, so a misspelled column (or a driver and worker of different
    versions) fails one trial, with the reason, instead of the driver's writer."""
    schema = arrow_schema(kind)
    names = {k for row in rows for k in row}
    unknown = sorted(names - set(schema.names))
    if unknown:
        raise RowError(f"{kind}: column(s) the schema does not know: {', '.join(unknown)}")
    for name in sorted(names):
        field = schema.field(name)
        try:
            pa.array([row.get(name) for row in rows], type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise RowError(f"{kind}.{name}: not a {field.type} ({exc})") from None


def schema_markdown() -> str:
    lines = []
    for kind, cols in TABLES.items():
        lines += [f"### `{kind}.parquet`", "", "| column | type | meaning |", "| --- | --- | --- |"]
        lines += [f"| `{c.name}` | {c.type} | {c.doc.replace('|', chr(92) + '|')} |" for c in cols]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m sweeper.core.schema > docs/SCHEMA.md
    print("# Result tables\n")
    print("Generated from `sweeper/core/schema.py` (`python -m sweeper.core.schema > docs/SCHEMA.md`); "
          "a test keeps the two in step. Units are in the column names: `_s` seconds, `_j` joules, "
          "`_w` watts, `_bytes` bytes, `_mj` millijoules, `_mhz` MHz, `_c` degrees Celsius, `_pct` per cent.\n")
    print("Per-GPU figures (`gpu_energy_j`, `gpu_avg_power_w`, `gpu_peak_power_w`, `gpu_peak_memory_bytes`, "
          "`gpu_idle_power_w`) are list columns of the trials table, one element per GPU in the order of "
          "`gpu_uuids`, not a child table: a trial holds the GPUs of one node (a handful), so its row stays "
          "whole and needs no join. In DuckDB, `list_sum(gpu_energy_j)` gives back `energy_j` and "
          "`unnest(gpu_energy_j)` one row per GPU; in pandas each cell is a list.\n")
    print(schema_markdown())
    from sweeper.core.budget import BUDGET_COLUMNS

    print("### Derived by the analysis (not stored)\n")
    print("`sweeper report`, `load_results` (the notebooks) and `sweeper query`'s `trials` view add these to "
          "the trials from the sweep file's `report` block (recorded in `plan.json`) or `sweeper report`'s flags.\n")
    print("| column | type | meaning |\n| --- | --- | --- |")
    for column in BUDGET_COLUMNS:
        print(f"| `{column.name}` | double | {column.doc} |")
