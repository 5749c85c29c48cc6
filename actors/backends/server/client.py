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
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from actors.serving.records import InFlight, ServedRequest, ServedRun, ServingRequest, served_run

# An error body quoted in a request's error column is cut to this many characters.
ERROR_CHARS = 300
# Connecting to the server may take this long before the request counts as failed.
CONNECT_TIMEOUT_S = 10.0


@dataclass
class _Stream(InFlight):
    """What one request has received so far: its chunks, each with the tokens it carried."""

    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)  # tokens each chunk carried (exact counts)
    exact_counts: bool = False
    usage_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    finish_reason: str | None = None  # the last choice's, once the server sent it

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
                             self.finish_s if error is None else None, error=error)


@dataclass(frozen=True)
class Endpoint:
    """Where requests go and how each one's body is built."""

    url: str  # .../v1/completions or .../v1/chat/completions
    body: Callable[[ServingRequest], dict[str, Any]]
    continuous_usage: bool  # chunks carry the running usage
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)  # on every request: its key


def run_http(endpoint: Endpoint, requests: Sequence[ServingRequest], *, max_concurrency: int | None,
             deadline_s: float, clock: Callable[[], float] = time.monotonic) -> ServedRun:
    """Send ``requests`` at their arrival offsets from now, at most ``max_concurrency`` in
    flight (later arrivals wait, in order), until each has finished or ``deadline_s`` (on
    ``clock``) has passed. Runs its own event loop; returns when the run is over."""
    return asyncio.run(_run(endpoint, requests, max_concurrency, deadline_s, clock))


async def _run(endpoint: Endpoint, requests: Sequence[ServingRequest], max_concurrency: int | None,
               deadline_s: float, clock: Callable[[], float]) -> ServedRun:
    import aiohttp

    ordered = sorted(requests, key=lambda r: (r.arrival_offset_s, r.index))
    # One connection per request in flight: a request never waits for a socket.
    pool = max_concurrency if max_concurrency is not None else len(ordered)
    connector = aiohttp.TCPConnector(limit=max(pool, 1), limit_per_host=max(pool, 1), force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S)
    slots = asyncio.Semaphore(max_concurrency) if max_concurrency is not None else None
    t0 = clock()
    streams = [_Stream(r, t0 + r.arrival_offset_s) for r in ordered]
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=dict(endpoint.headers)) as session:
        tasks = [asyncio.create_task(_send(session, endpoint, s, slots, clock)) for s in streams]
        _, late = await asyncio.wait(tasks, timeout=max(deadline_s - clock(), 0.0))
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)
    return served_run(t0, streams, clock())


async def _send(session: Any, endpoint: Endpoint, s: _Stream, slots: asyncio.Semaphore | None,
                clock: Callable[[], float]) -> None:
    delay = s.arrival_s - clock()
    if delay > 0:
        await asyncio.sleep(delay)
    if slots is not None:
        async with slots:
            await _stream(session, endpoint, s, clock)
    else:
        await _stream(session, endpoint, s, clock)


async def _stream(session: Any, endpoint: Endpoint, s: _Stream, clock: Callable[[], float]) -> None:
    import aiohttp

    body = endpoint.body(s.request)
    s.submit_s = clock()
    try:
        async with session.post(endpoint.url, json=body) as response:
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
                    if _event(s, event, now, endpoint.continuous_usage):
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
    if usage is not None:
        completion = usage.get("completion_tokens")
        s.usage_prompt_tokens = usage.get("prompt_tokens", s.usage_prompt_tokens)
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
