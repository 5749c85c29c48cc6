"""A serving run under load (null offline): the run, its steady window, the client's
timeliness, the prefix cache, conversations."""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.results.part import Part, column


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
    conversations_completed: int | None = column(
        "conversations: conversations whose every turn completed (a conversation cut at the model's context: "
        "every turn kept; conversations_cut says how many were)")
    conversations_cut: int | None = column(
        "conversations: conversations of those started cut before the file's last turn, at the first whose "
        "history and reply would outgrow the model's context")
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
