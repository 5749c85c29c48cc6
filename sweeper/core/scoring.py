"""Scoring replies against reference answers: the sweep file's ``scoring`` block, the scorer
registry, and the trial's accuracy with its Wilson interval.

A scorer reads the answer out of a reply (``extract``) and says whether it is the reference
(``matches``); both are plain text functions, with no model or tokenizer, so the control plane
validates the block and the actor scores with the same code. Every scorer is an entry of
``SCORERS``: a new one is a function pair and an entry, and nothing else names them.

- ``exact``: the whole reply, normalised (``normalise``: case folded, punctuation dropped,
  whitespace collapsed), equals the normalised answer;
- ``numeric``: the number after the reply's last GSM8K ``####`` marker, else its last number,
  within ``tolerance`` x max(1, |answer|) of the answer's;
- ``regex``: the first match of ``pattern`` in the reply, its first group (the whole match
  without groups), normalised, equals the normalised answer;
- ``choice``: the choice the reply names, by letter (``B``, ``(B)``, ``B.``, ``answer is B``)
  or by the choice's text, is the reference's; with ``likelihood``, each question is also scored
  by the choice the model finds likeliest after the prompt (``actors.quality.likelihood``).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from sweeper.core.datasets import LETTERS
from sweeper.core.settings import Settings

# Where a reply or answer is kept in the requests table, it is cut to this many characters:
# an answer is a word or a number; a longer one is a reply the scorer read whole (exact).
MAX_ANSWER_CHARS = 200
# The two-sided 95 % normal quantile, for the Wilson interval.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Reference:
    """A prompt's reference answer: its text (a choice's letter for multiple choice) and, for
    multiple choice, the choices in order (the letters A, B, ... name them)."""

    answer: str
    choices: tuple[str, ...] | None = None

    def choice_text(self) -> str | None:
        """The text of the reference choice, for multiple choice."""
        if self.choices is None or len(self.answer) != 1 or self.answer not in LETTERS[:len(self.choices)]:
            return None
        return self.choices[LETTERS.index(self.answer)]


@dataclass(frozen=True)
class Judgement:
    """One reply judged: right or wrong, what the scorer read from it (None: nothing), and
    whether the output length cut it (then only an answer it stated before the cut counts)."""

    correct: bool
    extracted: str | None
    truncated: bool


class ScoringSettings(Settings):
    """How a reply is judged against its prompt's answer (the sweep file's ``scoring``)."""

    method: str = Field(description="exact | numeric | regex | choice (sweeper.core.scoring.SCORERS)")
    pattern: str | None = Field(None, max_length=1000, description="regex: its first group (or whole match) is the answer")
    tolerance: float | None = Field(None, ge=0, le=1e6, description="numeric: how far from the answer a number may be, "
                                                                    "times max(1, |answer|) (default 1e-6)")
    likelihood: bool = Field(False, description="choice: also score each question by the log-likelihood the model "
                                                "gives each choice's text after the prompt (lm-evaluation-harness's "
                                                "acc and acc_norm), in a pass after the measured window; engines "
                                                "with prompt log-probabilities (transformers, in-process vLLM)")

    DEFAULT_TOLERANCE: ClassVar[float] = 1e-6

    @model_validator(mode="before")
    @classmethod
    def _method_alone(cls, data: object) -> object:
        """``scoring: numeric`` is ``scoring: {method: numeric}``."""
        return {"method": data} if isinstance(data, str) else data

    @field_validator("method")
    @classmethod
    def _known(cls, method: str) -> str:
        if method not in SCORERS:
            raise ValueError(f"unknown scoring method {method!r}; known: {', '.join(SCORERS)}")
        return method

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression ({exc})") from None
        return pattern

    @model_validator(mode="after")
    def _fields_of_the_method(self) -> ScoringSettings:
        needs = SCORERS[self.method].settings
        if "pattern" in needs and self.pattern is None:
            raise ValueError(f"pattern: required by method {self.method} (its first group is the answer)")
        for key in ("pattern", "tolerance"):
            if key not in needs and getattr(self, key) is not None:
                raise ValueError(f"{key}: not used by method {self.method}; remove it")
        if self.likelihood and "likelihood" not in needs:
            raise ValueError(f"likelihood: scores a question's choices, and method {self.method} has none "
                             "(use method: choice)")
        return self

    @property
    def numeric_tolerance(self) -> float:
        return self.tolerance if self.tolerance is not None else self.DEFAULT_TOLERANCE

    def canonical_json(self) -> str:
        # likelihood joined later: in the text (and so in trial ids) only when set.
        exclude = {"likelihood"} if not self.likelihood else set()
        return json.dumps(self.model_dump(mode="json", exclude_none=True, exclude=exclude), sort_keys=True,
                          separators=(",", ":"))

    def describe(self) -> str:
        """The method as a plan note names it (``numeric (tolerance 1e-06)``)."""
        extra = [f"pattern {self.pattern!r}" if self.pattern is not None else "",
                 f"tolerance {self.numeric_tolerance:g}" if self.method == "numeric" else "",
                 "and by each choice's likelihood" if self.likelihood else ""]
        extra = [e for e in extra if e]
        return self.method + (f" ({', '.join(extra)})" if extra else "")


# -- normalisation and extraction -------------------------------------------------------------

_SPACE = re.compile(r"\s+")


def normalise(text: str) -> str:
    """Case folded, every punctuation character (Unicode category P) dropped, whitespace
    collapsed to single spaces and trimmed."""
    kept = "".join(c for c in text.casefold() if not unicodedata.category(c).startswith("P"))
    return _SPACE.sub(" ", kept).strip()


# A number as replies write it: a sign, thousands separators, a decimal part, an exponent; a
# currency sign or a unit around it is no part of it.
_NUMBER = re.compile(r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_GSM8K_MARK = "####"


def parse_number(text: str) -> float | None:
    """``text`` as a number (thousands separators, a Unicode minus and a trailing full stop
    allowed), or None."""
    cleaned = text.strip().rstrip(".").replace(",", "").replace("−", "-").lstrip("$€£")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _numbers(text: str) -> list[str]:
    return [m.group() for m in _NUMBER.finditer(text)]


def extract_numeric(reply: str, settings: ScoringSettings) -> str | None:
    """The number after the reply's last ``####`` (GSM8K's final-answer marker), else the last
    number of the reply."""
    if _GSM8K_MARK in reply:
        after = _numbers(reply.rsplit(_GSM8K_MARK, 1)[1])
        if after:
            return after[0]
    found = _numbers(reply)
    return found[-1] if found else None


# An answer a reply states as its answer: after GSM8K's marker, or after "answer is" / "answer:",
# and followed by more text, so that the cut did not fall inside it (a "36" cut from "360").
_STATED_NUMBER = re.compile(r"(?:####|\banswer(?:\s+is)?\s*[:\-]?)\s*[$€£]?(" + _NUMBER.pattern + r")(?=\D)",
                            re.IGNORECASE)


def stated_numeric(reply: str, settings: ScoringSettings) -> str | None:
    """The last number the reply states as its answer (``####``, "answer is", "answer:")."""
    found = _STATED_NUMBER.findall(reply)
    return found[-1] if found else None


def matches_numeric(extracted: str, reference: Reference, settings: ScoringSettings) -> bool:
    got, want = parse_number(extracted), parse_number(reference.answer)
    if got is None or want is None:
        return False
    return abs(got - want) <= settings.numeric_tolerance * max(1.0, abs(want))


def extract_exact(reply: str, settings: ScoringSettings) -> str | None:
    text = normalise(reply)
    return text or None


def matches_exact(extracted: str, reference: Reference, settings: ScoringSettings) -> bool:
    return normalise(extracted) == normalise(reference.answer)


def extract_regex(reply: str, settings: ScoringSettings) -> str | None:
    assert settings.pattern is not None  # the settings' own check
    return _match_value(re.search(settings.pattern, reply))


def _match_value(found: re.Match[str] | None) -> str | None:
    """A regex answer: the match's first group (the whole match without groups), if not blank."""
    if found is None:
        return None
    value = found.group(1) if found.re.groups else found.group()
    return value if value is not None and value.strip() else None


def stated_regex(reply: str, settings: ScoringSettings) -> str | None:
    """The pattern's first match where the reply goes on after it (the user's pattern says what
    an answer looks like; one at the reply's very end may be cut short)."""
    assert settings.pattern is not None
    found = re.search(settings.pattern, reply)
    return _match_value(found) if found is not None and found.end() < len(reply) else None


# A choice named by its letter: the whole reply a letter ("B", "(B)", "B.", "B) ..."), or after
# "answer is" / "answer:".
_LETTER_ALONE = re.compile(r"^\s*\(?([A-Za-z])\)?(?:[.):]|\s|$)")
_LETTER_STATED = re.compile(r"answer(?:\s+is)?\s*[:\-]?\s*\(?([A-Za-z])\)?(?![A-Za-z])", re.IGNORECASE)


def extract_choice(reply: str, settings: ScoringSettings, choices: tuple[str, ...] | None = None) -> str | None:
    """The letter of the choice the reply names: a letter alone at its start, a letter after
    "answer is", else the one choice whose text the reply holds (normalised)."""
    valid = LETTERS[:len(choices)] if choices else LETTERS
    for pattern in (_LETTER_ALONE, _LETTER_STATED):
        found = pattern.search(reply)
        if found is not None and found.group(1).upper() in valid:
            return found.group(1).upper()
    if choices:
        said = normalise(reply)
        named = [i for i, c in enumerate(choices) if normalise(c) and normalise(c) in said]
        # Only where one choice's text alone is in it: a reply listing several names none.
        longest = max(named, key=lambda i: len(choices[i]), default=None)
        if longest is not None and all(normalise(choices[i]) in normalise(choices[longest]) for i in named):
            return LETTERS[longest]
    return None


def stated_choice(reply: str, settings: ScoringSettings, choices: tuple[str, ...] | None = None) -> str | None:
    """The letter the reply names as its answer: alone at its start, or the last after "answer is"."""
    valid = LETTERS[:len(choices)] if choices else LETTERS
    found = _LETTER_ALONE.search(reply)
    if found is not None and found.group(1).upper() in valid and found.end() < len(reply):
        return found.group(1).upper()
    stated = [m.group(1).upper() for m in _LETTER_STATED.finditer(reply)
              if m.group(1).upper() in valid and m.end() < len(reply)]
    return stated[-1] if stated else None


def matches_choice(extracted: str, reference: Reference, settings: ScoringSettings) -> bool:
    return extracted.upper() == reference.answer.upper()


@dataclass(frozen=True)
class Scorer:
    """One scoring method: how it reads the answer out of a reply, how it compares it, and the
    settings it takes beside ``method``."""

    name: str
    extract: Callable[[str, ScoringSettings, Reference], str | None]
    matches: Callable[[str, Reference, ScoringSettings], bool]
    settings: frozenset[str] = frozenset()
    # The answer a reply the output length cut had stated before the cut (None where it stated
    # none); a scorer without it (exact: the whole reply is the answer) counts every cut reply wrong.
    stated: Callable[[str, ScoringSettings, Reference], str | None] | None = None


SCORERS: dict[str, Scorer] = {s.name: s for s in (
    Scorer("exact", lambda reply, s, ref: extract_exact(reply, s), matches_exact),
    Scorer("numeric", lambda reply, s, ref: extract_numeric(reply, s), matches_numeric, frozenset({"tolerance"}),
           lambda reply, s, ref: stated_numeric(reply, s)),
    Scorer("regex", lambda reply, s, ref: extract_regex(reply, s), matches_exact, frozenset({"pattern"}),
           lambda reply, s, ref: stated_regex(reply, s)),
    Scorer("choice", lambda reply, s, ref: extract_choice(reply, s, ref.choices), matches_choice,
           frozenset({"likelihood"}), lambda reply, s, ref: stated_choice(reply, s, ref.choices)),
)}


def judge(reply: str, reference: Reference, settings: ScoringSettings, *, cut: bool) -> Judgement:
    """One reply against its reference. ``cut``: the output length ended the reply before the
    model did. Such a reply is truncated, and it is judged only on an answer it had stated as
    its answer before the cut (``Scorer.stated``): its last number may be a step of its working,
    its letter one of several it meant to weigh, but "#### 22" or "the answer is 22" followed by
    a loop of restatements is an answer given (406 cut GPU replies read, BENCHMARKS §35).
    Without a stated answer it is wrong, with what the scorer read kept for a look."""
    scorer = SCORERS[settings.method]
    if cut:
        stated = scorer.stated(reply, settings, reference) if scorer.stated is not None else None
        if stated is not None:
            return Judgement(scorer.matches(stated, reference, settings), stated[:MAX_ANSWER_CHARS], True)
    extracted = scorer.extract(reply, settings, reference)
    shown = extracted[:MAX_ANSWER_CHARS] if extracted is not None else None
    if cut:
        return Judgement(False, shown, True)
    return Judgement(extracted is not None and scorer.matches(extracted, reference, settings), shown, False)


def wilson_interval(correct: float, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of ``correct`` successes in ``n`` trials (None for n = 0): it
    stays inside [0, 1] and is not empty at 0 or n successes, as the normal approximation is.
    ``correct`` may be fractional: n times a mean of shares (``accuracy_of``)."""
    if n <= 0:
        return None
    p = correct / n
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0 or n successes an end is p itself, which rounding may leave a hair inside.
    return max(0.0, min(centre - half, p)), min(1.0, max(centre + half, p))
