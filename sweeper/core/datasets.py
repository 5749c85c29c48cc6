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
CC0, described in ``sweeper/data/PROMPTS-LICENSE.md``); the generated tasks (``arithmetic``)
are made from their settings rather than read (``sweeper.core.tasks``).

Reference answers, for ``scoring`` (``sweeper.core.scoring``): a JSONL record may carry its
answer, ``{"prompt": ..., "answer": "42"}``; GSM8K's ``{"question": ..., "answer": "... #### 42"}``
(``question`` stands for ``prompt``; the answer is what follows the last ``####``); or multiple
choice, ``{"question": ..., "choices": [...], "answer": "B" | 1}`` (a letter, or the choice's
0-based index), whose prompt is the question with its choices lettered below it.

Every problem of a file is a ``DatasetError`` naming the file, the record and the
field; the plan turns it into one line and exit code 2 before anything runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import reprlib
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
    answer: str | None = None  # the reference answer (a choice's letter for multiple choice), for scoring
    choices: tuple[str, ...] | None = None  # multiple choice: the choices, lettered A, B, ... in the prompt


@dataclass(frozen=True)
class ConversationTurn:
    """One user turn of a conversation and the file's reply to it (None: the file has none),
    with the answer a scored trial judges the model's reply against (None: not scored)."""

    user: str
    reference: str | None = None
    answer: str | None = None


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
        obj = _json_line(where, line, number)
        if not isinstance(obj, dict):
            raise DatasetError(where, "expected a JSON object with a \"prompt\"", number)
        records.append(_record(where, number, obj))
    return records


def _record(where: str, number: int, obj: dict) -> PromptRecord:
    # GSM8K's and multiple-choice sets name the prompt "question".
    key = "prompt" if "prompt" in obj or "question" not in obj else "question"
    prompt = obj.get(key)
    if prompt is None:
        raise DatasetError(where, "missing", number, "prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise DatasetError(where, "must be non-empty text", number, key)
    _check_unicode(where, number, key, prompt)
    output_len = obj.get("output_len")
    if output_len is not None and (isinstance(output_len, bool) or not isinstance(output_len, int)
                                   or output_len <= 0):
        raise DatasetError(where, f"must be a positive whole number of tokens, not {_shown(output_len)}",
                           number, "output_len")
    reference = obj.get("completion")
    if reference is not None and not isinstance(reference, str):
        raise DatasetError(where, "must be text", number, "completion")
    if reference is not None:
        _check_unicode(where, number, "completion", reference)
    choices = _choices(where, number, obj.get("choices"))
    answer = _answer(where, number, obj.get("answer"), choices)
    if choices is not None:
        prompt = prompt.rstrip() + "\n" + "".join(f"{LETTERS[i]}. {c}\n" for i, c in enumerate(choices)) + "Answer:"
    return PromptRecord(prompt, output_len, reference, answer, choices)


# The letters that name a multiple-choice record's choices, in order.
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# GSM8K's answers end with the final answer after this marker (its working before it).
FINAL_ANSWER_MARK = "####"


def _choices(where: str, number: int, value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or not 2 <= len(value) <= len(LETTERS)
            or not all(isinstance(c, str) and c.strip() for c in value)):
        raise DatasetError(where, f"must be a list of 2 to {len(LETTERS)} non-empty texts", number, "choices")
    return tuple(_check_unicode(where, number, "choices", c) for c in value)


def _answer(where: str, number: int, value: object, choices: tuple[str, ...] | None) -> str | None:
    """The record's reference answer as text: a GSM8K answer's part after ``####``; for
    multiple choice, the letter of the choice (given as its letter, 0-based index or text)."""
    if value is None:
        if choices is not None:
            raise DatasetError(where, "missing: a multiple-choice record needs its answer (a letter or an index)",
                               number, "answer")
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise DatasetError(where, f"must be text or a number, not {_shown(value)}", number, "answer")
    if choices is not None:
        return _choice_letter(where, number, value, choices)
    text = str(value)
    if isinstance(value, str):
        _check_unicode(where, number, "answer", text)
        if FINAL_ANSWER_MARK in text:
            text = text.rsplit(FINAL_ANSWER_MARK, 1)[1]
    if not text.strip():
        raise DatasetError(where, "must not be empty" + (f" after {FINAL_ANSWER_MARK}" if isinstance(value, str)
                                                        and FINAL_ANSWER_MARK in value else ""), number, "answer")
    return text.strip()


def _choice_letter(where: str, number: int, value: str | int | float, choices: tuple[str, ...]) -> str:
    letters = LETTERS[:len(choices)]
    if isinstance(value, int) and 0 <= value < len(choices):
        return letters[value]
    if isinstance(value, str) and value.strip().upper() in letters and len(value.strip()) == 1:
        return value.strip().upper()
    if isinstance(value, str) and value in choices:
        return letters[choices.index(value)]
    raise DatasetError(where, f"{_shown(value)} names none of the {len(choices)} choices (a letter "
                              f"{letters[0]}-{letters[-1]}, a 0-based index or a choice's text)", number, "answer")


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
            texts.append(_check_unicode(where, number, "conversations.value", value))
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


def _shown(value: object) -> str:
    """A value of the file as an error shows it: shortened, and never nested past a few
    levels (a 100,000-level list would not even print)."""
    return _SHOWN.repr(value)


_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 60


def _check_unicode(where: str, number: int, field: str, text: str) -> str:
    """``text``, refused if it holds a lone surrogate: JSON may write one as an escape
    (``"\\ud800"``), but it is half of a UTF-16 pair, no character, and no tokenizer, hash or
    request body can encode it (``UnicodeEncodeError`` wherever it is first sent)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise DatasetError(where, f"holds a lone surrogate \\u{ord(text[exc.start]):04x} (half of a UTF-16 "
                                      "pair, no character): not text that can be encoded", number, field) from None
    return text


def _json_line(where: str, line: str, number: int) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(where, f"not JSON ({exc.msg}, column {exc.colno})", number) from None
    except RecursionError:
        raise _too_deep(where, line, number) from None


# The tokens of JSON text that nest or separate: a string (with the colon after it, when it is a
# key), a bracket or a comma. Only read once json has found a document too deep to parse.
_JSON_TOKEN = re.compile(r'"([^"\\]*(?:\\.[^"\\]*)*)"(\s*:)?|[\[{]|[\]}]|,')


def _too_deep(where: str, text: str, number: int | None) -> DatasetError:
    """The error for JSON nested past what json reads (it recurses once per level, to a
    ``RecursionError``): its deepest point, by record and key. ``number``: the JSONL line
    the text is; None: a ShareGPT file, whose records are the items of its top-level list."""
    top = 0 if number is not None else 1  # the depth of the level holding the records
    depth, item, key = 0, 1, None
    deepest: tuple[int, int | None, str | None] = (0, number, None)
    for match in _JSON_TOKEN.finditer(text):
        token = match.group()
        if token[0] == '"':
            if match.group(2) and depth == top + 1:  # a key of the record's own object
                key = match.group(1)[:60]  # a key as the file writes it (escapes and all), shortened
        elif token in "[{":
            depth += 1
            if depth > deepest[0]:
                deepest = (depth, number if number is not None else item, key)
        elif token in "]}":
            depth -= 1
            if depth <= top:
                key = None
        elif depth == top and number is None:  # a comma between the records of the list
            item += 1
    levels, record, field = deepest
    return DatasetError(where, f"JSON nested {levels:,} levels deep, past what can be read (a prompt "
                               "file's records are a few levels)", record, field)


def _json_lines(where: str, text: str) -> list[tuple[int, object]]:
    items = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            items.append((number, _json_line(where, line, number)))
    return items


def _json_list(where: str, text: str) -> list[tuple[int, object]]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DatasetError(where, f"not JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise _too_deep(where, text, None) from None
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
            # After another user turn: that one has no reply in the file.
            turns.append(ConversationTurn(text, answer=_turn_answer(where, number, message)))
        else:
            if not turns or turns[-1].reference is not None:
                raise DatasetError(where, "an assistant turn that answers no user turn", number, "conversations")
            turns[-1] = dataclasses.replace(turns[-1], reference=text)
    return ConversationRecord(tuple(turns), system)


def _turn_answer(where: str, number: int, message: object) -> str | None:
    """A user turn's ``answer`` (a text or a number), for scoring its reply; None: not given."""
    answer = message.get("answer") if isinstance(message, dict) else None
    if answer is None:
        return None
    if isinstance(answer, bool) or not isinstance(answer, str | int | float) or not str(answer).strip():
        raise DatasetError(where, "a turn's answer is a text or a number", number, "conversations.answer")
    return str(answer)


def _message(where: str, number: int, message: object) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise DatasetError(where, "a turn is an object {\"from\", \"value\"} or {\"role\", \"content\"}",
                           number, "conversations")
    role = message.get("from", message.get("role"))
    text = message.get("value", message.get("content"))
    # A problem is named by the key the file uses (ShareGPT's from/value, OpenAI's role/content).
    openai = "from" not in message and "value" not in message and ("role" in message or "content" in message)
    role_key = "role" if "from" not in message and ("role" in message or openai) else "from"
    text_key = "content" if "value" not in message and ("content" in message or openai) else "value"
    if not isinstance(text, str) or not text.strip():
        raise DatasetError(where, "a turn without text", number, f"conversations.{text_key}")
    # A role that is no text (a list, an object) is no role either; checked as text first, since
    # a list cannot be looked up among the roles (unhashable).
    if not isinstance(role, str) or (role != "system" and role not in _USER_ROLES | _ASSISTANT_ROLES):
        raise DatasetError(where, f"unknown role {_shown(role)} (human/user, gpt/assistant or system)",
                           number, f"conversations.{role_key}")
    return role, _check_unicode(where, number, f"conversations.{text_key}", text)
