"""A small OpenAI-compatible server that misbehaves on request, for the server backend's fault tests.

A real HTTP server (aiohttp) speaking the streamed ``/v1/completions`` and
``/v1/chat/completions`` protocol and ``GET /v1/models``; every reply is ``max_tokens``
words ``w0 w1 ...`` with the usage in its last chunk. Flags make it fail the ways real
servers fail: never ready, exiting before ready, dying after N requests, HTTP errors,
errors mid-stream, slow first tokens, several tokens per chunk, no ``[DONE]``, ignoring
SIGTERM, a child process in its group, killing its launcher as it starts. It is no stand-in
for the engine servers (the end-to-end tests launch ``transformers serve``); it makes each
failure happen on purpose.

    python tests/fault_server.py --port 8000 [--model NAME] [flags]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

FAULT_SERVER = Path(__file__)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--reuse-port", action="store_true", help="bind with SO_REUSEPORT, as vLLM does")
    p.add_argument("--model", default="fault")
    p.add_argument("--ready-after-s", type=float, default=0.0, help="/v1/models answers 503 until then")
    p.add_argument("--never-ready", action="store_true")
    p.add_argument("--models-error", type=int, default=None,
                   help="/v1/models always answers this HTTP status (a server up but broken)")
    p.add_argument("--models-error-unless-dir", default=None,
                   help="/v1/models answers 500 while this directory does not exist (transformers serve's Hub cache)")
    p.add_argument("--exit-before-ready", type=int, default=None, help="print a message and exit with this code")
    p.add_argument("--exit-message", default="fault server: loading the model failed on purpose (CUDA out of memory, say)",
                   help="the message --exit-before-ready prints")
    p.add_argument("--die-after", type=int, default=None, help="exit once this many requests have begun")
    p.add_argument("--http-error-every", type=int, default=None, help="every Nth request answers HTTP 500")
    p.add_argument("--error-after-chunks", type=int, default=None, help="send an error event after N chunks")
    p.add_argument("--first-token-s", type=float, default=0.0)
    p.add_argument("--token-s", type=float, default=0.0)
    p.add_argument("--hold-after-tokens", type=int, default=None,
                   help="after this many tokens send nothing more, until the client hangs up")
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument("--no-done", action="store_true", help="end streams without data: [DONE]")
    p.add_argument("--continuous-usage", action="store_true", help="honour continuous_usage_stats")
    p.add_argument("--prefix-block", type=int, default=None,
                   help="a prefix cache of blocks this many tokens long: each reply's usage says how many "
                        "prompt tokens it held (prompt_tokens_details.cached_tokens), as vLLM does")
    p.add_argument("--pid-file", default=None, help="append this process's pid (and its child's)")
    p.add_argument("--child", action="store_true", help="start a child process in the same process group")
    p.add_argument("--ignore-term", action="store_true", help="ignore SIGTERM (only SIGKILL ends it)")
    p.add_argument("--kill-launcher", action="store_true",
                   help="once its pids are written, SIGKILL the process that started it and that process's "
                        "other children, as Ray ends a dead actor: an interrupt the moment a server starts")
    p.add_argument("--env-out", default=None, help="write this process's environment (JSON) to this file at start")
    p.add_argument("--log-requests", default=None, help="append each request's JSON body to this file")
    p.add_argument("--api-key", default=None, help="answer 401 to /v1 requests without 'Authorization: Bearer KEY'")
    p.add_argument("--api-key-env", default=None, help="the same, the key read from this environment variable")
    p.add_argument("--answers", default=None,
                   help="a JSONL file of {\"prompt\", \"answer\"} records: a prompt found there is answered "
                        "'The answer is ANSWER.' and its reply ends (finish_reason stop), so a scored trial's "
                        "accuracy is known exactly")
    p.add_argument("--wrong-every", type=int, default=None,
                   help="with --answers: the records numbered K, 2K, ... (1-based, in the file) get ANSWER + 1")
    p.add_argument("--ramble-every", type=int, default=None,
                   help="with --answers: the records numbered K, 2K, ... (1-based) get max_tokens words and no "
                        "answer (a reply the output length cuts)")
    return p


class Faults:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started_s = time.monotonic()
        self.begun = 0
        self.in_flight = 0
        self.max_in_flight = 0
        # The noop engine's prefix cache (actors.backends.noop.PrefixCache), where asked for.
        self.prefix_cache = _prefix_cache(args.prefix_block) if args.prefix_block else None
        self.answers = _answers(args) if args.answers else {}


def _answers(args: argparse.Namespace) -> dict[str, str | None]:
    """Each prompt of ``--answers`` and the reply it gets: the answer, a wrong one, or None (ramble)."""
    replies: dict[str, str | None] = {}
    lines = [line for line in Path(args.answers).read_text().splitlines() if line.strip()]
    for number, line in enumerate(lines, start=1):
        record = json.loads(line)
        answer = str(record["answer"])
        if args.ramble_every and number % args.ramble_every == 0:
            replies[record["prompt"]] = None
        elif args.wrong_every and number % args.wrong_every == 0:
            replies[record["prompt"]] = f"The answer is {int(answer) + 1}."
        else:
            replies[record["prompt"]] = f"The answer is {answer}."
    return replies


def _prefix_cache(block_tokens: int) -> Any:
    # Run as a script, sys.path[0] is tests/, whose own "actors" package (the tests') would shadow
    # the repository's: the repository goes first.
    root = str(Path(__file__).resolve().parents[1])
    if sys.path[0] != root:
        sys.path.insert(0, root)
    from actors.backends.noop import PrefixCache

    return PrefixCache(block_tokens)


async def models(request: Any) -> Any:
    from aiohttp import web

    f: Faults = request.app["faults"]
    if f.args.models_error_unless_dir is not None and not os.path.isdir(f.args.models_error_unless_dir):
        return web.json_response({"error": "Cache directory not found"}, status=500)
    if f.args.models_error is not None:
        return web.json_response({"error": "Cache directory not found"}, status=f.args.models_error)
    if f.args.never_ready or time.monotonic() - f.started_s < f.args.ready_after_s:
        return web.json_response({"error": "loading"}, status=503)
    return web.json_response({"object": "list", "data": [{"id": f.args.model, "object": "model"}],
                              "max_in_flight": f.max_in_flight})


def sse_event(model: str, text: str, chat: bool, usage: dict | None = None, finish: str | None = None) -> bytes:
    """One streamed completion chunk as a server-sent event (chat or text completion)."""
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {"content": text} if text else {}
    else:
        choice["text"] = text
    body: dict[str, Any] = {"object": "chat.completion.chunk" if chat else "text_completion", "model": model,
                            "choices": [choice]}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body)}\n\n".encode()


async def completions(request: Any) -> Any:
    from aiohttp import web

    f: Faults = request.app["faults"]
    a = f.args
    body = await request.json()
    if a.log_requests:
        with open(a.log_requests, "a") as out:
            out.write(json.dumps(body) + "\n")
    f.begun += 1
    n = f.begun
    if a.die_after is not None and n > a.die_after:
        os._exit(1)
    if a.http_error_every and n % a.http_error_every == 0:
        return web.json_response({"error": {"message": f"request {n} refused on purpose"}}, status=500)
    chat = request.path.endswith("chat/completions")
    prompt = body.get("prompt") if not chat else body["messages"][-1]["content"]
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    tokens = int(body.get("max_tokens", 16))
    # A prompt of --answers: its reply's words (None: max_tokens words, cut by the length).
    answer = f.answers.get(prompt) if isinstance(prompt, str) else None
    words = answer.split() if answer is not None else None
    if words is not None:
        tokens = min(tokens, len(words))
    continuous = a.continuous_usage and (body.get("stream_options") or {}).get("continuous_usage_stats")
    # Looked up as the request arrives (its prefill), so concurrent requests see each other's blocks.
    cached = f.prefix_cache.admit(prompt) if f.prefix_cache is not None and isinstance(prompt, list) else None
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    f.in_flight += 1
    f.max_in_flight = max(f.max_in_flight, f.in_flight)
    try:
        await asyncio.sleep(a.first_token_s)
        sent, chunks = 0, 0
        while sent < tokens:
            if a.hold_after_tokens is not None and sent >= a.hold_after_tokens:
                # What a stalled engine does: the stream stays open and silent. Polled, so the
                # handler ends when the client goes (aiohttp no longer cancels it then).
                while request.transport is not None and not request.transport.is_closing():
                    await asyncio.sleep(0.05)
                return response
            if a.error_after_chunks is not None and chunks >= a.error_after_chunks:
                await response.write(b'data: {"error": {"message": "engine failed on purpose"}}\n\n')
                return response
            k = min(a.tokens_per_chunk, tokens - sent)
            text = " ".join(f"w{sent + i}" if words is None else words[sent + i] for i in range(k))
            text = text if sent == 0 or words is None else " " + text  # an answer's words, spaced
            sent += k
            chunks += 1
            usage = ({"prompt_tokens": prompt_tokens, "completion_tokens": sent, "total_tokens": prompt_tokens + sent}
                     if continuous else None)
            await response.write(sse_event(a.model, text, chat, usage))
            if sent < tokens:
                await asyncio.sleep(a.token_s)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": sent, "total_tokens": prompt_tokens + sent}
        if cached is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        await response.write(sse_event(a.model, "", chat, usage, finish="stop" if words is not None else "length"))
        if not a.no_done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
    finally:
        f.in_flight -= 1
    return response


def main() -> None:
    # Flags it does not know (an engine's command line, when it stands in for one) are ignored.
    args, _ = _parser().parse_known_args()
    if args.env_out:
        with open(args.env_out, "w") as f:
            json.dump(dict(os.environ), f)
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pids = [os.getpid()]
    if args.child:
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                  + ("signal.signal(signal.SIGTERM, signal.SIG_IGN); " if args.ignore_term else "")
                                  + "time.sleep(3600)"])
        pids.append(child.pid)
    if args.pid_file:
        with open(args.pid_file, "a") as out:
            out.write("".join(f"{p}\n" for p in pids))
    if args.kill_launcher:
        import psutil

        launcher = psutil.Process(os.getppid())
        for p in [launcher, *(c for c in launcher.children() if c.pid != os.getpid())]:
            p.kill()
    if args.exit_before_ready is not None:
        print(args.exit_message, flush=True)
        sys.exit(args.exit_before_ready)
    from aiohttp import web

    # As vLLM does, say what it was started with: its secrets too, which the launcher must redact.
    key = args.api_key or (os.environ.get(args.api_key_env) if args.api_key_env else None)
    print(f"fault server args: {sys.argv[1:]} key: {key}", flush=True)

    @web.middleware
    async def keyed(request: Any, handler: Any) -> Any:
        if key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    app = web.Application(middlewares=[keyed])
    app["faults"] = Faults(args)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    print(f"fault server on {args.host}:{args.port}", flush=True)
    web.run_app(app, host=args.host, port=args.port, print=None, handle_signals=not args.ignore_term,
                reuse_port=args.reuse_port or None)


if __name__ == "__main__":
    main()
