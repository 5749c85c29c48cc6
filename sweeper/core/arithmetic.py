"""The ``arithmetic`` task: word problems with exact whole-number answers, drawn from a seed.

Needs no download, and its truth is exact: each problem is a start and a few steps (buy,
give away, multiply, share equally), every intermediate a whole number >= 0, so the answer
is an integer the ``numeric`` scorer reads without rounding. ``difficulty`` sets the steps
and the size of the numbers:

- 1: one step, adding or taking away, numbers up to 20;
- 2: two steps, multiplying too, numbers up to 50;
- 3: three steps, sharing equally (exact division) too, numbers up to 100.

The same settings give the same problems on every node and Python version (``random.Random``
of a string seed, whose stream Python keeps).
"""

from __future__ import annotations

import random

from pydantic import Field

from sweeper.core.datasets import PromptRecord
from sweeper.core.settings import Settings

NAMES = ("Ada", "Ben", "Chloe", "Dev", "Emma", "Farid", "Grace", "Hugo", "Iris", "Jonas", "Kemi", "Liam")
ITEMS = ("apples", "marbles", "stamps", "books", "pencils", "shells", "coins", "stickers")
# Per difficulty: steps per problem, the largest number a problem states, the operations drawn.
LEVELS: dict[int, tuple[int, int, tuple[str, ...]]] = {
    1: (1, 20, ("add", "take")),
    2: (2, 50, ("add", "take", "times")),
    3: (3, 100, ("add", "take", "times", "share")),
}
INSTRUCTION = "Reply with the final number only."


class ArithmeticSettings(Settings):
    """``dataset: {arithmetic: {size, difficulty, seed}}`` (``dataset: arithmetic``: the defaults)."""

    size: int = Field(100, gt=0, le=100_000, strict=True, description="problems drawn")
    difficulty: int = Field(1, ge=1, le=max(LEVELS), strict=True, description="1: one step up to 20; 2: two "
                                                                              "steps up to 50; 3: three steps up to 100")
    seed: int = Field(0, ge=0, le=2**32 - 1, strict=True, description="the problems drawn (the workload's seed "
                                                                      "samples among them)")


def _step(rng: random.Random, op: str, value: int, top: int) -> tuple[str, int]:
    """One step's sentence and the value after it (whole, >= 0)."""
    if op == "take" and value > 0:
        b = rng.randint(1, value)
        return f"Then {{they}} give{{s}} away {b}.", value - b
    if op == "times" and value <= top:
        b = rng.randint(2, 5)
        return f"Then {{they}} get{{s}} more until {{they}} {{have}} {b} times as many.", value * b
    if op == "share" and value > 1:
        divisors = [d for d in range(2, min(value, 10) + 1) if value % d == 0]
        if divisors:
            b = rng.choice(divisors)
            return f"Then {{they}} share{{s}} them equally among {b} friends and keep{{s}} one share.", value // b
    b = rng.randint(1, top)
    return f"Then {{they}} buy{{s}} {b} more.", value + b


def problem(rng: random.Random, difficulty: int) -> tuple[str, int]:
    """One word problem and its answer."""
    steps, top, ops = LEVELS[difficulty]
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    value = rng.randint(1, top)
    sentences = [f"{name} has {value} {item}."]
    for _ in range(steps):
        sentence, value = _step(rng, rng.choice(ops), value, top)
        sentences.append(sentence.format(they=name, s="s", have="has"))
    sentences.append(f"How many {item} does {name} have now? {INSTRUCTION}")
    return " ".join(sentences), value


def arithmetic_records(settings: ArithmeticSettings) -> list[PromptRecord]:
    """The task's problems, each with its answer."""
    rng = random.Random(f"sweeper-arithmetic:{settings.seed}:{settings.difficulty}")
    records = []
    for _ in range(settings.size):
        text, answer = problem(rng, settings.difficulty)
        records.append(PromptRecord(text, answer=str(answer)))
    return records
