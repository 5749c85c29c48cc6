"""Prompt files: read and checked on the driver at plan time, tokenized on the actor.

Two formats, as serving benchmarks use them:

- **JSONL**: one JSON object per line, ``{"prompt": "..."}``, optionally with
  ``"output_len": N`` (the reference output length in tokens) or ``"completion": "..."``
  (a reference reply, whose token length is the reference length).
- **ShareGPT** (a ``.json`` file): a list of ``{"conversations": [{"from": "human",
  "value": ...}, {"from": "gpt", "value": ...}, ...]}``; as vLLM's benchmark reads it,
  the first turn is the prompt and the second the reference reply. Conversations with
  fewer than two turns are left out.

Replayed as conversations (``workload.conversations: true``, ``read_conversations``), a
file's records are whole conversations: a ShareGPT record's turns, or a JSONL line's
``{"conversations": [...]}``, each turn ``{"from": "human"|"gpt"|"system", "value": ...}``
or ``{"role": "user"|"assistant"|"system", "content": ...}``. Each assistant turn answers
the user turn before it (the file's reference reply); a user turn may go unanswered (a file of
user turns alone is replayed with the model's own replies).

The dataset ``bundled`` is sweeper's own prompt set (``sweeper/data/prompts.jsonl``,
CC0, described in ``sweeper/data/PROMPTS-LICENSE.md``).

Every problem of a file is a ``DatasetError`` naming the file, the record and the
field; the plan turns it into one line and exit code 2 before anything runs.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from sweeper.core.errors import UserInputError
from sweeper.core.settings import DatasetFormat

RANDOM = "random"
BUNDLED = "bundled"
BUNDLED_FILE = Path(__file__).resolve().parent.parent / "data" / "prompts.jsonl"

# A prompt file past this size is refused: it would be read on every node, and hashed.
MAX_FILE_BYTES = 2 * 2**30
# Without a tokenizer (synthetic models), a text is as many tokens as its UTF-8 bytes / 4,
# about what English BPE tokenizers make of English.
BYTES_PER_TOKEN_FALLBACK = 4


def fallback_tokens(text: str) -> int:
    """A text's length in tokens for a model without a tokenizer (``BYTES_PER_TOKEN_FALLBACK``)."""
    return max(1, -(-len(text.encode()) // BYTES_PER_TOKEN_FALLBACK))


class DatasetError(UserInputError):
    """A prompt file that cannot be used: the file, where in it, and what is wrong."""

    def __init__(self, path: str, message: str, record: int | None = None, field: str | None = None):
        where = "" if record is None else f" record {record}" + (f" field {field!r}" if field else "")
        super().__init__(f"{path}{where}: {message}")
        self.path, self.record, self.field = path, record, field


@dataclass(frozen=True)
class PromptRecord:
    """One prompt of a file, as text, with what the file says about its reply."""

    prompt: str
    output_len: int | None = None  # the reference reply's length in tokens, when the file states it
    reference: str | None = None  # the reference reply's text, when the file has one


@dataclass(frozen=True)
class ConversationTurn:
    """One user turn of a conversation and the file's reply to it (None: the file has none)."""

    user: str
    reference: str | None = None


@dataclass(frozen=True)
class ConversationRecord:
    """One conversation of a file: its user turns in order, with an optional system prompt."""

    turns: tuple[ConversationTurn, ...]
    system: str | None = None


# The roles a conversation file may name, as ShareGPT ("from") and OpenAI messages ("role") write them.
_USER_ROLES = frozenset({"human", "user"})
_ASSISTANT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "model"})


def dataset_path(name: str, base_dir: Path | None = None) -> Path:
    """The file a ``workload.dataset`` names (relative paths from the sweep file's folder)."""
    if name == BUNDLED:
        return BUNDLED_FILE
    path = Path(name).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    return path.resolve()


def file_format(path: Path) -> DatasetFormat:
    """JSON Lines for ``.jsonl``; a ``.json`` file is a ShareGPT list."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".json":
        return "sharegpt"
    raise DatasetError(str(path), "unknown prompt-file format: name it .jsonl (one {\"prompt\": ...} per line) "
                                  "or .json (a ShareGPT list of conversations)")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _text_of(path: Path) -> str:
    """A prompt file's text, once it is known to exist, to be of a size worth reading and UTF-8."""
    where = str(path)
    if not path.is_file():
        raise DatasetError(where, "no such file")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise DatasetError(where, f"larger than {MAX_FILE_BYTES // 2**30} GiB")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DatasetError(where, "not UTF-8 text") from None


def read_records(path: Path, fmt: DatasetFormat | None = None) -> list[PromptRecord]:
    """Every prompt record of ``path``, checked; raises ``DatasetError``."""
    where, text = str(path), _text_of(path)
    fmt = fmt or file_format(path)
    records = _jsonl(where, text) if fmt == "jsonl" else _sharegpt(where, text)
    if not records:
        raise DatasetError(where, "holds no prompts")
    return records


def _jsonl(where: str, text: str) -> list[PromptRecord]:
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(where, f"not JSON ({exc.msg}, column {exc.colno})", number) from None
        if not isinstance(obj, dict):
            raise DatasetError(where, "expected a JSON object with a \"prompt\"", number)
        records.append(_record(where, number, obj))
    return records


def _record(where: str, number: int, obj: dict) -> PromptRecord:
    prompt = obj.get("prompt")
    if prompt is None:
        raise DatasetError(where, "missing", number, "prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise DatasetError(where, "must be non-empty text", number, "prompt")
    output_len = obj.get("output_len")
    if output_len is not None and (isinstance(output_len, bool) or not isinstance(output_len, int)
                                   or output_len <= 0):
        raise DatasetError(where, f"must be a positive whole number of tokens, not {output_len!r}",
                           number, "output_len")
    reference = obj.get("completion")
    if reference is not None and not isinstance(reference, str):
        raise DatasetError(where, "must be text", number, "completion")
    return PromptRecord(prompt, output_len, reference)


def _sharegpt(where: str, text: str) -> list[PromptRecord]:
    records = []
    for number, item in _json_list(where, text):
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise DatasetError(where, "missing or not a list", number, "conversations")
        if len(turns) < 2:
            continue  # no reply to take a reference length from; vLLM's benchmark skips these too
        texts = []
        for turn in turns[:2]:
            value = turn.get("value") if isinstance(turn, dict) else None
            if not isinstance(value, str):
                raise DatasetError(where, "a turn without text", number, "conversations.value")
            texts.append(value)
        if texts[0].strip():
            records.append(PromptRecord(texts[0], None, texts[1]))
    return records


def read_conversations(path: Path, fmt: DatasetFormat | None = None) -> list[ConversationRecord]:
    """Every conversation of ``path``, checked (``DatasetError`` names the record and field)."""
    where, text = str(path), _text_of(path)
    fmt = fmt or file_format(path)
    items = _json_lines(where, text) if fmt == "jsonl" else _json_list(where, text)
    records = []
    for number, item in items:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise DatasetError(where, "missing or not a list", number, "conversations")
        record = _conversation(where, number, turns)
        if record.turns:
            records.append(record)
    if not records:
        raise DatasetError(where, "holds no conversation with a user turn")
    return records


def _json_lines(where: str, text: str) -> list[tuple[int, object]]:
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                items.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DatasetError(where, f"not JSON ({exc.msg}, column {exc.colno})", number) from None
    return items


def _json_list(where: str, text: str) -> list[tuple[int, object]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(where, f"not JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(data, list):
        raise DatasetError(where, "a ShareGPT file is a JSON list of {\"conversations\": [...]} records")
    return list(enumerate(data, start=1))


def _conversation(where: str, number: int, messages: list) -> ConversationRecord:
    """The user turns of one record's messages, each with the reply that follows it."""
    system, turns = None, []
    for position, message in enumerate(messages):
        role, text = _message(where, number, message)
        if role == "system":
            if position != 0:
                raise DatasetError(where, "a system message may only open a conversation", number, "conversations")
            system = text
        elif role in _USER_ROLES:
            turns.append(ConversationTurn(text))  # after another user turn: that one has no reply in the file
        else:
            if not turns or turns[-1].reference is not None:
                raise DatasetError(where, "an assistant turn that answers no user turn", number, "conversations")
            turns[-1] = ConversationTurn(turns[-1].user, text)
    return ConversationRecord(tuple(turns), system)


def _message(where: str, number: int, message: object) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise DatasetError(where, "a turn is an object {\"from\", \"value\"} or {\"role\", \"content\"}",
                           number, "conversations")
    role = message.get("from", message.get("role"))
    text = message.get("value", message.get("content"))
    if not isinstance(text, str) or not text.strip():
        raise DatasetError(where, "a turn without text", number, "conversations.value")
    if role != "system" and role not in _USER_ROLES | _ASSISTANT_ROLES:
        raise DatasetError(where, f"unknown role {role!r} (human/user, gpt/assistant or system)",
                           number, "conversations.from")
    return str(role), text
