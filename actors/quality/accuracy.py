"""Scoring a trial's measured replies against their prompts' answers (the sweep file's ``scoring``).

The replies are the measured window's own (offline: every sequence of every measured generate
call; serving: every completed request of the measured run), so the accuracy is that of the
very work whose energy the trial reports: no second pass, no other decoding. Each judged
request's record says so (``correct``, ``extracted_answer``, ``truncated``); the trial's
``Accuracy`` part sums them, with energy per correct answer over the judged requests' own
energy shares (``RequestRecord.energy_j``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sweeper.core.results import Accuracy, RequestRecord
from sweeper.core.scoring import Reference, ScoringSettings, judge, wilson_interval

if TYPE_CHECKING:  # types only: quality sits below the backends, workload and serving it reads
    from actors.records import Generation
    from actors.serving.conversations import ConversationScript
    from actors.serving.records import ServedRequest
    from actors.workload import DatasetSource, Prompt


# What a request row keeps of a judged reply: enough to read the verdict's grounds (a task's
# replies are short), bounded so that a rambling reply cannot swell requests.parquet.
REPLY_CHARS = 2000


@dataclass(frozen=True)
class Reply:
    """One measured reply to judge: its text, its prompt's answer, whether it reached its output
    length (the cap of a reply that ends where the model ends it), and which question it answers
    (a window that sends a prompt again asks the same question again; None: a question of its own)."""

    text: str
    reference: Reference
    cut: bool
    question: Hashable | None = None


def _text(ids: Sequence[int] | None, text: str | None, decode: Callable[[Sequence[int]], str] | None) -> str:
    """A reply's text: as the server streamed it, else its ids decoded (no tokens: empty)."""
    if text is not None:
        return text
    if not ids:
        return ""
    if decode is None:
        raise ValueError("scoring: the reply came as token ids and the model has no tokenizer to read them")
    return decode(ids)


def offline_replies(dataset: DatasetSource, generations: Sequence[Generation],
                    batch_size: int) -> list[Reply | None]:
    """The window's replies in the order of its request records (``actors.measure.request_records``):
    call by call, each call's sequences in its batch's order; None for a prompt without an answer."""
    replies: list[Reply | None] = []
    for i, generation in enumerate(generations):
        prompts = dataset.taken(i, batch_size)
        for prompt, timing in zip(prompts, generation.requests, strict=True):
            replies.append(_reply(prompt, timing.reply_ids, None, timing.output_tokens, dataset.decode))
    return replies


def served_replies(dataset: DatasetSource, requests: Sequence[ServedRequest]) -> list[Reply | None]:
    """A serving run's replies in its requests' order (None: failed, or a prompt without an answer).
    The run's requests are ``dataset.requests(n, 0)`` by index (``actors.serving.arrivals``)."""
    prompts = dataset.requests(len(requests), 0)
    return [_reply(prompts[r.index], r.reply_ids, r.reply_text, r.output_tokens, dataset.decode) if r.ok else None
            for r in requests]


def conversation_replies(script: ConversationScript, requests: Sequence[ServedRequest]) -> list[Reply | None]:
    """A conversation run's replies in its requests' order: each turn the file gives an answer,
    judged on the reply the model gave it there (its history the conversation so far); None for
    a turn without an answer, or one that failed."""
    replies: list[Reply | None] = []
    for r in requests:
        where = script.turn_of(r.index)
        turn, output_len = script.turn(*where) if where is not None else (None, 0)
        if turn is None or turn.answer is None or not r.ok:
            replies.append(None)
            continue
        replies.append(Reply(script.reply_text(r), Reference(turn.answer), cut=r.output_tokens >= output_len,
                             question=where))
    return replies


def _reply(prompt: Prompt, ids: Sequence[int] | None, text: str | None, tokens: int,
           decode: Callable[[Sequence[int]], str] | None) -> Reply | None:
    if prompt.reference is None:
        return None
    return Reply(_text(ids, text, decode), prompt.reference, cut=tokens >= prompt.output_len,
                 question=prompt.text if prompt.text is not None else prompt.ids.tobytes())


def score(records: Sequence[RequestRecord], replies: Sequence[Reply | None],
          settings: ScoringSettings) -> tuple[list[RequestRecord], Accuracy]:
    """Each record with its reply's judgement (records and replies in one order), and the trial's
    accuracy over them."""
    judged: list[RequestRecord] = []
    scored: list[RequestRecord] = []
    questions: list[Hashable] = []
    for i, (record, reply) in enumerate(zip(records, replies, strict=True)):
        if reply is None:
            judged.append(record)
            continue
        j = judge(reply.text, reply.reference, settings, cut=reply.cut)
        judged.append(dataclasses.replace(record, correct=j.correct, extracted_answer=j.extracted,
                                          truncated=j.truncated, reply=reply.text[:REPLY_CHARS]))
        scored.append(judged[-1])
        questions.append(reply.question if reply.question is not None else ("reply", i))
    return judged, accuracy_of(scored, questions)


def accuracy_of(scored: Sequence[RequestRecord], questions: Sequence[Hashable] | None = None) -> Accuracy:
    """The trial's figures over its judged requests, ``questions[i]`` the question request i
    answers (None: each a question of its own).

    The accuracy weighs each distinct question once: the mean over questions of the share of
    its replies judged right. A window longer than its dataset sends prompts again, and a
    greedy engine answers a prompt it has seen the same way: a repeat is the same draw again,
    not a new one, so counting replies would weigh the repeated prompts more and narrow the
    interval without cause. The Wilson interval is over the distinct questions (for shares
    between 0 and 1 it is conservative: their mean varies no more than 0/1 outcomes would).
    Energy per correct answer divides the judged requests' own energy (their shares of the
    window's, ``energy_j``) by the correct replies: the cost of the answers, wrong ones
    included, per answer that was right."""
    n = len(scored)
    if n == 0:
        return Accuracy(n_scored=0, n_correct=0, n_questions=0, n_truncated=0)
    correct = sum(1 for r in scored if r.correct)
    accuracy, n_questions = _question_mean([bool(r.correct) for r in scored], questions)
    interval = wilson_interval(accuracy * n_questions, n_questions)
    assert interval is not None
    energy_j = _energy_j(scored)
    return Accuracy(
        n_scored=n, n_correct=correct, n_questions=n_questions, accuracy=accuracy,
        accuracy_ci95_low=interval[0], accuracy_ci95_high=interval[1],
        n_truncated=sum(1 for r in scored if r.truncated),
        # Null, not infinite, with no correct answer: no answer was bought at any price.
        energy_per_correct_j=energy_j / correct if energy_j is not None and correct else None,
        correct_per_kj=correct / (energy_j / 1000.0) if energy_j else None,
    )


def _question_mean(correct: Sequence[bool], questions: Sequence[Hashable] | None) -> tuple[float, int]:
    """The mean over distinct questions of each one's share of right replies, and how many."""
    by_question: dict[Hashable, list[bool]] = {}
    for i, right in enumerate(correct):
        by_question.setdefault(questions[i] if questions is not None else i, []).append(right)
    return sum(sum(v) / len(v) for v in by_question.values()) / len(by_question), len(by_question)


def _energy_j(scored: Sequence[RequestRecord]) -> float | None:
    """The judged requests' energy summed (None where any is unattributed: no GPU)."""
    energies = [r.energy_j for r in scored]
    return sum(e for e in energies if e is not None) if all(e is not None for e in energies) else None
