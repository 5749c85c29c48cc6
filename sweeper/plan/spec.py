"""The sweep file: a pydantic schema, loaded with a strict YAML loader.

Every list axis also takes a scalar. Unknown keys, duplicate keys, values past
their bounds and non-finite numbers are errors. Every problem of a file is
raised at once, as one ``SweepFileError`` naming the file and each field.

Bounds: every value must fit the trials-table column it is stored in (int64),
and sizes are capped where larger values can only be mistakes or hangs:
batch sizes up to 65,536 sequences, lengths up to 1,048,576 tokens, seeds in
[0, 2**32), up to 1,000 repeats, tensor parallelism up to 64 GPUs, and YAML
nested at most 32 levels deep.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    BeforeValidator,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from sweeper.core.axes import AXES
from sweeper.core.backends import BACKENDS
from sweeper.core.capacity import LOAD_AXES, LoadSearch
from sweeper.core.datasets import RANDOM
from sweeper.core.errors import SweepFileError
from sweeper.core.precisions import PRECISIONS
from sweeper.core.scoring import ScoringSettings
from sweeper.core.search import SearchSettings
from sweeper.core.settings import (
    MAX_SECONDS,
    Arrival,
    ConversationSettings,
    FidelitySettings,
    History,
    MeasureSettings,
    OutputLengths,
    ProfileSettings,
    ReportSettings,
    ServingSettings,
    SharedPrefix,
    SloSettings,
)
from sweeper.plan.dataset_choice import (
    PREFIX_REPETITION,
    DatasetChoice,
    GeneratedDataset,
    PrefixRepetition,
    TaskDataset,
)
from sweeper.plan.field_errors import as_validation_error, message, problems
from sweeper.plan.search_check import check_search
from sweeper.plan.strict import Strict as _Strict
from sweeper.plan.strict import Tokens
from sweeper.plan.yaml_file import read_yaml

T = TypeVar("T")


def _listify(value: Any) -> Any:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def _dedupe(values: list | None) -> list | None:
    if values is None:
        return None
    seen: list = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


# A grid axis: a scalar or a non-empty list, duplicates dropped in order.
AxisValues = Annotated[list[T], BeforeValidator(_listify), Field(min_length=1)]

MAX_BATCH_SIZE = 65_536
MAX_SEED = 2**32 - 1
MAX_REPEATS = 1_000
MAX_TENSOR_PARALLEL = 64

BatchSize = Annotated[int, Field(gt=0, le=MAX_BATCH_SIZE, strict=True)]
GpuCount = Annotated[int, Field(gt=0, le=MAX_TENSOR_PARALLEL, strict=True)]

def _rate(value: Any) -> Any:
    """``inf`` (YAML ``.inf`` or the word) means every request at once; NaN is no rate."""
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
        return math.inf
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("must be a number of requests per second or inf")
    return value


# Requests per second (inf: all at once).
RequestRate = Annotated[float, Field(gt=0, allow_inf_nan=True), BeforeValidator(_rate)]
Concurrency = Annotated[int, Field(gt=0, le=MAX_BATCH_SIZE, strict=True)]

class LoadRange(_Strict):
    """A load range to search for a configuration's capacity (``sweeper.core.capacity``)."""

    low: float = Field(gt=0)
    high: float = Field(gt=0)
    resolution: float = Field(0.05, gt=0, lt=1)

    @model_validator(mode="after")
    def _ordered(self) -> LoadRange:
        if self.low >= self.high:
            raise ValueError(f"low ({self.low:g}) must be below high ({self.high:g})")
        return self


class CapacitySearch(_Strict):
    """``{capacity: {low, high, resolution}}``: the highest load in the range that holds the SLO."""

    capacity: LoadRange


def _load_kind(value: Any) -> str:
    # By shape, so that an error names only the branch meant (as _dataset_kind).
    return "[capacity]" if isinstance(value, (dict, CapacitySearch)) else "[values]"


# A grid of loads, or {capacity: {...}}: the highest that holds the SLO.
RateAxis = Annotated[
    Annotated[AxisValues[RequestRate], Tag("[values]")] | Annotated[CapacitySearch, Tag("[capacity]")],
    Discriminator(_load_kind),
]
ConcurrencyAxis = Annotated[
    Annotated[AxisValues[Concurrency], Tag("[values]")] | Annotated[CapacitySearch, Tag("[capacity]")],
    Discriminator(_load_kind),
]

# The workload keys that only serving mode reads.
SERVING_KEYS = ("request_rate", "max_concurrency", "arrival", "burstiness", "num_prompts", "duration_s", "slo")


def _output_len(value: Any) -> Any:
    """A length (or list of them), or one of the words that let each request's length vary."""
    if isinstance(value, str) and value in ("natural", "reference"):
        return value
    return _listify(value)


class Workload(_Strict):
    # offline: static batches of generate calls (batch_sizes is an axis); serving: requests
    # arrive at request_rate and the engine batches them (continuous batching).
    mode: Literal["offline", "serving"] = "offline"
    # random: random token ids of exactly input_len; bundled: sweeper's own prompt set;
    # {prefix_repetition: {...}}: random prompts that share prefixes (exact lengths);
    # arithmetic or {arithmetic: {...}}: a generated task with answers (sweeper.core.tasks);
    # otherwise a prompt file (.jsonl or ShareGPT .json, sweeper.core.datasets).
    dataset: DatasetChoice = "random"
    # Prompt tokens per sequence (random prompts only: a dataset's prompts have their own lengths).
    input_len: AxisValues[Tokens] | None = None
    # Generated tokens per sequence, exactly; or natural (until EOS) / reference (the dataset's
    # reply length), each capped by max_output_len.
    output_len: Annotated[AxisValues[Tokens] | Literal["natural", "reference"], BeforeValidator(_output_len)]
    max_output_len: Tokens | None = None
    # Dataset prompts: kept only within these lengths (tokens, the model's tokenizer), wrapped
    # in the model's chat template when chat is true.
    min_input_len: Tokens | None = None
    max_input_len: Tokens | None = None
    chat: bool | None = None
    seed: int = Field(0, ge=0, le=MAX_SEED, strict=True)
    # A list of loads (a grid axis), or {capacity: {...}}: the highest that holds the SLO.
    request_rate: RateAxis | None = None
    max_concurrency: ConcurrencyAxis | None = None
    arrival: Arrival | None = None
    burstiness: float | None = Field(None, gt=0, le=1000)
    num_prompts: int | None = Field(None, gt=0, le=1_000_000, strict=True)
    duration_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    slo: SloSettings | None = None
    # Replay a prompt file's records as multi-turn conversations (serving mode): request_rate
    # and num_prompts count conversations; each next turn is sent turn_gap_s after the previous
    # reply ends, with the history so far (the model's replies, or the file's: history).
    conversations: bool | None = None
    turn_gap_s: float | None = Field(None, ge=0, le=MAX_SECONDS)
    history: History | None = None

    _dedupe = field_validator("input_len")(_dedupe)

    @field_validator("request_rate", "max_concurrency")
    @classmethod
    def _dedupe_loads(cls, value: Any) -> Any:
        return value if isinstance(value, CapacitySearch) else _dedupe(value)

    @property
    def load_search(self) -> LoadSearch | None:
        """The capacity search of the load axis given as a range, or None (a grid of loads)."""
        for axis in LOAD_AXES:
            value = getattr(self, axis)
            if isinstance(value, CapacitySearch):
                r = value.capacity
                return LoadSearch(axis=axis, low=r.low, high=r.high, resolution=r.resolution,
                                  attainment=self.slo.attainment if self.slo is not None else None)
        return None

    def load_values(self, axis: str) -> list[Any] | None:
        """A load axis's grid values: as given, or a search's first probe (its range's low)."""
        value = getattr(self, axis)
        if isinstance(value, CapacitySearch):
            search = self.load_search
            assert search is not None
            return [search.value(search.low)]
        return value

    @field_validator("output_len")
    @classmethod
    def _dedupe_lengths(cls, value: list[int] | str) -> list[int] | str:
        return value if isinstance(value, str) else _dedupe(value)  # type: ignore[return-value]

    @property
    def random_tokens(self) -> bool:
        """Whether the prompts are random token ids of exact lengths (no file)."""
        return self.dataset == RANDOM or isinstance(self.dataset, GeneratedDataset)

    @property
    def dataset_name(self) -> str:
        """``random``, ``prefix_repetition``, ``bundled``, a task's name or the prompt file as written."""
        if isinstance(self.dataset, TaskDataset):
            return self.dataset.task
        return PREFIX_REPETITION if isinstance(self.dataset, GeneratedDataset) else self.dataset

    @property
    def task(self) -> TaskDataset | None:
        """The generated task the prompts are, or None (random prompts or a file)."""
        return self.dataset if isinstance(self.dataset, TaskDataset) else None

    @property
    def shared_prefix(self) -> SharedPrefix | None:
        """The shared prefixes of a ``prefix_repetition`` dataset, or None."""
        if not isinstance(self.dataset, GeneratedDataset):
            return None
        p = self.dataset.prefix_repetition
        return SharedPrefix(prefix_len=p.prefix_len, num_prefixes=p.num_prefixes)

    @property
    def input_lens(self) -> list[int] | None:
        """The input_len axis: as given, a prefix_repetition dataset's prefix + suffix, or None
        (a file's prompts have their own lengths)."""
        if isinstance(self.dataset, GeneratedDataset):
            p = self.dataset.prefix_repetition
            return [p.prefix_len + p.suffix_len]
        return self.input_len

    @property
    def output_lengths(self) -> OutputLengths:
        """fixed | natural | reference (``sweeper.core.settings.OutputLengths``)."""
        return "fixed" if isinstance(self.output_len, list) else self.output_len

    @property
    def output_lens(self) -> list[int]:
        """The output_len axis: exact lengths, or the cap (max_output_len) of varying ones."""
        if isinstance(self.output_len, list):
            return self.output_len
        assert self.max_output_len is not None  # checked by _lengths_fit_the_dataset
        return [self.max_output_len]

    @model_validator(mode="after")
    def _lengths_fit_the_dataset(self) -> Workload:
        random = self.random_tokens
        if isinstance(self.dataset, GeneratedDataset):
            self._check_prefix_repetition(self.dataset.prefix_repetition)
        elif random and self.input_len is None:
            raise ValueError("input_len: required field is missing (random prompts' length in tokens)")
        if not random and self.input_len is not None:
            raise ValueError(f"input_len: the prompts of dataset {self.dataset_name!r} have their own lengths; "
                             "remove input_len (bound them with min_input_len / max_input_len)")
        for key in ("min_input_len", "max_input_len", "chat"):
            if random and getattr(self, key) is not None:
                raise ValueError(f"{key}: applies to a dataset's prompts; random prompts are input_len long")
        if (self.min_input_len is not None and self.max_input_len is not None
                and self.min_input_len > self.max_input_len):
            raise ValueError("min_input_len is larger than max_input_len: no prompt could be kept")
        if self.output_lengths == "fixed" and self.max_output_len is not None:
            raise ValueError("max_output_len: caps output_len natural or reference; "
                             "with exact output lengths, remove it")
        if self.output_lengths != "fixed" and self.max_output_len is None:
            raise ValueError(f"max_output_len: required with output_len {self.output_len} "
                             "(the most tokens a reply may have)")
        if self.output_lengths == "reference" and random:
            raise ValueError("output_len: reference takes each prompt's reference length from a dataset; "
                             "random prompts have none (set workload.dataset, or use natural or a length)")
        return self

    def _check_prefix_repetition(self, p: PrefixRepetition) -> None:
        if self.input_len is not None:
            raise ValueError("input_len: a prefix_repetition dataset's prompts are prefix_len + suffix_len "
                             "tokens long; remove input_len")
        if self.num_prompts is not None and p.num_prefixes > self.num_prompts:
            raise ValueError(f"dataset.prefix_repetition.num_prefixes: {p.num_prefixes} prefixes for "
                             f"{self.num_prompts} prompts (num_prompts): some prefixes would never be sent")

    @model_validator(mode="after")
    def _serving_keys_fit_the_mode(self) -> Workload:
        given = [k for k in SERVING_KEYS if getattr(self, k) is not None]
        if self.mode == "offline":
            # A dataset's sample size is num_prompts in both modes, as in vLLM's benchmark.
            given = [k for k in given if not (k == "num_prompts" and not self.random_tokens)]
            if given:
                raise ValueError(f"{given[0]} is a serving-mode key; set workload.mode: serving, or remove it")
            return self
        if self.request_rate is None:
            raise ValueError("request_rate is required in serving mode (requests per second, or inf)")
        if self.num_prompts is None and self.duration_s is None:
            raise ValueError("serving mode needs num_prompts (requests per trial) or duration_s (seconds of arrivals)")
        self._check_capacity_search()
        rates = self.load_values("request_rate") or []
        if math.inf in rates and self.num_prompts is None:
            raise ValueError("request_rate inf sends every request at once: it needs num_prompts")
        if self.burstiness is not None and self.arrival != "gamma":
            raise ValueError("burstiness is the gamma distribution's shape: it needs arrival: gamma")
        return self

    def _check_capacity_search(self) -> None:
        searched = [a for a in LOAD_AXES if isinstance(getattr(self, a), CapacitySearch)]
        if not searched:
            return
        axis, other = searched[0], "max_concurrency" if searched[0] == "request_rate" else "request_rate"
        if len(searched) > 1:
            raise ValueError("max_concurrency: one load is searched at a time; give request_rate or "
                             "max_concurrency as a capacity range, not both")
        r = getattr(self, axis).capacity
        if axis == "max_concurrency" and self.slo is None:
            raise ValueError("max_concurrency.capacity: a concurrency's capacity is the most requests in flight "
                             "that hold an SLO; set workload.slo")
        if axis == "max_concurrency":
            for end in ("low", "high"):
                value = getattr(r, end)
                if not float(value).is_integer() or value > MAX_BATCH_SIZE:
                    raise ValueError(f"max_concurrency.capacity.{end}: requests in flight are a whole number up "
                                     f"to {MAX_BATCH_SIZE:,} (got {value:g})")
        elif math.isinf(r.high):
            raise ValueError("request_rate.capacity.high: must be a finite number of requests per second")
        values = getattr(self, other)
        if values is not None and len(values) > 1:
            raise ValueError(f"{other}: a capacity search of {axis} holds the other load at one value "
                             f"(got {len(values)}); search each value in a sweep of its own")

    @model_validator(mode="after")
    def _conversations_fit(self) -> Workload:
        if not self.conversations:
            extra = next((k for k in ("turn_gap_s", "history") if getattr(self, k) is not None), None)
            if extra:
                raise ValueError(f"{extra}: applies to conversations replayed turn by turn; "
                                 "set workload.conversations: true, or remove it")
            return self
        if self.mode != "serving":
            raise ValueError("conversations: turns are sent as their previous replies end, which needs "
                             "workload.mode: serving")
        if self.random_tokens:
            raise ValueError("conversations: replays the conversations of a prompt file (ShareGPT .json, or .jsonl "
                             "with a \"conversations\" list); set workload.dataset to one")
        return self

    def conversation_settings(self) -> ConversationSettings | None:
        """How the prompt file's conversations are replayed (None: not as conversations)."""
        if not self.conversations:
            return None
        return ConversationSettings(turn_gap_s=self.turn_gap_s or 0.0, history=self.history or "model")

    def serving(self) -> ServingSettings | None:
        """The trial-level serving settings (None in offline mode)."""
        if self.mode == "offline":
            return None
        return ServingSettings(arrival=self.arrival or "poisson", burstiness=self.burstiness or 1.0,
                               num_prompts=self.num_prompts, duration_s=self.duration_s, slo=self.slo)


OptionVariants = Annotated[list[dict[str, Any]], BeforeValidator(_listify), Field(min_length=1)]


class Sweep(_Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$", max_length=100)
    models: AxisValues[str]
    backends: AxisValues[str] = ["transformers"]
    precisions: AxisValues[str]
    # Offline mode's axis; serving mode has none (the engine batches).
    batch_sizes: AxisValues[BatchSize] | None = None
    workload: Workload
    measure: MeasureSettings = MeasureSettings()
    exclude: list[dict[str, Any]] = []
    repeats: int = Field(1, gt=0, le=MAX_REPEATS, strict=True)
    tensor_parallel: AxisValues[GpuCount] = [1]
    # Per backend, one mapping of options or a list of them: a list is an axis
    # (e.g. eager and compiled transformers side by side in one sweep).
    backend_options: dict[str, OptionVariants] = {}
    profile: ProfileSettings | None = None
    fidelity: FidelitySettings | None = None
    # How the report prices energy (grid carbon intensity, price per kWh): no part of trial ids.
    report: ReportSettings = ReportSettings()
    # A search over the axes and ranges of options instead of the whole grid (sweeper.run.search).
    search: SearchSettings | None = None
    # Each measured reply judged against its prompt's reference answer (sweeper.core.scoring):
    # accuracy and energy per correct answer beside the trial's energy.
    scoring: ScoringSettings | None = None

    _dedupe = field_validator("models", "backends", "precisions", "batch_sizes",
                              "tensor_parallel")(_dedupe)

    @field_validator("models")
    @classmethod
    def _non_blank(cls, models: list[str]) -> list[str]:
        for m in models:
            if not m.strip():
                raise ValueError("a model entry is empty")
        return models

    @field_validator("backends")
    @classmethod
    def _known_backends(cls, backends: list[str]) -> list[str]:
        for b in backends:
            if b not in BACKENDS:
                raise ValueError(f"unknown backend {b!r}; known: {', '.join(sorted(BACKENDS))}")
        return backends

    @field_validator("precisions")
    @classmethod
    def _known_precisions(cls, precisions: list[str]) -> list[str]:
        for p in precisions:
            if p not in PRECISIONS:
                raise ValueError(
                    f"unknown precision {p!r}; known: {', '.join(PRECISIONS)}"
                )
        return precisions

    @field_validator("exclude")
    @classmethod
    def _exclude_names_axes(cls, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, rule in enumerate(rules):
            if not rule:
                raise ValueError(f"exclude[{i}] is empty (it would exclude every trial)")
            for key, wanted in rule.items():
                if key not in AXES:
                    raise ValueError(
                        f"exclude[{i}] names {key!r}, which is not an axis; axes: {', '.join(AXES.names)}"
                    )
                kind = AXES[key].value_type
                for value in wanted if isinstance(wanted, list) else [wanted]:
                    # bool is an int to Python, never an axis value to a user.
                    # An int matches a float axis (a rate of 4 is 4.0 requests/s).
                    fits = isinstance(value, kind) or (kind is float and isinstance(value, int))
                    if not fits or (isinstance(value, bool) and kind is not bool):
                        raise ValueError(f"exclude[{i}].{key}: {value!r} is not a {kind.__name__}, "
                                         f"so it could never match")
        return rules

    @model_validator(mode="after")
    def _batch_sizes_fit_the_mode(self) -> Sweep:
        if self.workload.mode == "offline" and self.batch_sizes is None:
            raise ValueError("batch_sizes: required field is missing (offline mode's batch sizes)")
        if self.workload.mode == "serving" and self.profile is not None:
            raise ValueError("profile: the layer-profiling pass replays offline generate calls; serving mode has "
                             "none (profile an offline sweep of the same model)")
        if self.profile is not None and (self.workload.dataset != RANDOM
                                         or self.workload.output_lengths != "fixed"):  # shared prefixes: the replay has none
            raise ValueError("profile: the layer-profiling pass replays batches of one shape; it needs random "
                             "prompts of input_len and exact output lengths (profile such a sweep of the model)")
        if self.workload.mode == "serving" and self.fidelity is not None:
            raise ValueError("fidelity: the fidelity pass scores offline generate calls; serving mode has none "
                             "(measure fidelity in an offline sweep of the same model and precisions)")
        if self.workload.mode == "serving" and self.measure.target_rel_ci is not None:
            raise ValueError("measure.target_rel_ci: a serving run plays its whole request schedule and judges "
                             "its steady window afterwards; it cannot stop early (use it in offline mode)")
        m = self.measure
        if (self.workload.mode == "offline" and m.target_rel_ci is None and m.min_window_s is not None
                and m.min_window_s > m.min_duration_s):
            raise ValueError(f"measure.min_window_s ({m.min_window_s:g} s) is above measure.min_duration_s "
                             f"({m.min_duration_s:g} s): every window the sweep asks for would be flagged "
                             "unstable; raise min_duration_s, lower min_window_s, or leave it out (it then "
                             "follows min_duration_s)")
        if self.workload.mode == "serving" and self.batch_sizes is not None:
            raise ValueError("batch_sizes: not an axis in serving mode, where the engine forms its own batches; "
                             "remove it (cap them with workload.max_concurrency or the backend's own limit: "
                             "backend_options.vllm.max_num_seqs, backend_options.noop.max_batch)")
        return self

    @model_validator(mode="after")
    def _backends_fit_the_mode(self) -> Sweep:
        if self.workload.mode == "offline":
            serving_only = [b for b in self.backends if not BACKENDS[b].offline]
            if serving_only:
                raise ValueError(f"backends: {serving_only[0]} measures a server under requests arriving over time; "
                                 "it has no offline mode (set workload.mode: serving with a request_rate)")
        return self

    @model_validator(mode="after")
    def _backend_options_valid(self) -> Sweep:
        # Every problem of every variant, each at its field: the file's problems are reported
        # at once (a ValueError would stop at the first, and name no field).
        found: list[tuple[tuple[Any, ...], str]] = []
        for backend in self.backends:
            if backend not in self.backend_options:
                try:
                    BACKENDS[backend].options.model_validate({})
                except ValidationError as exc:
                    found.append((("backend_options", backend), f"required ({message(exc.errors()[0])})"))
        for backend, variants in self.backend_options.items():
            if backend not in BACKENDS:
                found.append((("backend_options", backend),
                              f"unknown backend {backend!r}; known: {', '.join(sorted(BACKENDS))}"))
                continue
            if backend not in self.backends:
                found.append((("backend_options", backend), f"{backend} is not among this sweep's backends "
                                                            f"({', '.join(self.backends)}); add it there or remove "
                                                            "its options"))
                continue
            for i, options in enumerate(variants):
                where = ("backend_options", backend, *([i] if len(variants) > 1 else []))
                if not isinstance(options, dict):
                    found.append((where, "expected a mapping of option names to values"))
                    continue
                try:
                    BACKENDS[backend].options.model_validate(options)
                except ValidationError as exc:
                    found += [((*where, *err["loc"]), message(err)) for err in exc.errors()]
                if self.workload.conversations:
                    unused = getattr(BACKENDS[backend].options, "unused_by_conversations", ())
                    found += [((*where, key), "not used by conversations (each turn is sent from one process, "
                                              "built from the reply before it): leave it out")
                              for key in unused if key in options]
        if found:
            raise as_validation_error(type(self).__name__, found)
        return self

    @model_validator(mode="after")
    def _scoring_fits(self) -> Sweep:
        w = self.workload
        if self.scoring is None:
            judged = [("criterion", self.report.criterion == "energy_per_correct_j"),
                      ("min_accuracy", self.report.min_accuracy is not None)]
            for name, set_ in judged:
                if set_:
                    raise ValueError(f"report.{name}: judges by accuracy, and the sweep scores no replies; add a "
                                     "scoring: block (and a dataset with answers)")
            return self
        if w.random_tokens:
            raise ValueError("scoring: judges replies against the prompts' reference answers, and random prompts "
                             "have none; set workload.dataset to a prompt file with an \"answer\" per record, "
                             "or to arithmetic")
        if w.conversations and self.scoring.likelihood:
            raise ValueError("scoring.likelihood: scores a prompt's choices, and a conversation's turns have none")
        if w.output_lengths != "natural":
            raise ValueError("scoring: a reply is judged where the model ended it; set workload.output_len: natural "
                             "(with max_output_len, the longest a reply may run)")
        return self

    @model_validator(mode="after")
    def _search_fits(self) -> Sweep:
        if self.search is not None:
            check_search(self)
        return self

    def options_for(self, backend: str) -> list[BaseModel]:
        """The backend's option variants, validated (one default variant when none is given)."""
        variants = self.backend_options.get(backend) or [{}]
        return [BACKENDS[backend].options.model_validate(v) for v in variants]


def parse_sweep(data: Any, path: str = "<sweep>") -> Sweep:
    if not isinstance(data, dict):
        raise SweepFileError(path, None, "expected a mapping of sweep fields at the top level")
    try:
        return Sweep.model_validate(data)
    except ValidationError as exc:
        found = problems(exc.errors(), document=data)
        raise SweepFileError(path, *found[0], more=tuple(found[1:])) from None


def load_sweep(path: str | Path) -> Sweep:
    return parse_sweep(read_yaml(path), str(path))
