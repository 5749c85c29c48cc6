"""Secrets in server command lines: which flags carry one, and how they are kept out of results.

A flag carries a secret when the last word of its name (split at ``-`` and ``_``) says so:
``--api-key``, ``--hf-token``, ``--password``, ``--client-secret``. The last whole word
only: ``--max-num-batched-tokens``, ``--tokenizer``, ``--token-s`` (seconds) and
``--api-key-env`` (a variable's name) are not secrets. Wherever a command
line is recorded, printed or logged, the value of such a flag reads ``REDACTED``; a
secret value known to the process (a server's generated key) is replaced in any text it
writes (``redact``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

REDACTED = "REDACTED"  # no character a shell would quote: command lines stay readable

_SECRET_WORDS = frozenset({"key", "apikey", "token", "password", "passwd", "secret", "credential",
                           "credentials", "auth", "authorization"})


def is_secret_flag(name: str) -> bool:
    """Whether a flag (``--api-key``, ``api_key``, ``hf-token``) names a secret."""
    words = re.split(r"[-_]+", name.lstrip("-").lower())
    return words[-1] in _SECRET_WORDS


def secret_positions(argv: Sequence[str]) -> list[int]:
    """Indices of ``argv`` that hold a secret value: the word after a secret flag, or a
    ``--flag=value`` word of a secret flag (the whole word)."""
    out: list[int] = []
    for i, word in enumerate(argv):
        if not word.startswith("-"):
            continue
        name, eq, _ = word.partition("=")
        if not is_secret_flag(name):
            continue
        if eq:
            out.append(i)
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out.append(i + 1)
    return out


def redact_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` with every secret flag's value replaced by ``REDACTED``."""
    out = list(argv)
    for i in secret_positions(out):
        name, eq, _ = out[i].partition("=")
        out[i] = f"{name}={REDACTED}" if eq and out[i].startswith("-") else REDACTED
    return out


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every occurrence of each (non-empty) secret replaced by ``REDACTED``."""
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def header_unsafe(value: str) -> str | None:
    """Why ``value`` cannot be sent as a bearer token in an HTTP header, naming the first
    offending character by kind and position, never the value itself; None if it can.

    Visible ASCII only (RFC 6750's token characters are a subset): a line break would end or
    fold the header, and a character outside Latin-1 cannot be encoded at all; either would
    otherwise surface as a connection error blamed on the server, or fail only on the worker.
    """
    for i, ch in enumerate(value, start=1):
        if "!" <= ch <= "~":
            continue
        kind = ("a line break" if ch in "\r\n" else "a space" if ch == " " else "a tab" if ch == "\t"
                else "a control character" if ord(ch) < 0x20 or ch == "\x7f" else "a non-ASCII character")
        return (f"it holds {kind} at character {i} of {len(value)}, which an HTTP header cannot carry "
                "(a key is visible ASCII characters only: no whitespace, no line break)")
    return None


@dataclass(frozen=True)
class SecretValues:
    """Values an actor needs that must never be written down (an external server's key, read
    from the driver's environment): handed to the actor as an argument of its load call.

    Not through Ray's runtime environment: Ray's runtime-env agent logs an actor's
    ``env_vars`` in clear to the session's ``runtime_env_agent.log``, which outlives the run.
    Its ``repr`` names the variables only, so a logged load request shows no value.
    """

    pairs: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, values: Mapping[str, str]) -> SecretValues:
        return cls(tuple(sorted(values.items())))

    def get(self, name: str) -> str | None:
        return dict(self.pairs).get(name)

    def __repr__(self) -> str:
        return f"SecretValues(names={[name for name, _ in self.pairs]})"
