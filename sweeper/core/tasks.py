"""The task registry: datasets sweeper generates as text, with reference answers, from settings
in the sweep file (``dataset: arithmetic`` or ``dataset: {arithmetic: {size: 200, difficulty: 2}}``;
``dataset: choices``: the bundled multiple-choice questions).

A task is made on the driver (to check and hash it) and again on each actor (``task_records``),
from its settings alone: no file travels. Its content hash (``records_sha256``) is part of the
trial's identity, so a generator that draws differently is a different workload, and an actor
whose sweeper draws other problems than the driver's says so instead of measuring them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import BaseModel

from sweeper.core.arithmetic import ArithmeticSettings, arithmetic_records
from sweeper.core.choices import ChoicesSettings, choice_records
from sweeper.core.datasets import PromptRecord


@dataclass(frozen=True)
class Task:
    """A generated dataset: its settings model (the sweep file's mapping under its name) and
    the records it makes from them."""

    name: str
    settings: type[BaseModel]
    records: Callable[[Any], list[PromptRecord]]
    description: str


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("arithmetic", ArithmeticSettings, arithmetic_records,
         "word problems with exact whole-number answers (score with scoring: numeric)"),
    Task("choices", ChoicesSettings, choice_records,
         "multiple-choice questions, four choices each, dealt from a seed (score with scoring: choice)"),
)}


def task_json(name: str, settings: BaseModel) -> str:
    """A task and its settings as canonical JSON, ``{"arithmetic": {...}}``: how a trial carries it."""
    return json.dumps({name: settings.model_dump(mode="json")}, sort_keys=True, separators=(",", ":"))


def task_records(spec: str) -> list[PromptRecord]:
    """The records of a task carried as ``task_json``."""
    ((name, values),) = json.loads(spec).items()
    task = TASKS[name]
    return task.records(task.settings.model_validate(values))


def records_sha256(records: list[PromptRecord]) -> str:
    """The content hash of generated records (every field, in order)."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(json.dumps(asdict(record), sort_keys=True).encode() + b"\n")
    return digest.hexdigest()
