"""The ``choices`` task: multiple-choice questions written for sweeper, shipped with it (CC0,
``sweeper/data/CHOICES-LICENSE.md``), scored by the letter a reply gives (``scoring: choice``).

40 questions of everyday science, arithmetic and geography, four choices each. The file keeps
each question's choices in the order written; the task deals them afresh from ``seed`` (the
questions' order and each one's choices), so that the right letter falls on A, B, C and D
alike and a model that always answers one letter scores about a quarter, not what the
writer's habits made it.
"""

from __future__ import annotations

import random
from importlib import resources

from pydantic import Field

from sweeper.core.datasets import LETTERS, PromptRecord, read_records
from sweeper.core.settings import Settings

CHOICES_FILE = "choices.jsonl"
# The questions the file holds (a test keeps it so).
QUESTIONS = 40


class ChoicesSettings(Settings):
    """``dataset: {choices: {size, seed}}`` (``dataset: choices``: all 40, seed 0)."""

    size: int = Field(QUESTIONS, gt=0, le=QUESTIONS, strict=True, description="questions drawn (at most 40)")
    seed: int = Field(0, ge=0, strict=True, description="the questions' order and each one's choices")


def choice_records(settings: ChoicesSettings) -> list[PromptRecord]:
    """The task's questions, each with its choices dealt and its answer's letter."""
    path = resources.files("sweeper") / "data" / CHOICES_FILE
    with resources.as_file(path) as file:
        written = read_records(file, "jsonl")
    rng = random.Random(f"sweeper-choices:{settings.seed}")
    order = rng.sample(range(len(written)), settings.size)
    records = []
    for i in order:
        record = written[i]
        assert record.choices is not None and record.answer is not None
        right = record.choices[LETTERS.index(record.answer)]
        dealt = rng.sample(record.choices, len(record.choices))
        question = record.prompt.split("\n", 1)[0]  # the file's question, before its lettered choices
        text = question + "\n" + "".join(f"{LETTERS[k]}. {c}\n" for k, c in enumerate(dealt)) + "Answer:"
        records.append(PromptRecord(text, answer=LETTERS[dealt.index(right)], choices=tuple(dealt)))
    return records
