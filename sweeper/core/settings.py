"""Validated settings a trial carries: how it is measured, profiled and scored.

These are the sweep file's ``measure``, ``profile`` and ``fidelity`` blocks,
validated once by pydantic and then carried as these frozen models, through
the plan, to the actor and into the trials-table columns; text (canonical
JSON) appears only in a trial's identity and its row.
"""

from __future__ import annotations

import functools
import json
from typing import ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sweeper.core.precisions import PRECISIONS

# Where a trial runs: an NVIDIA GPU, or the CPU (no GPU on the node).
Device = Literal["cuda", "cpu"]


class Settings(BaseModel):
    """Unknown keys are errors; values never change after validation."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# A day: a longer window or limit can only be a typo, and would hold a GPU for it.
MAX_SECONDS = 86_400.0
MAX_ITERS = 1_000_000


class MeasureSettings(Settings):
    warmup_iters: int = Field(1, ge=0, le=MAX_ITERS)
    # Warm-up lasts at least this long too: host-bound decode loops (CPU boost,
    # allocator, caches) settle over seconds, not over one call.
    warmup_s: float = Field(0.0, ge=0, le=MAX_SECONDS, description="warm-up lasts at least this long as well as warmup_iters calls")
    min_iters: int = Field(5, gt=0, le=MAX_ITERS)
    min_duration_s: float = Field(10.0, ge=0, le=MAX_SECONDS)
    idle_s: float = Field(2.0, ge=0, le=MAX_SECONDS, description="idle-baseline window before the measured phase")
    sample_interval_s: float = Field(0.1, gt=0, le=10)
    # The window is judged by the precision of what it reports (actors.stability): a window
    # shorter than min_window_s is flagged; by default that floor is the window the sweep asked for.
    min_window_s: float | None = Field(None, ge=0, le=MAX_SECONDS, description="shorter measured windows (serving: steady windows) are flagged unstable; null: min_duration_s (not with target_rel_ci: the interval judges the window then)")
    max_rel_ci: float = Field(0.05, gt=0, lt=1, description="a headline figure (throughput; on GPUs, J/token) whose 95 % confidence interval over >= 1 s blocks is wider than this share of its mean flags the trial unstable (with target_rel_ci, the target is the bound)")
    max_iteration_cv: float = Field(0.05, gt=0, description="per-iteration throughput or energy CV above this raises the noisy_host flag (process noise; the trial is judged by its interval)")
    # Measure until precise: the window goes on past min_duration_s until the 95 % interval
    # of each headline figure (throughput; on GPUs, J/token) over >= 1 s blocks is within
    # this share of its mean, or until max_duration_s.
    target_rel_ci: float | None = Field(None, gt=0, lt=1, description="end the window once the 95 % confidence interval of throughput (and, on GPUs, J/token) over >= 1 s blocks is within this share of the mean (e.g. 0.02); null: a fixed window of min_duration_s")
    max_duration_s: float | None = Field(None, gt=0, le=MAX_SECONDS, description="with target_rel_ci, the window ends here whether or not the target is met (then flagged unstable); default 60")
    # One idle baseline per loaded model: a later trial of the group settles, reads the
    # idle power for 0.5 s and keeps the group's baseline if the reading agrees with it
    # (actors.telemetry.baseline); else it takes the full window afresh.
    idle_reuse_tolerance_w: float | None = Field(1.0, ge=0, le=100, description="a later trial of the group keeps its idle baseline when a 0.5 s re-check of the settled power is within this many W per GPU of it (null: a fresh baseline every trial)")
    idle_reuse_max_age_s: float = Field(300.0, ge=0, le=MAX_SECONDS, description="an idle baseline older than this is taken afresh")

    # A limit on the driver's patience, not a measurement setting: it never
    # shapes an ok row's numbers.
    timeout_s: float | None = Field(None, gt=0, le=7 * MAX_SECONDS, description="a trial running longer is recorded failed (timeout) and its actor replaced")
    # Likewise for a model load (engine start, weight download and conversion included),
    # counted from the moment the actor holds its resources.
    load_timeout_s: float = Field(1800.0, gt=0, le=7 * MAX_SECONDS, description="a model load taking longer is abandoned: its actor is replaced (retried like a death), then the group's trials are recorded failed (load_timeout)")

    # Settings that bound the driver's patience, not the measurement: no part of
    # trial ids or rows, so changing them re-runs nothing.
    PATIENCE: ClassVar[frozenset[str]] = frozenset({"timeout_s", "load_timeout_s"})
    # Settings that choose how a figure is obtained within a bound its row records
    # (idle_baseline_reused, idle_recheck_power_w), not what is measured: no part of trial
    # ids, so a results directory from before them resumes, but columns of the rows.
    METHOD: ClassVar[frozenset[str]] = frozenset({"idle_reuse_tolerance_w", "idle_reuse_max_age_s"})
    # Settings that only judge a measurement (the unstable flag), never shape its numbers:
    # no part of trial ids (a stricter bound must not re-measure a finished sweep), but
    # columns of the rows, so a verdict can be re-judged from them.
    VERDICT: ClassVar[frozenset[str]] = frozenset({"max_rel_ci"})
    # Settings that joined later, with the value that means "not used": they join a
    # trial's identity only when set, so trials that do not use them keep their ids.
    OFF_VALUES: ClassVar[dict[str, object]] = {"warmup_s": 0.0, "target_rel_ci": None, "max_duration_s": None}
    DEFAULT_MAX_DURATION_S: ClassVar[float] = 60.0

    @model_validator(mode="after")
    def _window_bounds(self) -> MeasureSettings:
        if self.max_duration_s is not None:
            if self.target_rel_ci is None:
                raise ValueError("max_duration_s bounds a window that measures until precise: set target_rel_ci "
                                 "too (without it the window is min_duration_s long)")
            if self.max_duration_s < self.min_duration_s:
                raise ValueError(f"max_duration_s ({self.max_duration_s:g}) is below min_duration_s "
                                 f"({self.min_duration_s:g})")
        elif self.target_rel_ci is not None and self.min_duration_s > self.DEFAULT_MAX_DURATION_S:
            raise ValueError(f"min_duration_s ({self.min_duration_s:g}) is above the default max_duration_s "
                             f"({self.DEFAULT_MAX_DURATION_S:g}): set max_duration_s")
        return self

    @property
    def window_floor_s(self) -> float:
        """Windows shorter than this are flagged unstable: ``min_window_s``, else the
        window the sweep asked for (``min_duration_s``)."""
        return self.min_window_s if self.min_window_s is not None else self.min_duration_s

    @property
    def window_cap_s(self) -> float | None:
        """Where a window that measures until precise ends regardless; None: a fixed window."""
        if self.target_rel_ci is None:
            return None
        return self.max_duration_s if self.max_duration_s is not None else self.DEFAULT_MAX_DURATION_S

    def identity(self) -> dict[str, object]:
        """The settings that make two measurements the same: patience left out, later
        settings only when set (read-only: one dict per distinct settings value)."""
        return _measure_identity(self)


@functools.lru_cache(maxsize=256)
def _measure_identity(m: MeasureSettings) -> dict[str, object]:
    # Every trial's id asks; a sweep has one measure block.
    d = m.model_dump(exclude=set(m.PATIENCE | m.METHOD | m.VERDICT))
    # The floor in force, as ids have always carried it (a number, 10 by default).
    d["min_window_s"] = m.window_floor_s
    return {k: v for k, v in d.items() if k not in m.OFF_VALUES or v != m.OFF_VALUES[k]}


# Layer-profiling granularities: decoder blocks, the attention / MLP / norms
# inside each block, or every leaf module.
LayerGranularity = Literal["block", "submodule", "leaf"]
LAYER_GRANULARITIES: tuple[str, ...] = get_args(LayerGranularity)


class ProfileSettings(Settings):
    """Opt-in profiling passes, run after (never inside) a trial's headline measurement."""

    layers: LayerGranularity = Field(description="per-layer GPU time and energy at this granularity")


# Top-k log-probabilities per position where a backend returns no full distribution (vLLM's
# default max_logprobs).
DEFAULT_TOP_K = 20


class FidelitySettings(Settings):
    """Output fidelity of each precision against a reference precision of the same model.

    Teacher-forced on the reference's own greedy continuation of fixed random
    prompts: mean KL divergence of next-token distributions and top-1 agreement.
    The reference may run on another backend (``reference: {backend: transformers,
    precision: bf16}``), so that backends are compared on the same weights and prompts.
    """

    reference: str = Field("bf16", description="precision the others are compared with")
    reference_backend: str | None = Field(None, description="backend the reference runs on (null: each trial's own)")
    top_k: int | None = Field(None, gt=0, le=DEFAULT_TOP_K, strict=True,
                              description="compare top-k log-probabilities (a KL estimate over the reference's top k "
                                          "and the rest of the vocabulary); null: the full distribution where both "
                                          f"backends return it, else top {DEFAULT_TOP_K}")
    prompts: int = Field(8, gt=0, le=256, strict=True, description="prompts (sequences) compared")
    prompt_len: int = Field(32, gt=0, strict=True, description="tokens per prompt")
    continuation_len: int = Field(32, gt=0, le=4096, strict=True,
                                  description="greedy reference tokens compared after each prompt")
    perplexity: bool = Field(False, description="also each precision's perplexity on a bundled "
                             "public-domain text (real checkpoints with a tokenizer)")

    @model_validator(mode="before")
    @classmethod
    def _reference_on_a_backend(cls, data: object) -> object:
        """``reference: {backend: B, precision: P}`` is ``reference: P`` on backend B."""
        if isinstance(data, dict) and isinstance(data.get("reference"), dict):
            ref = dict(data["reference"])
            unknown = set(ref) - {"backend", "precision"}
            if unknown or "precision" not in ref:
                raise ValueError("reference: a precision name, or {backend: ..., precision: ...}"
                                 + (f" (unknown key {sorted(unknown)[0]!r})" if unknown else ""))
            data = {**data, "reference": ref["precision"], "reference_backend": ref.get("backend")}
        return data

    @field_validator("reference")
    @classmethod
    def _known(cls, reference: str) -> str:
        if reference not in PRECISIONS:
            raise ValueError(f"unknown precision {reference!r}; known: {', '.join(PRECISIONS)}")
        return reference

    @field_validator("reference_backend")
    @classmethod
    def _known_backend(cls, backend: str | None) -> str | None:
        from sweeper.core.backends import BACKENDS

        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; known: {', '.join(sorted(BACKENDS))}")
        return backend

    def reference_label(self) -> str:
        """``bf16``, or ``transformers/bf16`` for a reference on a named backend."""
        return self.reference if self.reference_backend is None else f"{self.reference_backend}/{self.reference}"

    def canonical_json(self) -> str:
        # Keys that joined later are in the text (and so in trial ids) only when set,
        # so older trials keep their ids.
        exclude = {k for k, off in (("perplexity", False), ("reference_backend", None), ("top_k", None))
                   if getattr(self, k) is off}
        return json.dumps(self.model_dump(mode="json", exclude=exclude), sort_keys=True, separators=(",", ":"))


def canonical_json(options: BaseModel) -> str:
    """A validated options model as canonical JSON: stable key order, no spaces."""
    return json.dumps(options.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


# What the best-configuration table minimises (sweeper.analysis.tables.CRITERIA says each in words).
Criterion = Literal["energy_per_token_j", "energy_per_correct_j"]


class ReportSettings(Settings):
    """How the results are judged: the sweep file's ``report`` block.

    None is a measurement: they are not part of trial ids, and changing them re-runs
    nothing. The analysis derives ``co2e_g_per_1k_tokens`` and ``cost_per_1m_tokens`` from
    each trial's measured GPU energy with the first two; the best-configuration table picks by
    ``criterion`` among the configurations at or above ``min_accuracy``.
    """

    grid_intensity_g_per_kwh: float | None = Field(
        None, gt=0, le=10_000, description="grams of CO2-equivalent per kWh of the grid the GPUs draw from")
    price_per_kwh: float | None = Field(
        None, ge=0, le=10_000, description="price of a kWh, in whatever currency the report should use")
    criterion: Criterion = Field(
        "energy_per_token_j", description="what the best-configuration table minimises: energy_per_token_j, or "
        "energy_per_correct_j (fewest joules per correct answer; a scored sweep)")
    min_accuracy: float | None = Field(
        None, ge=0, le=1, description="the best-configuration table's accuracy floor (a scored sweep): a "
        "configuration below it, or unscored, is not a candidate")


# Arrival processes of serving mode's requests (actors/serving/arrivals.py draws them).
Arrival = Literal["poisson", "gamma", "constant"]
ARRIVALS: tuple[str, ...] = get_args(Arrival)


class SloSettings(Settings):
    """Latency bounds a served request must meet to count toward goodput (any subset).

    Milliseconds, as serving benchmarks state them; a request's TPOT is
    (e2e - ttft) / (output tokens - 1), vLLM's definition.
    """

    ttft_ms: float | None = Field(None, gt=0, le=MAX_SECONDS * 1000, description="time to first token, at most")
    tpot_ms: float | None = Field(None, gt=0, le=MAX_SECONDS * 1000, description="time per output token after the first, at most")
    e2e_ms: float | None = Field(None, gt=0, le=MAX_SECONDS * 1000, description="end-to-end latency, at most")
    # What a capacity search holds a probe to (sweeper.core.capacity); no part of a trial's
    # measurement, so it stays out of trial ids (ServingSettings.identity).
    attainment: float = Field(0.99, gt=0, le=1, description="capacity searches: the share of a probe's requests that must meet every bound")

    @model_validator(mode="after")
    def _some_bound(self) -> SloSettings:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise ValueError("an slo needs at least one of ttft_ms, tpot_ms, e2e_ms")
        return self

    def bounds_s(self) -> dict[str, float]:
        """The set bounds in seconds, keyed by the request metric they limit (ttft, tpot, e2e)."""
        pairs = (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2e", self.e2e_ms))
        return {name: ms / 1000.0 for name, ms in pairs if ms is not None}


class ServingSettings(Settings):
    """How a serving-mode trial offers its load, beside its request-rate and concurrency axes.

    ``num_prompts`` requests arrive by ``arrival`` (seeded); ``duration_s``, when
    set, ends the arrivals at that time instead, whichever comes first.
    """

    arrival: Arrival = "poisson"
    # The gamma distribution's shape: 1 is Poisson, below 1 burstier, above 1 more regular.
    burstiness: float = Field(1.0, gt=0, le=1000)
    num_prompts: int | None = Field(None, gt=0, le=1_000_000, strict=True)
    duration_s: float | None = Field(None, gt=0, le=MAX_SECONDS)
    slo: SloSettings | None = None

    def identity(self) -> dict[str, object]:
        # The attainment target judges probes afterwards; it shapes no request of the run.
        return self.model_dump(mode="json", exclude_none=True, exclude={"slo": {"attainment"}})

    def stretched(self, times: int) -> ServingSettings:
        """The same arrivals ``times`` as long (``num_prompts`` and ``duration_s``): a capacity
        probe measured again (``sweeper.core.capacity.STRETCH``)."""
        return self.model_copy(update={
            "num_prompts": self.num_prompts * times if self.num_prompts is not None else None,
            "duration_s": self.duration_s * times if self.duration_s is not None else None})

    def unstretched(self, times: int) -> ServingSettings:
        """What ``stretched(times)`` was made from."""
        return self.model_copy(update={
            "num_prompts": self.num_prompts // times if self.num_prompts is not None else None,
            "duration_s": self.duration_s / times if self.duration_s is not None else None})


# How long each generated sequence is:
# fixed: exactly output_len tokens, end-of-sequence ignored (the timing control);
# natural: until the model ends its reply (EOS), at most output_len (the sweep's max_output_len);
# reference: the length its dataset record gives, EOS ignored, at most output_len.
OutputLengths = Literal["fixed", "natural", "reference"]
OUTPUT_LENGTHS: tuple[str, ...] = get_args(OutputLengths)

# Prompt-file formats: one JSON object per line, or ShareGPT's list of conversations.
DatasetFormat = Literal["jsonl", "sharegpt"]


class SharedPrefix(Settings):
    """Prompts that share prefixes, as vLLM's benchmark makes them (``prefix_repetition``): each
    prompt is one of ``num_prefixes`` random prefixes of ``prefix_len`` tokens, followed by its
    own random suffix (the rest of the trial's ``input_len``). Seeded by the workload's seed, so
    every node draws the same prefixes."""

    prefix_len: int = Field(gt=0, description="tokens of each shared prefix")
    num_prefixes: int = Field(gt=0, description="distinct prefixes the prompts share, in turn")

    def identity(self) -> dict[str, object]:
        return self.model_dump(mode="json")


# Where a replayed conversation's earlier replies come from: what the model under test
# actually replied (a real chat session), or the file's own replies (every trial of the sweep
# then sends the same histories, whatever each model says).
History = Literal["model", "reference"]


class ConversationSettings(Settings):
    """A prompt file replayed as multi-turn conversations: each conversation starts at the
    workload's arrival process, and each next turn is sent ``turn_gap_s`` after the previous
    reply has finished, with the whole history so far as its prompt."""

    turn_gap_s: float = Field(0.0, ge=0, description="seconds between a reply's end and the next turn (a user's reading time)")
    history: History = Field("model", description="earlier replies in each prompt: the model's own, or the file's")

    def identity(self) -> dict[str, object]:
        return self.model_dump(mode="json")


class DatasetSettings(Settings):
    """Where a trial's prompts come from when they are real text (``sweeper.core.datasets``).

    The actor tokenizes the file's prompts with the model's tokenizer, keeps those
    within the length bounds and draws ``num_prompts`` of them with the trial's seed.
    """

    name: str = Field(description="'bundled' (the prompt set shipped with sweeper), a task's name or the file as written")
    path: str = Field(description="the file read, absolute (not part of trial ids: moving it re-runs nothing); "
                                  "'' for a generated task")
    format: DatasetFormat
    sha256: str = Field(description="the file's content hash: an edited file is a different workload")
    records: int = Field(ge=1, description="prompt records in the file")
    num_prompts: int | None = Field(None, gt=0, description="a seeded sample of this many (null: all)")
    min_input_len: int | None = Field(None, gt=0, description="prompts shorter than this (tokens) are left out")
    max_input_len: int | None = Field(None, gt=0, description="prompts longer than this (tokens) are left out")
    chat: bool = Field(False, description="wrap each prompt in the model's chat template (as a user turn)")
    conversations: ConversationSettings | None = Field(
        None, description="replay each record as a conversation, turn by turn (null: its first turn as one prompt)")
    # A generated task (sweeper.core.tasks) is made again on each actor from these settings: no
    # file travels; ``sha256`` is then its records' hash, which the actor's must equal.
    task: str | None = Field(None, description="a generated task and its settings as canonical JSON "
                                               "({\"arithmetic\": {...}}); null: a file")

    def identity(self) -> dict[str, object]:
        return self.model_dump(mode="json", exclude={"path", "records"}, exclude_none=True)
