"""An OpenAI-compatible server whose timing is known: the ground truth a client is held against.

It stands in for an engine with a fixed schedule. Each streamed reply's first chunk is
sent ``--first-chunk-s`` after the request arrived, then one chunk (one token) every
``--chunk-s``, each due at its absolute time (a late send does not shift the ones after
it), then the usage and ``[DONE]``. Every request's arrival and every chunk's send are
stamped on CLOCK_MONOTONIC, the clock the client stamps with (one clock for every process
of a Linux host), and written with its prompt (and when its connection was opened) to ``--send-log``, one
JSON line per request:
a client's TTFT and ITL can then be compared, request by request, with what the server did.

It reads and writes its sockets itself on an asyncio loop, not through a web framework, so
that its stamps are as close to the wire as they get: a request's arrival is the kernel's
receive timestamp of its last bytes (SO_TIMESTAMPNS), and each send is stamped in the timer
callback that writes it. An aiohttp handler is reached a loop iteration after its bytes
arrive, and even a bare read waits for the process to wake (0.2 ms at the median on the
2-core development machine, over 1 ms at times): the server's own delays, which a client
sees as part of its TTFT, belong in the truth's TTFT too, and with the kernel's stamp they
are. The same makes it cheap: one timer and one write per chunk, so it shares a small
machine with the client it measures at 30,000 chunks a second.
It speaks HTTP/1.1 with keep-alive, as much of it as an OpenAI client uses: ``POST
/v1/completions`` and ``/v1/chat/completions`` (streamed, chunked transfer encoding;
continuous usage where asked, as vLLM) and ``GET /v1/models``.

    python tests/truth_server.py --port 8000 --first-chunk-s 0.01 --chunk-s 0.005 --send-log sends.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import socket
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

try:  # the fault server's chunks: one framing for both test servers
    from tests.fault_server import sse_event
except ImportError:  # run as a script: tests/ is sys.path[0]
    from fault_server import sse_event  # type: ignore[no-redef]

TRUTH_SERVER = Path(__file__)
# A request head longer than this is refused (and its connection closed); reads take this much.
MAX_HEAD_BYTES = 65536
# The kernel's receive timestamps (Linux's value where the socket module does not name it).
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)


@dataclass(frozen=True)
class ServerSends:
    """What the server did for one request, on CLOCK_MONOTONIC."""

    prompt: tuple[Any, ...] | str  # token ids (completions) or the text (chat)
    received_s: float  # the request's last byte reached the server's socket (the kernel's stamp)
    sent_s: tuple[float, ...]  # each content chunk's send
    connection_opened_s: float  # when the connection it came on was accepted

    @property
    def ttft_s(self) -> float:
        return self.sent_s[0] - self.received_s

    @property
    def itl_s(self) -> list[float]:
        return [b - a for a, b in zip(self.sent_s, self.sent_s[1:], strict=False)]


def read_send_log(path: str | Path) -> list[ServerSends]:
    """The server's log, one entry per request (its workers' logs too: ``--workers``), in the
    order each worker's replies ended."""
    out = []
    path = Path(path)
    logs = [path, *sorted(path.parent.glob(f"{path.name}.worker*"))]
    for line in (line for log in logs if log.is_file() for line in log.read_text().splitlines()):
        entry = json.loads(line)
        prompt = entry["prompt"]
        out.append(ServerSends(tuple(prompt) if isinstance(prompt, list) else prompt, entry["received_s"],
                               tuple(entry["sent_s"]), entry["connection_opened_s"]))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model", default="truth")
    p.add_argument("--first-chunk-s", type=float, default=0.01, help="first chunk this long after the request")
    p.add_argument("--chunk-s", type=float, default=0.005, help="then one chunk every this long")
    p.add_argument("--send-log", default=None, help="append one JSON line per request: its arrival and sends")
    p.add_argument("--workers", type=int, default=1,
                   help="processes serving the port (SO_REUSEPORT); worker k > 0 logs to SEND_LOG.worker<k>")
    return p


def _http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@functools.lru_cache(maxsize=4096)
def _reply_chunks(model: str, chat: bool, tokens: int, prompt_tokens: int, continuous: bool) -> tuple[bytes, ...]:
    """A reply's content chunks, framed, built once per shape: a send is then one write."""
    usage = [{"prompt_tokens": prompt_tokens, "completion_tokens": k + 1, "total_tokens": prompt_tokens + k + 1}
             if continuous else None for k in range(tokens)]
    return tuple(_http_chunk(sse_event(model, f"w{k}", chat, usage[k])) for k in range(tokens))


@functools.lru_cache(maxsize=4096)
def _reply_end(model: str, chat: bool, tokens: int, prompt_tokens: int) -> bytes:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
    return _http_chunk(sse_event(model, "", chat, usage, finish="length") + b"data: [DONE]\n\n") + b"0\r\n\r\n"


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: keep-alive\r\n\r\n")


def _plain(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            f"Connection: keep-alive\r\n\r\n").encode() + body


@dataclass
class _Reply:
    """One streamed reply in progress: its chunks, when each is due, what was sent when."""

    prompt: Any
    received_s: float
    chunks: tuple[bytes, ...]
    end: bytes
    sent_s: list[float] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


def _arrival_s(ancillary: list[tuple[int, int, bytes]]) -> float:
    """When the bytes just read reached this host's socket, on CLOCK_MONOTONIC: the kernel's
    receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME) moved onto the monotonic clock; without
    one, now."""
    now_s, wall_s = time.monotonic(), time.time()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("qq", data[:16])
            return now_s - (wall_s - (seconds + nanoseconds * 1e-9))
    return now_s


class Connection:
    """One client connection: requests one after another (no pipelining, as HTTP clients send)."""

    def __init__(self, sock: socket.socket, args: argparse.Namespace, log: IO[str] | None) -> None:
        self.sock, self.args, self.log = sock, args, log
        self.loop = asyncio.get_running_loop()
        self.opened_s = time.monotonic()
        self.buffer = b""
        self.pending = b""  # bytes the socket would not take yet
        self.reply: _Reply | None = None
        self.closed = False
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.loop.add_reader(sock, self._readable)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.reply is not None and self.reply.timer is not None:
            self.reply.timer.cancel()
        self.loop.remove_reader(self.sock)
        self.loop.remove_writer(self.sock)
        self.sock.close()

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(MAX_HEAD_BYTES, socket.CMSG_SPACE(16))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.close()
            return
        self.buffer += data
        self._parse(_arrival_s(ancillary))

    def _parse(self, received_s: float) -> None:
        while self.reply is None and not self.closed:
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    self.close()
                return
            lines = self.buffer[:head_end].decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
            length = int(headers.get("content-length", "0"))
            if len(self.buffer) < head_end + 4 + length:
                return  # the body is still on its way: the request arrives with its last byte
            body = self.buffer[head_end + 4:head_end + 4 + length]
            self.buffer = self.buffer[head_end + 4 + length:]
            method, path, _ = lines[0].split(" ", 2)
            self._request(method, path, body, received_s)

    def _write(self, data: bytes) -> None:
        if self.closed:
            return
        if not self.pending:
            try:
                data = data[self.sock.send(data):]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.close()
                return
            if data:
                self.loop.add_writer(self.sock, self._writable)
        self.pending += data

    def _writable(self) -> None:
        try:
            self.pending = self.pending[self.sock.send(self.pending):]
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not self.pending:
            self.loop.remove_writer(self.sock)

    def _request(self, method: str, path: str, body: bytes, received_s: float) -> None:
        args = self.args
        if method == "GET" and path == "/v1/models":
            listing = {"object": "list", "data": [{"id": args.model, "object": "model"}]}
            self._write(_plain("200 OK", json.dumps(listing).encode()))
            return
        if method != "POST" or path not in ("/v1/completions", "/v1/chat/completions"):
            self._write(_plain("404 Not Found", b'{"error": "not found"}'))
            return
        request = json.loads(body)
        chat = path.endswith("chat/completions")
        prompt = request["messages"][-1]["content"] if chat else request.get("prompt")
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        tokens = max(int(request.get("max_tokens", 16)), 1)
        continuous = bool((request.get("stream_options") or {}).get("continuous_usage_stats"))
        self._write(STREAM_HEAD)
        self.reply = _Reply(prompt, received_s, _reply_chunks(args.model, chat, tokens, prompt_tokens, continuous),
                            _reply_end(args.model, chat, tokens, prompt_tokens))
        self._schedule(self.reply)

    def _schedule(self, reply: _Reply) -> None:
        k = len(reply.sent_s)
        due = reply.received_s + self.args.first_chunk_s + k * self.args.chunk_s
        reply.timer = self.loop.call_at(due, self._send, reply)

    def _send(self, reply: _Reply) -> None:
        if self.closed or self.reply is not reply:
            return
        reply.sent_s.append(time.monotonic())
        self._write(reply.chunks[len(reply.sent_s) - 1])
        if len(reply.sent_s) < len(reply.chunks):
            self._schedule(reply)
            return
        if self.log is not None:  # before the reply ends: a client that has its reply finds it logged
            self.log.write(json.dumps({"prompt": reply.prompt, "received_s": reply.received_s,
                                       "sent_s": reply.sent_s, "connection_opened_s": self.opened_s}) + "\n")
            self.log.flush()
        self._write(reply.end)
        self.reply = None
        if self.buffer:
            self._parse(time.monotonic())  # a request that came in behind this reply


async def serve(args: argparse.Namespace) -> None:
    log = open(args.send_log, "a") if args.send_log else None  # noqa: SIM115 - open for the server's life
    loop = asyncio.get_running_loop()
    listener = socket.create_server((args.host, args.port), backlog=1024, reuse_port=args.workers > 1)
    listener.setblocking(False)
    connections: set[Connection] = set()

    def accept() -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        connections.add(Connection(sock, args, log))

    loop.add_reader(listener, accept)
    print(f"truth server on {args.host}:{args.port}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    args, _ = _parser().parse_known_args()
    # Several workers, for a client of several processes: one loop streams about 30,000 chunks
    # a second. Forked before any loop exists; each listens on the port itself (the kernel
    # spreads the connections) and logs to a file of its own; they share the process group
    # that stops the server.
    for k in range(1, args.workers):
        if os.fork() == 0:
            if args.send_log:
                args.send_log = f"{args.send_log}.worker{k}"
            break
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
