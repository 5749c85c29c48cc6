"""What a served request and a serving run are, on the actor's monotonic clock."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# What a request that the run's time limit cut short records as its error.
NOT_SENT = "not sent: the run's time limit passed"
UNFINISHED = "unfinished: the run's time limit passed"


@dataclass(frozen=True)
class ServingRequest:
    """One request to send: its prompt, its output length (exact, or the cap of a reply that
    ends at EOS), and when it arrives (seconds after the run's start)."""

    index: int
    prompt_ids: np.ndarray  # (input_len,) token ids
    output_len: int  # exact; with stop_at_eos, the cap
    arrival_offset_s: float
    stop_at_eos: bool = False  # natural lengths: the reply ends where the model ends it
    text: str | None = None  # a dataset prompt's text before any chat template (chat endpoints)
    # A turn of a replayed conversation (actors.serving.conversations): which one, which turn
    # (0-based), the whole history as chat messages (role, text) for a chat endpoint, and
    # whether the client must keep the reply (a later turn's prompt holds it).
    conversation_id: int | None = None
    turn: int | None = None
    messages: tuple[tuple[str, str], ...] | None = None
    keeps_reply: bool = False

    @property
    def prompt_tokens(self) -> int:
        return int(self.prompt_ids.shape[0])


@dataclass(frozen=True)
class ServedRequest:
    """What happened to one request. Times are absolute (the actor's ``time.monotonic``).

    ``submit_s`` is when the client handed it to the engine; ``due_s`` when it should have
    (its arrival, or, when ``max_concurrency`` held it back, the moment a slot came free;
    None: its arrival), so that ``send_lateness_s`` is the client's own delay and never the
    cap's; ``scheduled_s`` when the engine first
    scheduled it (None where the engine does not say: its first token then stands in);
    ``token_times_s`` when each output token reached the client, the first being the
    first token. Several tokens may share a time when the engine delivered them together.
    ``cached_tokens``: of its prompt tokens, those the engine's prefix cache held.
    """

    index: int
    prompt_tokens: int
    arrival_s: float
    submit_s: float | None
    scheduled_s: float | None
    token_times_s: tuple[float, ...]
    finish_s: float | None
    error: str | None = None
    due_s: float | None = None
    # Prompt tokens the engine took from its prefix cache rather than computing them (None where
    # it does not say: an engine without a prefix cache, a server that does not report it).
    cached_tokens: int | None = None
    # The reply itself, kept only where the request asked (``ServingRequest.keeps_reply``): its
    # token ids (in-process engines) or its text (an HTTP server's stream).
    reply_ids: tuple[int, ...] | None = None
    reply_text: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.finish_s is not None and bool(self.token_times_s)

    @property
    def send_due_s(self) -> float:
        return self.due_s if self.due_s is not None else self.arrival_s

    @property
    def send_lateness_s(self) -> float | None:
        """How late the client sent it against when it was due (None: never sent). A client that
        keeps its schedule sends within its event loop's timer granularity (about 1 ms)."""
        return None if self.submit_s is None else self.submit_s - self.send_due_s

    @property
    def cut_by_time_limit(self) -> bool:
        return self.error in (NOT_SENT, UNFINISHED)

    @property
    def output_tokens(self) -> int:
        return len(self.token_times_s)

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def start_s(self) -> float | None:
        """When the engine began working on it: scheduled, else (not said) the first token."""
        return self.scheduled_s if self.scheduled_s is not None else self.first_token_s

    @property
    def prefill_start_s(self) -> float | None:
        """Where its prefill segment begins, for energy attribution: the engine's scheduling
        stamp, else (an HTTP server or an engine that does not say) its submission, since its
        prefill happened somewhere between being sent and its first token; where the server
        queued it, the queue's wait is then inside that segment. Not the first token: its prompt
        would be charged to its first decode interval (through ``vllm serve`` that gave prompts
        0.013 of the requests' energy against 0.095 in-process, on the same workload)."""
        if self.scheduled_s is not None:
            return self.scheduled_s
        return self.submit_s if self.submit_s is not None else self.first_token_s

    @property
    def ttft_s(self) -> float | None:
        # From submission, as vLLM's bench serve times it: a wait for a concurrency slot is the
        # client's, not the engine's.
        return None if self.submit_s is None or self.first_token_s is None else self.first_token_s - self.submit_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.submit_s is None or self.finish_s is None else self.finish_s - self.submit_s

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (tokens - 1): vLLM's definition; None with fewer than two tokens."""
        first = self.first_token_s
        if self.finish_s is None or first is None or self.output_tokens < 2:
            return None
        return (self.finish_s - first) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between consecutive output tokens (0 for tokens delivered together)."""
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:], strict=False)]

    @property
    def queue_s(self) -> float | None:
        """Time waiting in the engine before it was scheduled (None where unknown)."""
        return None if self.scheduled_s is None or self.submit_s is None else max(self.scheduled_s - self.submit_s, 0.0)


@dataclass(frozen=True)
class ServedRun:
    """One serving run: every request, sent from ``t_start_s`` (their arrivals' zero)."""

    t_start_s: float
    t_end_s: float  # the last request's end (or when the run gave up waiting)
    requests: tuple[ServedRequest, ...]
    client_processes: int = 1  # processes the requests were sent from (an HTTP client may use several)

    @property
    def completed(self) -> list[ServedRequest]:
        return [r for r in self.requests if r.ok]

    @property
    def failed(self) -> list[ServedRequest]:
        return [r for r in self.requests if not r.ok]


def sort_by_index(requests: Sequence[ServedRequest]) -> tuple[ServedRequest, ...]:
    return tuple(sorted(requests, key=lambda r: r.index))


@dataclass
class InFlight:
    """A request as a client sees it while it runs: kept outside the task that sends it, so
    that a request the run's deadline cancels still reports what it had received."""

    request: ServingRequest
    arrival_s: float
    submit_s: float | None = None
    due_s: float | None = None  # set where a concurrency slot came free after its arrival
    times: list[float] = field(default_factory=list)  # one per token received
    scheduled_s: float | None = None
    finish_s: float | None = None
    error: str | None = None
    cached_tokens: int | None = None  # prompt tokens served from the engine's prefix cache
    reply_ids: list[int] | None = None  # filled where the request keeps its reply
    reply_text: list[str] | None = None

    def __post_init__(self) -> None:
        if self.request.keeps_reply:
            self.reply_ids, self.reply_text = [], []

    def cut(self) -> None:
        """The run is over: a request neither finished nor failed was cut by its time limit."""
        if self.error is None and self.finish_s is None:
            self.error = NOT_SENT if self.submit_s is None else UNFINISHED

    def served(self) -> ServedRequest:
        return ServedRequest(self.request.index, self.request.prompt_tokens, self.arrival_s, self.submit_s,
                             self.scheduled_s, tuple(self.times), self.finish_s, self.error, self.due_s,
                             self.cached_tokens, tuple(self.reply_ids) if self.reply_ids else None,
                             "".join(self.reply_text) if self.reply_text else None)


def served_run(t_start_s: float, in_flight: Sequence[InFlight], now_s: float) -> ServedRun:
    """The run's record once it is over: every request (cut ones marked), ending at the last finish."""
    for request in in_flight:
        request.cut()
    served = [request.served() for request in in_flight]
    ends = [r.finish_s for r in served if r.finish_s is not None]
    return ServedRun(t_start_s=t_start_s, t_end_s=max(ends, default=now_s), requests=sort_by_index(served))
