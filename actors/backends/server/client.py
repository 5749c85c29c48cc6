"""The HTTP client of a serving run: every request sent at its arrival time, every streamed
chunk stamped on arrival, on its own event loop with a connection pool sized for the run.

Streaming and token counts. Each request streams (``stream: true``) with the usage in
the stream. The first content chunk's arrival is the first token. Every chunk is
recorded with the number of tokens it carried:

- where the server sends the running usage in every chunk (vLLM's and SGLang's
  ``continuous_usage_stats``), each chunk's count is exact;
- elsewhere each content chunk counts as one token, and where the final usage reports
  more tokens than chunks, the rest are counted at the last chunk's arrival (they had
  arrived by then at the latest); fewer, and the count is cut to the usage's.

The output tokens are always the server's usage. Tokens that arrive in one chunk share
its arrival time, so ITL (``ServedRequest.itl_s``: the gap before every token) counts
them as 0 s gaps, as the in-process engines record tokens delivered together; TPOT is
(last arrival - first arrival) / (tokens - 1), vLLM's definition. vLLM's own client
(``vllm bench serve``) records one ITL per chunk instead; with one token per chunk
(vLLM's default stream) the two are the same.

Ready before the clock starts. Everything a send needs is done before the schedule's
clock starts (its arrival 0): every request's body is built and JSON-encoded (a text
prompt decoded by the tokenizer, too), the connections the first second of arrivals
will hold are opened (``WARM_HORIZON_S``), and the garbage collector has done its work
(``_collected_before_the_clock``). On the send path there is then only the stamp and the
write; requests are started one by one as they come due (``actors.serving.schedule``).
Each request records how late it left (``ServedRequest.send_lateness_s``): what remains
of the client's own delay, judged by the trial (``actors.serving.lateness``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.serving.client import Follow
from actors.serving.records import InFlight, ServedRequest, ServedRun, ServingRequest, served_run
from actors.serving.schedule import play

log = logging.getLogger(__name__)

# An error body quoted in a request's error column is cut to this many characters.
ERROR_CHARS = 300
# Connecting to the server may take this long before the request counts as failed.
CONNECT_TIMEOUT_S = 10.0
# Connections opened before the clock starts: one for each request due within this long of
# the first arrival (each holds one until its reply has streamed), at most MAX_WARM_CONNECTIONS.
# Opening one on the send path costs the loop a connect and the connector's bookkeeping while
# later arrivals come due; a second of arrivals covers the requests in flight at the start
# wherever a request lives under a second, and connections opened later are spread over the run.
WARM_HORIZON_S = 1.0
MAX_WARM_CONNECTIONS = 256
# Opening them may take this long (and never past the run's deadline); then the run starts anyway.
WARM_TIMEOUT_S = 10.0
# The bodies go out as encoded JSON.
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass
class _Stream(InFlight):
    """What one request has received so far: its chunks, each with the tokens it carried."""

    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each chunk carried (exact counts)
    exact_counts: bool = False
    usage_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None  # the last choice's, once the server sent it
    body: bytes = field(default=b"", repr=False)  # the request's JSON, encoded before the clock started
    body_sent_s: float | None = None  # when its bytes went onto the connection (the first time)

    def served(self) -> ServedRequest:
        times: list[float] = []
        for t, k in zip(self.chunk_times_s, self.chunk_tokens, strict=True):
            times += [t] * k
        n = self.usage_tokens
        if n is not None and times:
            if n > len(times):
                times += [times[-1]] * (n - len(times))
            del times[n:]
        prompt = self.usage_prompt_tokens if self.usage_prompt_tokens is not None else self.request.prompt_tokens
        error = self.error
        if error is None and self.finish_s is not None and not times:
            error = "the server's reply held no token"
        return ServedRequest(self.request.index, prompt, self.arrival_s, self.submit_s, None, tuple(times),
                             self.finish_s if error is None else None, error=error, due_s=self.due_s,
                             cached_tokens=self.cached_tokens,
                             reply_text="".join(self.reply_text) if self.reply_text is not None else None)


@dataclass(frozen=True)
class Wire:
    """Where the encoded requests go and how their replies stream: everything a client process
    needs to send a run's requests once their bodies are built (it pickles)."""

    url: str  # .../v1/completions or .../v1/chat/completions
    continuous_usage: bool  # chunks carry the running usage
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # on every request: its key
    # A cheap GET of the same server (.../v1/models) whose answers open the connection pool
    # before the clock starts; None: connections open as the first requests go out.
    warm_url: str | None = None


@dataclass(frozen=True)
class Endpoint(Wire):
    """A wire and how each request's body is built for it."""

    body: Callable[[ServingRequest], dict[str, Any]] = field(kw_only=True)

    @property
    def wire(self) -> Wire:
        """The wire alone: what a client process is sent (the body builder need not pickle)."""
        return Wire(self.url, self.continuous_usage, dict(self.headers), self.warm_url)

    def encode(self, requests: Sequence[ServingRequest]) -> list[bytes]:
        """Each request's body as the JSON bytes that go out."""
        return [json.dumps(self.body(r), separators=(",", ":")).encode() for r in requests]


async def send_requests(endpoint: Endpoint, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
                        deadline_s: float, clock: Callable[[], float] = time.monotonic,
                        follow: Follow | None = None) -> ServedRun:
    """``fanout.run_http`` in one process, on the running event loop. The run's clock (its ``t_start_s``, the arrivals'
    zero) starts once the bodies are encoded, the connections open and the collector's work done
    (a conversation's later turns are encoded as the turn before ends, ahead of their gap)."""
    ordered = sorted(requests, key=lambda r: (r.arrival_offset_s, r.index))
    return await send_encoded(endpoint.wire, ordered, endpoint.encode(ordered), max_concurrency=max_concurrency,
                              deadline_s=deadline_s, clock=clock,
                              follow=None if follow is None else (follow, endpoint.encode))


async def send_encoded(wire: Wire, ordered: Sequence[ServingRequest], bodies: Sequence[bytes], *,
                       max_concurrency: int | None, deadline_s: float, clock: Callable[[], float] = time.monotonic,
                       start: Callable[[], Awaitable[float]] | None = None,
                       follow: tuple[Follow, Callable[[Sequence[ServingRequest]], list[bytes]]] | None = None
                       ) -> ServedRun:
    """Send ``ordered`` (in arrival order), each with its encoded body, once the connections are
    open and the collector's work done. ``start`` gives the arrivals' zero on ``clock`` when the
    client is ready (default: that moment); a client process asks its parent, which starts
    all of them at one zero."""
    import aiohttp

    # One connection per request in flight: a request never waits for a socket.
    pool = max(max_concurrency if max_concurrency is not None else len(ordered), 1)
    connector = aiohttp.TCPConnector(limit=pool, limit_per_host=pool, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=dict(wire.headers),
                                     trace_configs=[_send_stamp(clock)]) as session:
        if wire.warm_url is not None:
            n = min(pool, _due_early(ordered), MAX_WARM_CONNECTIONS)
            try:
                await asyncio.wait_for(_open_connections(session, wire.warm_url, n),
                                       timeout=max(min(WARM_TIMEOUT_S, deadline_s - clock()), 0.0))
            except asyncio.TimeoutError:
                log.warning("opening %d connections to %s took over %g s: the run starts without all of them",
                            n, wire.warm_url, WARM_TIMEOUT_S)
        with _collected_before_the_clock():
            t0 = clock() if start is None else await start()
            streams = [_Stream(r, t0 + r.arrival_offset_s, body=b) for r, b in zip(ordered, bodies, strict=True)]

            async def send(s: _Stream) -> None:
                await _stream(session, wire, s, clock)

            def following(s: _Stream) -> _Stream | None:
                assert follow is not None
                nxt = follow[0](s.served(), t0)
                if nxt is None:
                    return None
                streams.append(_Stream(nxt, t0 + nxt.arrival_offset_s, body=follow[1]([nxt])[0]))
                return streams[-1]

            await play(list(streams), send, max_concurrency=max_concurrency, deadline_s=deadline_s, clock=clock,
                       follow=following if follow is not None else None)
    return served_run(t0, streams, clock())


@contextlib.contextmanager
def _collected_before_the_clock() -> Iterator[None]:
    """The garbage collector's work done before the run, not in it: a full collection, then
    every object alive frozen (left out of the collections during the run) until it ends.

    Preparing a run (its bodies, its connections) allocates enough to make the collector's next
    pass a full one, which in a process of this size takes 20-50 ms: on the 2-core development
    machine one landed in the first 0.2 s of a run at 470 requests/s (the third of a process's
    runs) and sent those requests up to 48 ms late. Frozen, the objects the run was given are not traversed again by the passes
    the run's own allocations trigger."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _send_stamp(clock: Callable[[], float]) -> Any:
    """Stamp each request's ``submit_s`` as its bytes are handed to its connection (aiohttp's
    ``on_request_chunk_sent``, awaited just before the headers and body are written).

    TTFT runs from that moment: the HTTP round trip and the server's handling are in it (what
    an application pays), the client's building of the request is not. Stamped before
    ``session.post`` instead, a TTFT held aiohttp's request building and, on Python < 3.12,
    a loop iteration before the body task runs: 0.3 ms of the 1.2 ms median by which the
    client's TTFT exceeded a local aiohttp server's own on the 2-core machine. That time still
    counts, as send lateness (the request left that much later)."""
    import aiohttp

    async def stamp(session: Any, context: Any, params: Any) -> None:
        stream = context.trace_request_ctx
        if isinstance(stream, _Stream) and stream.body_sent_s is None:
            stream.submit_s = stream.body_sent_s = clock()

    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(stamp)
    return trace


def _due_early(ordered: Sequence[ServingRequest]) -> int:
    """How many requests arrive within WARM_HORIZON_S of the first."""
    if not ordered:
        return 0
    first = ordered[0].arrival_offset_s
    return sum(1 for r in ordered if r.arrival_offset_s - first <= WARM_HORIZON_S)


async def _open_connections(session: Any, url: str, n: int) -> None:
    """Open ``n`` pooled connections: ``n`` GETs at once, each holding its connection until
    every one has answered, then all released to the pool. A failure is no run's failure
    (its requests open their own connections, and say so if they cannot)."""
    import aiohttp

    answers = await asyncio.gather(*(session.get(url) for _ in range(n)), return_exceptions=True)
    failed = [a for a in answers if isinstance(a, BaseException)]
    for answer in answers:
        if not isinstance(answer, BaseException):
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
                await answer.read()
            answer.release()
    if failed:
        log.warning("%d of %d connections to %s did not open ahead of the run: %s", len(failed), n, url, failed[0])


async def _stream(session: Any, wire: Wire, s: _Stream, clock: Callable[[], float]) -> None:
    import aiohttp

    s.submit_s = clock()  # restamped as the request goes onto its connection (_send_stamp)
    try:
        async with session.post(wire.url, data=s.body, headers=JSON_HEADERS, trace_request_ctx=s) as response:
            if response.status != 200:
                text = (await response.text())[:ERROR_CHARS]
                s.error = f"HTTP {response.status}: {' '.join(text.split())}"
                return
            buffer, ended = b"", False
            async for piece in response.content.iter_any():
                if ended:
                    continue  # read to the body's end, so that the connection goes back to the pool
                now = clock()
                buffer += piece
                *events, buffer = buffer.split(b"\n\n")
                for event in events:
                    if _event(s, event, now, wire.continuous_usage):
                        ended = True
                        if s.error is not None:
                            return  # a broken stream: its connection is closed, not reused
                        s.finish_s = now
                        break
            if ended:
                return
            if s.finish_reason is not None:  # a server that ends the stream without [DONE] (transformers)
                s.finish_s = clock()
            else:
                s.error = "the stream ended before the reply did (no finish_reason, no [DONE])"
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as exc:
        s.error = f"{type(exc).__name__}: {str(exc)[:ERROR_CHARS]}"


def _event(s: _Stream, event: bytes, now: float, continuous_usage: bool) -> bool:
    """Record one server-sent event; True at the stream's end ([DONE] or an error)."""
    for line in event.decode(errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return True
        try:
            chunk = json.loads(data)
        except ValueError:
            s.error = f"unparseable stream event: {data[:ERROR_CHARS]}"
            return True
        if "error" in chunk:
            err = chunk["error"]
            s.error = "server error mid-stream: " + str(err.get("message", err) if isinstance(err, dict) else err)[
                :ERROR_CHARS]
            return True
        _chunk(s, chunk, now, continuous_usage)
    return False


def _chunk(s: _Stream, chunk: dict[str, Any], now: float, continuous_usage: bool) -> None:
    usage = chunk.get("usage") or None
    choices = chunk.get("choices") or []
    text = ""
    if choices:
        choice = choices[0]
        s.finish_reason = choice.get("finish_reason") or s.finish_reason
        delta = choice.get("delta")
        text = (delta.get("content") if isinstance(delta, dict) else choice.get("text")) or ""
        if text and s.reply_text is not None:
            s.reply_text.append(text)
    if usage is not None:
        completion = usage.get("completion_tokens")
        s.usage_prompt_tokens = usage.get("prompt_tokens", s.usage_prompt_tokens)
        # OpenAI's usage.prompt_tokens_details.cached_tokens: vLLM with --enable-prompt-tokens-details,
        # SGLang with --enable-cache-report.
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        if isinstance(cached, int):
            s.cached_tokens = cached
        if continuous_usage and completion is not None:
            counted = sum(s.chunk_tokens)
            if completion > counted:
                s.chunk_times_s.append(now)
                s.chunk_tokens.append(completion - counted)
            s.exact_counts = True
        if completion is not None:
            s.usage_tokens = completion
        if s.exact_counts:
            return
    if text:
        s.chunk_times_s.append(now)
        s.chunk_tokens.append(1)
