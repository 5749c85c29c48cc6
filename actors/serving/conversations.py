"""Multi-turn conversations replayed turn by turn: what a chat session costs.

A conversation's first turn arrives by the workload's arrival process, like any request;
each later turn is sent ``turn_gap_s`` after the previous reply has finished, and its prompt
is the whole history so far: the file's user turns, and as the assistant's turns either what
the model under test replied (``history: model``, a real session: the engine's prefix cache
meets its own replies again) or the file's replies (``history: reference``). A turn that fails
ends its conversation there; the others go on.

``ConversationScript`` is what a client loop asks when a request finishes: is there a next
turn, and what is it. Request indices are fixed by the conversation and the turn, not by
the order replies happen to end in, so two runs of a trial number their requests alike.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from actors.serving.records import ServedRequest, ServedRun, ServingRequest
from sweeper.core.datasets import ConversationRecord, ConversationTurn, fallback_tokens
from sweeper.core.results import Conversations
from sweeper.core.settings import ConversationSettings

# A reply as the history holds it: text (what an HTTP server streamed) or token ids (an
# in-process engine's, or made up for an engine that produces none: the simulated one).
Reply = str | tuple[int, ...]


class HistoryEncoder:
    """A conversation's history as the prompt the engine is sent: through the model's chat
    template (``chat``), as the turns' texts one after another, or, for a model without a
    tokenizer (synthetic), as seeded ids per message, so that a longer history starts with
    exactly the tokens of the shorter one and a prefix cache can find them."""

    def __init__(self, tokenizer: Any, chat: bool, vocab_size: int, seed: int) -> None:
        self.tokenizer, self.chat, self.vocab_size, self.seed = tokenizer, chat, vocab_size, seed

    def text(self, reply: Reply) -> str:
        if isinstance(reply, str):
            return reply
        if self.tokenizer is not None:
            return self.tokenizer.decode(list(reply), skip_special_tokens=True)
        return " ".join(f"t{i}" for i in reply)  # no tokenizer: a stand-in of the same length

    def messages(self, system: str | None, history: Sequence[tuple[str, Reply]], user: str) -> tuple[tuple[str, str], ...]:
        """The history as chat messages (role, text): what a chat endpoint is sent."""
        out = [("system", system)] if system else []
        for asked, reply in history:
            out += [("user", asked), ("assistant", self.text(reply))]
        return (*out, ("user", user))

    def ids(self, system: str | None, history: Sequence[tuple[str, Reply]], user: str) -> np.ndarray:
        if self.tokenizer is None:
            parts = [self._made_up(system)] if system else []
            for asked, reply in history:
                parts += [self._made_up(asked), np.asarray(reply, dtype=np.int64) if isinstance(reply, tuple)
                          else self._made_up(reply)]
            return np.concatenate([*parts, self._made_up(user)])
        messages = self.messages(system, history, user)
        if self.chat:
            if not getattr(self.tokenizer, "chat_template", None):
                raise ValueError("workload.chat is true but the model's tokenizer has no chat template")
            ids = self.tokenizer.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                                     add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        else:
            ids = self.tokenizer("\n\n".join(c for _, c in messages))["input_ids"]
        return np.asarray(ids, dtype=np.int64)

    def _made_up(self, text: str) -> np.ndarray:
        # Seeded by the text's checksum (not hash(): that differs between processes).
        low = min(8, max(self.vocab_size - 1, 0))
        rng = np.random.default_rng([self.seed, zlib.crc32(text.encode()), 2**24])
        return rng.integers(low, self.vocab_size, size=fallback_tokens(text), dtype=np.int64)


@dataclass(frozen=True)
class Dialogue:
    """One conversation to replay, with each turn's reply length (exact, or the cap)."""

    record: ConversationRecord
    output_lens: tuple[int, ...]
    # The file's turns: more than ``turns`` where the conversation was cut before the first turn
    # whose history would outgrow the model's context (None: not cut).
    file_turns: int | None = None

    @property
    def turns(self) -> int:
        return len(self.record.turns)

    @property
    def cut(self) -> bool:
        return self.file_turns is not None and self.file_turns > self.turns


class ConversationScript:
    """The run's conversations: their first turns at the arrival offsets, and each next turn
    built when the previous one finishes (``next_turn``)."""

    def __init__(self, dialogues: Sequence[Dialogue], offsets_s: Sequence[float], encoder: HistoryEncoder,
                 settings: ConversationSettings, stop_at_eos: bool, *, keep_answered: bool = False) -> None:
        self.dialogues, self.encoder, self.settings = list(dialogues), encoder, settings
        # A scored trial keeps the reply of every turn with an answer, to judge it after the run.
        self.stop_at_eos, self.keep_answered = stop_at_eos, keep_answered
        # Request index of conversation c's turn t: base[c] + t.
        self.base = np.concatenate([[0], np.cumsum([d.turns for d in self.dialogues])]).astype(int).tolist()
        self._where = {self.base[c] + t: (c, t) for c, d in enumerate(self.dialogues) for t in range(d.turns)}
        self._replies: dict[int, list[Reply]] = {c: [] for c in range(len(self.dialogues))}
        self.first = [self._request(c, 0, float(offset)) for c, offset in enumerate(offsets_s)]

    def turn_of(self, index: int) -> tuple[int, int] | None:
        """(conversation, turn) of a request index, or None for a request of no conversation."""
        return self._where.get(index)

    def turn(self, conversation: int, turn: int) -> tuple[ConversationTurn, int]:
        """A conversation's turn as the file has it, and its reply's length (exact, or the cap)."""
        dialogue = self.dialogues[conversation]
        return dialogue.record.turns[turn], dialogue.output_lens[turn]

    def reply_text(self, done: ServedRequest) -> str:
        """A finished turn's reply as text (the model's, where it kept one; else empty)."""
        reply = done.reply_text if done.reply_text is not None else done.reply_ids
        return self.encoder.text(reply) if reply else ""

    def turns_of(self, conversation: int) -> int:
        return self.dialogues[conversation].turns

    def next_turn(self, done: ServedRequest, t0_s: float) -> ServingRequest | None:
        """The turn that follows ``done`` (arriving ``turn_gap_s`` after it finished; offsets
        from ``t0_s``, the run's start), or None: the conversation is over, or ended by a
        failure."""
        where = self._where.get(done.index)
        if where is None or not done.ok:
            return None
        c, t = where
        if t + 1 >= self.dialogues[c].turns:
            return None
        if self.settings.history == "model":
            self._replies[c].append(self._reply(done, c, t))
        assert done.finish_s is not None  # ok
        return self._request(c, t + 1, done.finish_s - t0_s + self.settings.turn_gap_s)

    def _reply(self, done: ServedRequest, c: int, t: int) -> Reply:
        if done.reply_ids:
            return done.reply_ids
        if done.reply_text is not None:
            return done.reply_text
        # An engine that keeps no reply (the simulated one): ids of its length, seeded.
        low = min(8, max(self.encoder.vocab_size - 1, 0))
        rng = np.random.default_rng([self.encoder.seed, c, t, 2**25])
        return tuple(int(i) for i in rng.integers(low, self.encoder.vocab_size, size=done.output_tokens))

    def _request(self, c: int, t: int, offset_s: float) -> ServingRequest:
        dialogue = self.dialogues[c]
        turns = dialogue.record.turns
        if self.settings.history == "model":
            history = list(zip((x.user for x in turns[:t]), self._replies[c], strict=True))
        else:
            history = [(x.user, x.reference or "") for x in turns[:t]]
        user, system = turns[t].user, dialogue.record.system
        return ServingRequest(
            self.base[c] + t, self.encoder.ids(system, history, user), dialogue.output_lens[t], offset_s,
            self.stop_at_eos, text=user, conversation_id=c, turn=t,
            messages=self.encoder.messages(system, history, user),
            keeps_reply=(self.settings.history == "model" and t + 1 < dialogue.turns)
            or (self.keep_answered and turns[t].answer is not None))


@dataclass(frozen=True)
class _Turn:
    """One sent turn of a conversation, as its figures read it."""

    index: int  # its place in the conversation, from 0
    request: ServedRequest
    energy_j: float | None  # None: the trial split no energy by request


def conversation_figures(run: ServedRun, script: ConversationScript,
                         energies: Sequence[float] | None) -> Conversations:
    """The trial's per-conversation figures: how many conversations started and finished
    every turn, and, over the finished ones, the energy and time of a whole conversation and of
    its first and last turns (the last turn carries the longest history: the two apart show
    what the growing context costs)."""
    by_conversation = _turns_by_conversation(run, script, energies)
    finished = _finished_conversations(by_conversation, script)
    first = _completed_first_turns(by_conversation)
    return Conversations(
        n_conversations=len(script.first),
        conversations_completed=len(finished),
        conversations_cut=sum(1 for d in script.dialogues[:len(script.first)] if d.cut),
        turns_per_conversation=float(np.mean([d.turns for d in script.dialogues])) if script.dialogues else None,
        energy_per_conversation_j=_mean([_energy_j(turns) for turns in finished]) if energies else None,
        # Without energies every turn's is None, and so are these means.
        first_turn_energy_j=_mean([t.energy_j for t in first]),
        last_turn_energy_j=_mean([turns[-1].energy_j for turns in finished]),
        first_turn_ttft_s=_mean([t.request.ttft_s for t in first]),
        last_turn_ttft_s=_mean([turns[-1].request.ttft_s for turns in finished]),
        conversation_s=_mean([_span_s(turns[0].request, turns[-1].request) for turns in finished]),
    )


def _turns_by_conversation(run: ServedRun, script: ConversationScript,
                           energies: Sequence[float] | None) -> dict[int, list[_Turn]]:
    """The run's turns by conversation (each in the run's order), each with its energy."""
    by_conversation: dict[int, list[_Turn]] = {}
    for k, r in enumerate(run.requests):
        where = script.turn_of(r.index)
        if where is not None:
            by_conversation.setdefault(where[0], []).append(_Turn(where[1], r, energies[k] if energies else None))
    return by_conversation


def _finished_conversations(by_conversation: dict[int, list[_Turn]], script: ConversationScript) -> list[list[_Turn]]:
    """The conversations every turn of which was sent and finished ok, each in turn order."""
    return [sorted(turns, key=lambda turn: turn.index) for c, turns in by_conversation.items()
            if len(turns) == script.turns_of(c) and all(turn.request.ok for turn in turns)]


def _completed_first_turns(by_conversation: dict[int, list[_Turn]]) -> list[_Turn]:
    """Every conversation's first turn that finished ok, whether or not its conversation did."""
    return [turn for turns in by_conversation.values() for turn in turns if turn.index == 0 and turn.request.ok]


def _energy_j(turns: Sequence[_Turn]) -> float:
    """The energy of a conversation's turns together (a turn without its own counting none)."""
    return sum(turn.energy_j or 0.0 for turn in turns)


def _mean(values: Sequence[float | None]) -> float | None:
    """The mean of the values that are known (None: none is)."""
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _span_s(first: ServedRequest, last: ServedRequest) -> float | None:
    if first.submit_s is None or last.finish_s is None:
        return None
    return last.finish_s - first.submit_s
