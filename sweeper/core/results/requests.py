"""One row of the requests table: a measured request, offline or served, as its actor records it.

Both producers make these (``actors.measure`` for a window's generate calls, one record per
sequence; ``actors.serving_measure`` for a serving run, one per request), each record whole
when it is made: its trial and its energy share included. The requests schema is generated
from this class (``sweeper.core.schema``), so a producer cannot write a column the table
lacks, nor the table hold one no producer knows.

A column only one mode has is None in the other (``iteration`` serving; the ``serving:``
columns offline). ``trial_id``, ``request_index`` and ``output_tokens`` every request has:
they are required here, while their Arrow columns stay nullable like every other, so that
shards written by any version concatenate.
"""

from __future__ import annotations

from dataclasses import dataclass

from sweeper.core.results.part import Part, column


@dataclass(frozen=True, kw_only=True)
class RequestRecord(Part):
    """A request's row: who it belongs to, its lengths and latencies, its timing in the run
    (serving), and its share of the energy."""

    trial_id: str = column("trial the request belongs to", required=True)
    iteration: int | None = column("measured generate call (0-based); null in serving mode")
    request_index: int = column(
        "sequence index within the batch; serving: the request's number in arrival order "
        "(conversations: numbered by conversation, then turn)", required=True)
    conversation_id: int | None = column(
        "conversations: the conversation the request is a turn of (0-based, in the order "
        "the conversations arrived); null outside conversations")
    turn: int | None = column(
        "conversations: the request's turn in its conversation (0-based); its prompt holds every "
        "earlier turn and reply")
    input_len: int | None = column("prompt tokens")
    output_tokens: int = column("generated tokens", required=True)
    t_start_s: float | None = column(
        "request start, seconds from the start of the measured window; serving: when the client "
        "sent it (arrival_s + send_lateness_s, later still when max_concurrency held it back)")
    ttft_s: float | None = column("time to first generated token")
    tpot_s: float | None = column("time per output token after the first")
    e2e_s: float | None = column("end-to-end latency")
    # Serving mode: times in seconds from the run's start.
    arrival_s: float | None = column("serving: when the request arrived (its place in the arrival process)")
    send_lateness_s: float | None = column(
        "serving: how late the client sent it: t_start_s less when it was due (arrival_s, or "
        "the moment a slot came free where max_concurrency held it back); the client's own "
        "delay, never the engine's (null: never sent)")
    cached_tokens: int | None = column(
        "serving: of its prompt tokens, those the engine took from its prefix cache (vLLM's "
        "num_cached_tokens; a server's usage.prompt_tokens_details.cached_tokens); null where "
        "the engine does not say")
    scheduled_s: float | None = column("serving: when the engine first scheduled it (null where the engine does not say)")
    first_token_s: float | None = column("serving: when its first token reached the client")
    finish_s: float | None = column("serving: when its last token reached the client")
    queue_s: float | None = column("serving: scheduled_s - t_start_s, time queued inside the engine")
    itl_s: list[float] | None = column(
        "serving: the gaps between its consecutive tokens (0 for tokens delivered together)")
    in_window: bool | None = column("serving: it finished inside the trial's steady window")
    meets_slo: bool | None = column("serving: it met every SLO bound (null without an slo)")
    energy_j: float | None = column(
        "its share of the GPU energy (the trial's request_energy_method): a serving run's "
        "requests sum to its run_energy_j, an offline window's to its energy_j; null where "
        "not attributed (random prompts of one shape offline: energy_per_request_j says it)")
    prefill_energy_j: float | None = column(
        "serving: of energy_j, the part spent in the request's prefill (from its scheduling, or "
        "where the engine does not say (an HTTP server) its sending, to its first token, by token share: the "
        "prompt tokens the engine computed against the tokens others processed beside it)")
    error: str | None = column("serving: why the request failed or did not finish; null if it completed")
    # Scored trials (the sweep file's scoring): the reply judged against its prompt's answer.
    correct: bool | None = column(
        "scored trials: the reply's answer is the prompt's reference answer (a reply cut by the output length: "
        "the answer it stated before the cut, as after '####' or 'the answer is', else false); null where "
        "unscored (no scoring, a failed request, a prompt without an answer)")
    extracted_answer: str | None = column(
        "scored trials: what the scoring method read from the reply as its answer (cut to 200 characters); "
        "null where it found none, or unscored")
    truncated: bool | None = column(
        "scored trials: the reply reached its output length (max_output_len) before the model ended it; "
        "null where unscored")
    reply: str | None = column(
        "scored trials: the reply as judged (its first 2,000 characters), so that a reader can check "
        "the verdict; null where unscored")
