"""Prompts for a trial: random token ids of an exact length, or a dataset's real text.

A trial draws its offline batches (``PromptSource.batch``) and its serving-mode
requests (``PromptSource.requests``) from one source:

- ``RandomSource``: random token ids of exactly ``input_len``, a fresh set per call
  (so no prefix or KV reuse can flatter a backend), the whole sequence fixed by the seed;
- ``SharedPrefixSource``: the same, after one of a few shared prefixes (``prefix_repetition``:
  the reuse a prefix cache exists for, on purpose);
- ``DatasetSource``: a prompt file's prompts (``sweeper.core.datasets``), tokenized
  with the model's tokenizer (in its chat template when asked), filtered by length and
  sampled with the seed; batches and requests go through the sample in order, cycling;
- ``ConversationSource``: a prompt file's conversations, replayed turn by turn in serving
  mode (``actors.serving.conversations``).

Each prompt carries the output length it asks for: the trial's exact ``output_len``,
its cap (natural lengths: the reply ends at EOS), or its record's reference length.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from actors.records import PromptBatch
from actors.serving.conversations import ConversationScript, Dialogue, HistoryEncoder
from sweeper.core.datasets import (
    BYTES_PER_TOKEN_FALLBACK,
    ConversationRecord,
    PromptRecord,
    fallback_tokens,
    read_conversations,
    read_records,
    sha256_of,
)
from sweeper.core.scoring import Reference
from sweeper.core.settings import ConversationSettings, DatasetSettings, SharedPrefix
from sweeper.core.tasks import records_sha256, task_records
from sweeper.core.trial import Trial

__all__ = ["BYTES_PER_TOKEN_FALLBACK", "ConversationSource", "DatasetSource", "NoPromptsLeft", "Prompt", "PromptSource", "PromptSources",
           "RandomPrompts", "RandomSource", "SharedPrefixSource", "dataset_prompts", "prompt_source"]


class RandomPrompts:
    """Random-token prompts, a fresh batch per iteration.

    Each call gets different tokens (so no prefix or KV reuse can flatter a
    backend) while the whole sequence of batches is fixed by the seed.
    """

    def __init__(self, vocab_size: int, input_len: int, batch_size: int, seed: int,
                 reserved_low: int = 8):
        # The lowest ids are usually special tokens (pad/bos/eos); avoid them.
        low = min(reserved_low, max(vocab_size - 1, 0))
        self.low, self.high = low, vocab_size
        self.input_len, self.batch_size, self.seed = input_len, batch_size, seed

    def batch(self, iteration: int) -> np.ndarray:
        # Warmup batches use negative iterations, so they never equal a measured one.
        rng = np.random.default_rng([self.seed, iteration + 2**20])
        return rng.integers(self.low, self.high, size=(self.batch_size, self.input_len), dtype=np.int64)


@dataclass(frozen=True)
class Prompt:
    ids: np.ndarray  # (tokens,) int64
    output_len: int  # tokens to generate: exact, or the cap when the reply ends at EOS
    # A dataset prompt's own text, before any chat template: what a chat endpoint is sent.
    text: str | None = None
    # Its reference answer, where the dataset gives one (a scored trial judges the reply by it).
    reference: Reference | None = None


class PromptSource(ABC):
    stop_at_eos: bool = False

    @abstractmethod
    def batch(self, iteration: int, batch_size: int) -> PromptBatch:
        """Offline mode's generate call ``iteration`` (negative: warm-up)."""

    @abstractmethod
    def requests(self, count: int, stream: int) -> list[Prompt]:
        """Serving mode's prompts for ``count`` requests; ``stream`` > 0: warm-up runs."""

    def varies(self) -> bool:
        """Whether prompts or replies differ in length (offline batches need padding)."""
        return True


class RandomSource(PromptSource):
    def __init__(self, vocab_size: int, input_len: int, output_len: int, seed: int, reserved_low: int = 8):
        self.vocab_size, self.input_len, self.output_len, self.seed = vocab_size, input_len, output_len, seed
        self.reserved_low = reserved_low

    def batch(self, iteration: int, batch_size: int) -> PromptBatch:
        ids = RandomPrompts(self.vocab_size, self.input_len, batch_size, self.seed, self.reserved_low).batch(iteration)
        return PromptBatch.uniform(ids, self.output_len)

    def requests(self, count: int, stream: int) -> list[Prompt]:
        low = min(self.reserved_low, max(self.vocab_size - 1, 0))
        rng = np.random.default_rng([self.seed, stream, 2**21])
        ids = rng.integers(low, self.vocab_size, size=(count, self.input_len), dtype=np.int64)
        return [Prompt(ids[i], self.output_len) for i in range(count)]

    def varies(self) -> bool:
        return False


class SharedPrefixSource(RandomSource):
    """Random prompts that share prefixes (the ``prefix_repetition`` dataset): each prompt is one
    of the shared prefixes — the same tokens in every call, drawn once from the seed — followed by
    its own random suffix, ``input_len`` tokens in all. Within a call the prefixes are dealt
    evenly and shuffled (seeded), as vLLM's benchmark deals them; offline, each call's deal goes
    on from the last one's, so calls smaller than ``num_prefixes`` send every prefix in turn.

    Warm-up calls use the same prefixes, so an engine with prefix caching measures with its cache
    warm, as a service with long-lived shared system prompts runs.
    """

    def __init__(self, vocab_size: int, input_len: int, output_len: int, seed: int, shared: SharedPrefix,
                 reserved_low: int = 8):
        if shared.prefix_len >= input_len:
            raise ValueError(f"prefix_len {shared.prefix_len} leaves no suffix in {input_len}-token prompts")
        super().__init__(vocab_size, input_len - shared.prefix_len, output_len, seed, reserved_low)
        low = min(reserved_low, max(vocab_size - 1, 0))
        self.prefixes = np.random.default_rng([seed, 2**22]).integers(
            low, vocab_size, size=(shared.num_prefixes, shared.prefix_len), dtype=np.int64)

    def _prefixed(self, suffixes: np.ndarray, call: int, first: int = 0) -> np.ndarray:
        """The suffixes after prefixes ``first``, ``first + 1``, ... (cycling), shuffled."""
        count, k = len(suffixes), len(self.prefixes)
        which = np.random.default_rng([self.seed, call + 2**20, 2**23]).permutation((first + np.arange(count)) % k)
        return np.concatenate([self.prefixes[which], suffixes], axis=1)

    def batch(self, iteration: int, batch_size: int) -> PromptBatch:
        suffixes = RandomPrompts(self.vocab_size, self.input_len, batch_size, self.seed, self.reserved_low).batch(iteration)
        # Each call is dealt on from where the one before it stopped (call i starts at prefix
        # i * batch_size): a batch smaller than num_prefixes sends a few of them, and the calls in
        # turn send them all, where a deal from prefix 0 sent prefixes 0..batch_size-1 every time.
        # Warm-up calls (negative) take the prefixes before 0, the last ones, the same way.
        return PromptBatch.uniform(self._prefixed(suffixes, iteration, iteration * batch_size), self.output_len)

    def requests(self, count: int, stream: int) -> list[Prompt]:
        suffixes = np.stack([p.ids for p in super().requests(count, stream)]) if count else \
            np.empty((0, self.input_len), dtype=np.int64)
        # A serving run is one deal, from prefix 0: num_prompts, where given, is at least
        # num_prefixes (the sweep file's check).
        ids = self._prefixed(suffixes, -stream - 1)  # never a batch's call number
        return [Prompt(ids[i], self.output_len) for i in range(count)]


class DatasetSource(PromptSource):
    def __init__(self, prompts: list[Prompt], stop_at_eos: bool, decode: Callable[[Sequence[int]], str] | None = None):
        if not prompts:
            raise ValueError("a dataset source needs prompts")
        self.prompts, self.stop_at_eos = prompts, stop_at_eos
        # A reply's token ids as text (the model's tokenizer), for scoring; None: no tokenizer.
        self.decode = decode

    def _take(self, start: int, count: int) -> list[Prompt]:
        n = len(self.prompts)
        return [self.prompts[(start + j) % n] for j in range(count)]

    def taken(self, iteration: int, batch_size: int) -> list[Prompt]:
        """The prompts of offline generate call ``iteration``, in the batch's order."""
        # Warm-up (negative iterations) takes the sample's tail, measured calls its head onward.
        return self._take(iteration * batch_size, batch_size)

    def batch(self, iteration: int, batch_size: int) -> PromptBatch:
        chosen = self.taken(iteration, batch_size)
        return PromptBatch(tuple(p.ids for p in chosen), tuple(p.output_len for p in chosen), self.stop_at_eos)

    def requests(self, count: int, stream: int) -> list[Prompt]:
        return self._take(stream * count, count)


class ConversationSource(PromptSource):
    """A prompt file's conversations (``actors.serving.conversations``): serving runs replay them
    turn by turn (``script``); warm-up bursts send first turns (``requests``)."""

    def __init__(self, dialogues: list[Dialogue], encoder: HistoryEncoder, settings: ConversationSettings,
                 stop_at_eos: bool):
        if not dialogues:
            raise ValueError("a conversation source needs conversations")
        self.dialogues, self.encoder, self.settings, self.stop_at_eos = dialogues, encoder, settings, stop_at_eos
        self._firsts = [Prompt(encoder.ids(d.record.system, [], d.record.turns[0].user), d.output_lens[0],
                               d.record.turns[0].user) for d in dialogues]

    def batch(self, iteration: int, batch_size: int) -> PromptBatch:
        raise ValueError("conversations are replayed in serving mode only")

    def requests(self, count: int, stream: int) -> list[Prompt]:
        n = len(self._firsts)
        return [self._firsts[(stream * count + j) % n] for j in range(count)]

    def script(self, offsets_s: Sequence[float], *, keep_answered: bool = False) -> ConversationScript:
        """One conversation per arrival offset, the sample's in order (cycled if shorter);
        ``keep_answered``: keep each answered turn's reply (a scored trial judges them)."""
        n = len(self.dialogues)
        chosen = [self.dialogues[j % n] for j in range(len(offsets_s))]
        return ConversationScript(chosen, offsets_s, self.encoder, self.settings, self.stop_at_eos,
                                  keep_answered=keep_answered)


class NoPromptsLeft(ValueError):
    """A dataset with no prompt within the trial's length bounds for this model."""


_LOAD = object()  # prompt_source's tokenizer argument: load the model's own


def prompt_source(trial: Trial, vocab_size: int, max_positions: int | None = None,
                  tokenizer: Any = _LOAD) -> PromptSource:
    """The trial's prompts on this actor (``max_positions``: the loaded model's context;
    ``tokenizer``: the model's, where the caller holds it already)."""
    if trial.prompts is None:
        assert trial.input_len is not None  # random prompts always have a length (the sweep file's check)
        if trial.shared_prefix is not None:
            return SharedPrefixSource(vocab_size, trial.input_len, trial.output_len, trial.seed, trial.shared_prefix)
        return RandomSource(vocab_size, trial.input_len, trial.output_len, trial.seed)
    if tokenizer is _LOAD:
        tokenizer = _tokenizer(trial)
    if trial.prompts.conversations is not None:
        return conversation_source(trial.prompts, tokenizer, vocab_size, trial.seed, stop_at_eos=trial.stops_at_eos,
                                   output_lengths=trial.output_lengths, cap=trial.output_len,
                                   max_positions=max_positions)
    prompts = dataset_prompts(trial.prompts, tokenizer, vocab_size, trial.seed,
                              output_lengths=trial.output_lengths, cap=trial.output_len,
                              max_positions=max_positions)
    return DatasetSource(prompts, trial.stops_at_eos, _decoder(tokenizer))


def _decoder(tokenizer: Any) -> Callable[[Sequence[int]], str] | None:
    """A reply's ids as its text, special tokens (its EOS) left out; None without a tokenizer."""
    if tokenizer is None:
        return None

    def decode(ids: Sequence[int]) -> str:
        return str(tokenizer.decode(list(ids), skip_special_tokens=True))

    return decode


class PromptSources:
    """The prompt sources of one loaded model's trials, each built once.

    A dataset's prompts are read, tokenized and sampled once per loaded model and
    workload, not once per trial (a group's trials differ in batch size or rate, not
    in prompts); sources are stateless, so trials can share one. The tokenizer is
    loaded once too.
    """

    def __init__(self, vocab_size: int, max_positions: int | None = None) -> None:
        self.vocab_size, self.max_positions = vocab_size, max_positions
        self._sources: dict[tuple[Any, ...], PromptSource] = {}
        self._tokenizers: dict[tuple[str, str], Any] = {}

    @staticmethod
    def key(trial: Trial) -> tuple[Any, ...]:
        """What a trial's prompt source depends on: trials with one key share one source."""
        return (trial.prompts, trial.input_len, trial.output_len, trial.output_lengths, trial.seed,
                trial.stops_at_eos)

    def for_trial(self, trial: Trial) -> PromptSource:
        key = self.key(trial)
        if key not in self._sources:
            self._sources[key] = prompt_source(trial, self.vocab_size, self.max_positions,
                                               tokenizer=self.tokenizer(trial) if trial.prompts else None)
        return self._sources[key]

    def tokenizer(self, trial: Trial) -> Any:
        """The trial's model's tokenizer (None for a synthetic preset), loaded once."""
        model = (trial.model_source, trial.model_location)
        if model not in self._tokenizers:
            self._tokenizers[model] = _tokenizer(trial)
        return self._tokenizers[model]


def _tokenizer(trial: Trial) -> Any:
    """The model's tokenizer, or None where it has none (synthetic presets)."""
    if trial.model_source == "synthetic":
        return None
    from transformers import AutoTokenizer

    from actors.models import model_dir

    return AutoTokenizer.from_pretrained(model_dir(trial.model_source, trial.model_location))


def dataset_prompts(settings: DatasetSettings, tokenizer: Any, vocab_size: int, seed: int, *,
                    output_lengths: str, cap: int, max_positions: int | None = None) -> list[Prompt]:
    """The file's prompts as token ids: tokenized, kept within the length bounds, sampled."""
    records = dataset_records(settings)
    rng = np.random.default_rng([seed, 2**22])
    kept: list[Prompt] = []
    for index in rng.permutation(len(records)):
        record = records[int(index)]
        ids = _prompt_ids(record, tokenizer, settings.chat, vocab_size, seed, int(index))
        if settings.min_input_len is not None and len(ids) < settings.min_input_len:
            continue
        if settings.max_input_len is not None and len(ids) > settings.max_input_len:
            continue
        output_len = cap
        if output_lengths == "reference":
            output_len = min(cap, _reference_len(record, tokenizer))
        if max_positions is not None and len(ids) + output_len > max_positions:
            continue
        kept.append(Prompt(ids, output_len, record.prompt, reference_of(record)))
        if settings.num_prompts is not None and len(kept) == settings.num_prompts:
            break
    if not kept:
        bounds = [f"{k} {v}" for k, v in (("min_input_len", settings.min_input_len),
                                         ("max_input_len", settings.max_input_len)) if v is not None]
        raise NoPromptsLeft(f"dataset {settings.name}: none of its {len(records)} prompts is within "
                            f"{', '.join(bounds) or 'the model context'}"
                            + (f" ({max_positions} positions with {cap} output tokens)" if max_positions else ""))
    return kept


def conversation_source(settings: DatasetSettings, tokenizer: Any, vocab_size: int, seed: int, *, stop_at_eos: bool,
                        output_lengths: str, cap: int, max_positions: int | None = None) -> ConversationSource:
    """The file's conversations in a seeded order, ``num_prompts`` of them, each kept where its
    first turn is within the length bounds; a conversation is cut before the first turn whose
    prompt and reply would not fit the model's context (its history only grows)."""
    assert settings.conversations is not None
    path = _checked_file(settings)
    records = read_conversations(path, settings.format)
    encoder = HistoryEncoder(tokenizer, settings.chat, vocab_size, seed)
    rng = np.random.default_rng([seed, 2**22])
    kept: list[Dialogue] = []
    for index in rng.permutation(len(records)):
        record = records[int(index)]
        lens = tuple(cap if output_lengths != "reference" else min(cap, _reference_len(
            PromptRecord(t.user, None, t.reference), tokenizer)) for t in record.turns)
        first = len(encoder.ids(record.system, [], record.turns[0].user))
        if not _within(first, settings.min_input_len, settings.max_input_len):
            continue
        file_turns = len(record.turns)
        if max_positions is not None:
            record = _fitting(record, lens, encoder, max_positions)
            if not record.turns:
                continue
        kept.append(Dialogue(record, lens[:len(record.turns)], file_turns=file_turns))
        if settings.num_prompts is not None and len(kept) == settings.num_prompts:
            break
    if not kept:
        raise NoPromptsLeft(f"dataset {settings.name}: none of its {len(records)} conversations has a first turn "
                            f"within the length bounds and the model's context")
    return ConversationSource(kept, encoder, settings.conversations, stop_at_eos)


def dataset_records(settings: DatasetSettings) -> list[PromptRecord]:
    """The dataset's records: a generated task's made again from its settings (and checked to be
    the ones the plan made), else the file's, read."""
    if settings.task is None:
        return read_records(_checked_file(settings), settings.format)
    records = task_records(settings.task)
    if records_sha256(records) != settings.sha256:
        raise ValueError(f"dataset {settings.name}: this node's sweeper makes other records from {settings.task} "
                         f"than the plan's (sha256 {settings.sha256[:12]}...): run one sweeper version on every node")
    return records


def reference_of(record: PromptRecord) -> Reference | None:
    """A record's reference answer, for scoring (None: it has none)."""
    return Reference(record.answer, record.choices) if record.answer is not None else None


def _within(n: int, low: int | None, high: int | None) -> bool:
    return (low is None or n >= low) and (high is None or n <= high)


def _fitting(record: ConversationRecord, lens: tuple[int, ...], encoder: HistoryEncoder,
             max_positions: int) -> ConversationRecord:
    """The record's turns up to the last whose prompt (with every earlier turn answered at its
    full reply length, the longest it can be) and reply fit ``max_positions``."""
    total = 0
    for t, turn in enumerate(record.turns):
        total += len(encoder.ids(None, [], turn.user)) + lens[t]
        if total > max_positions:
            return ConversationRecord(record.turns[:t], record.system)
    return record


def _checked_file(settings: DatasetSettings) -> Path:
    path = Path(settings.path)
    if not path.is_file() or sha256_of(path) != settings.sha256:
        raise FileNotFoundError(f"{path} on this node is missing or differs from the file the plan read "
                                f"(sha256 {settings.sha256[:12]}...): put the same file at the same path on every node")
    return path


def _prompt_ids(record: PromptRecord, tokenizer: Any, chat: bool, vocab_size: int, seed: int,
                index: int) -> np.ndarray:
    if tokenizer is None:
        # No tokenizer: the prompt's length in fallback tokens, random ids (seeded per record).
        n = fallback_tokens(record.prompt)
        low = min(8, max(vocab_size - 1, 0))
        return np.random.default_rng([seed, index, 2**23]).integers(low, vocab_size, size=n, dtype=np.int64)
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("workload.chat is true but the model's tokenizer has no chat template")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": record.prompt}],
                                            add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    else:
        ids = tokenizer(record.prompt)["input_ids"]
    return np.asarray(ids, dtype=np.int64)


def _reference_len(record: PromptRecord, tokenizer: Any) -> int:
    if record.output_len is not None:
        return record.output_len
    assert record.reference is not None  # the plan checked every record has one or the other
    if tokenizer is None:
        return fallback_tokens(record.reference)
    return max(1, len(tokenizer(record.reference, add_special_tokens=False)["input_ids"]))


def answered(source: PromptSource) -> DatasetSource:
    """A scored trial's prompts: a dataset, whose records carry the answers its replies are
    judged against (the sweep file's check makes it one; here it is asserted)."""
    if not isinstance(source, DatasetSource):
        raise ValueError("scoring: the trial's prompts are no dataset with answers")
    return source
