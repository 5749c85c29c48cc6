"""Trial records: frozen, fully resolved, identified by a hash of their content."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from pydantic import BaseModel

from sweeper.core.axes import (
    AXES,
    BACKEND,
    MODEL,
    AxisPoint,
    BackendChoice,
    ModelRef,
    non_default_options,
    non_default_values,
)
from sweeper.core.backends import BACKENDS
from sweeper.core.capacity import LoadSearch, capacity_id
from sweeper.core.configuration import Configuration
from sweeper.core.scoring import ScoringSettings
from sweeper.core.secrets import SecretValues
from sweeper.core.settings import (
    LAYER_GRANULARITIES,
    ConversationSettings,
    DatasetSettings,
    FidelitySettings,
    LayerGranularity,
    MeasureSettings,
    OutputLengths,
    ServingSettings,
    SharedPrefix,
)

# Bumped when the measurement method changes in a way that makes old results
# incomparable: every trial id changes and a resumed sweep re-runs everything.
# 2: energy windows stamped after the meter's counter reads; backend options
#    at their defaults left out of the identity.
METHOD_VERSION = 2

__all__ = ["LAYER_GRANULARITIES", "METHOD_VERSION", "GroupLoad", "LayerGranularity", "Trial", "row_variant"]

# Axes the label spells out in its own words; any other axis away from its default
# is appended as name=value.
_LABELLED = frozenset({MODEL, BACKEND, "precision", "batch_size", "input_len", "output_len", "repeat",
                       "request_rate", "max_concurrency"})


@dataclass(frozen=True)
class Trial:
    sweep: str
    point: AxisPoint  # one value per axis of ``sweeper.core.axes.AXES``
    dataset: str
    seed: int
    measure: MeasureSettings = MeasureSettings()
    # Layer-profiling granularity, or None: no profiling pass.
    layer_profile: LayerGranularity | None = None
    # Each precision against a reference precision, or None: no fidelity pass.
    fidelity: FidelitySettings | None = None
    # Serving mode's arrival process and SLO, or None: offline mode (static batches).
    serving: ServingSettings | None = None
    # A prompt file's settings, or None: random prompts of input_len tokens.
    prompts: DatasetSettings | None = None
    # How long each sequence is: exactly output_len, or natural / reference lengths capped by it.
    output_lengths: OutputLengths = "fixed"
    # Random prompts that share prefixes (the prefix_repetition dataset), or None.
    shared_prefix: SharedPrefix | None = None
    # How each measured reply is judged against its prompt's answer, or None: not scored.
    scoring: ScoringSettings | None = None
    # Where the trial came from, beside what it measures (none of it is part of its id: a probe
    # at a load measures what a grid trial at that load does, and one result stands for both).
    # A capacity search's probe: the search, and the probe's step in it (0: the range's low).
    load_search: LoadSearch | None = None
    probe_step: int | None = None
    # A probe measured again: its arrivals this many times the configuration's (``serving``
    # holds them stretched, so its id is its own; its capacity id is the configuration's).
    probe_stretch: int = 1
    # A configuration search's point (sweeper.run.search): its id, and the point's step in it.
    search_id: str | None = None
    search_step: int | None = None
    search_params: str | None = None  # the point's parameters as the searcher chose them (JSON)
    trial_id: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "trial_id", _content_hash(self.identity()))

    @classmethod
    def at(cls, *, sweep: str, dataset: str = "random", seed: int = 0, measure: MeasureSettings | None = None,
           layer_profile: LayerGranularity | None = None, fidelity: FidelitySettings | None = None,
           serving: ServingSettings | None = None, prompts: DatasetSettings | None = None,
           output_lengths: OutputLengths = "fixed", shared_prefix: SharedPrefix | None = None,
           scoring: ScoringSettings | None = None, **values: Any) -> Trial:
        """A trial from one value per axis by name (axes left out take their default)."""
        items = []
        for axis in AXES:
            if axis.name in values:
                items.append((axis.name, values.pop(axis.name)))
            elif axis.has_default:
                items.append((axis.name, axis.default))
            else:
                raise TypeError(f"no value for axis {axis.name!r}")
        if values:
            raise TypeError(f"not an axis: {', '.join(values)}")
        return cls(sweep=sweep, point=AxisPoint(tuple(items)), dataset=dataset, seed=seed,
                   measure=measure or MeasureSettings(), layer_profile=layer_profile, fidelity=fidelity,
                   serving=serving, prompts=prompts, output_lengths=output_lengths, shared_prefix=shared_prefix,
                   scoring=scoring)

    @property
    def capacity_id(self) -> str | None:
        """The configuration a capacity search's probe measures: its identity less the load."""
        if self.load_search is None:
            return None
        base = self
        if self.probe_stretch != 1 and self.serving is not None:
            base = dataclasses.replace(self, serving=self.serving.unstretched(self.probe_stretch), probe_stretch=1)
        return capacity_id(base.identity(), self.load_search.axis)

    def probe(self, load: float | int, step: int, stretch: int = 1) -> Trial:
        """This configuration's probe at ``load`` (its capacity search's step ``step``), its
        arrivals ``stretch`` times as long (a probe measured again)."""
        if self.load_search is None or self.serving is None:
            raise TypeError(f"{self.label()}: not a capacity search's trial")
        if self.probe_stretch != 1:
            raise TypeError(f"{self.label()}: a re-measure is not a configuration to probe from")
        probe = dataclasses.replace(self.with_axes(**{self.load_search.axis: load}), probe_step=step)
        if stretch == 1:
            return probe
        return dataclasses.replace(probe, serving=self.serving.stretched(stretch), probe_stretch=stretch)

    def with_axes(self, **values: Any) -> Trial:
        """This trial with other values for some of its axes (a new trial id)."""
        unknown = set(values) - set(self.point)
        if unknown:
            raise TypeError(f"not an axis of this trial: {', '.join(sorted(unknown))}")
        items = tuple((name, values.get(name, value)) for name, value in self.point.items_)
        return dataclasses.replace(self, point=AxisPoint(items))

    # -- the axes, typed -----------------------------------------------------------
    @property
    def model_ref(self) -> ModelRef:
        ref: ModelRef = self.point[MODEL]
        return ref

    @property
    def model(self) -> str:
        return self.model_ref.name

    @property
    def model_source(self) -> str:
        return self.model_ref.source

    @property
    def model_location(self) -> str:
        return self.model_ref.location

    @property
    def backend_choice(self) -> BackendChoice:
        choice: BackendChoice = self.point[BACKEND]
        return choice

    @property
    def backend(self) -> str:
        return self.backend_choice.name

    @property
    def backend_options(self) -> BaseModel:
        """The backend's validated options (its ``options`` model of the backend registry)."""
        return self.backend_choice.options

    @property
    def precision(self) -> str:
        return str(self.point["precision"])

    @property
    def batch_size(self) -> int | None:
        """Sequences per generate call; None in serving mode (the engine batches)."""
        value = self.point.get("batch_size")
        return None if value is None else int(value)

    @property
    def mode(self) -> str:
        return "offline" if self.serving is None else "serving"

    @property
    def request_rate(self) -> float | None:
        """Serving mode's offered requests per second (inf: all at once)."""
        value = self.point.get("request_rate")
        return None if value is None else float(value)

    @property
    def max_concurrency(self) -> int | None:
        value = self.point.get("max_concurrency")
        return None if value is None else int(value)

    @property
    def input_len(self) -> int | None:
        """Random prompts' length; None for a dataset's prompts (each has its own)."""
        value = self.point.get("input_len")
        return None if value is None else int(value)

    @property
    def stops_at_eos(self) -> bool:
        """Generation ends where the model ends its reply (natural lengths)."""
        return self.output_lengths == "natural"

    @property
    def output_len(self) -> int:
        return int(self.point["output_len"])

    @property
    def tensor_parallel(self) -> int:
        return int(self.point.get("tensor_parallel", 1))

    @property
    def repeat(self) -> int:
        return int(self.point.get("repeat", 0))

    @property
    def num_gpus(self) -> int:
        """GPUs the trial's actor holds: its tensor-parallel degree, or none for a client of a
        server running elsewhere."""
        return self.tensor_parallel if BACKENDS[self.backend].holds_gpus(self.backend_options) else 0

    # -- what identifies, groups and describes it ------------------------------------
    def identity(self) -> dict[str, Any]:
        """What makes two trials the same measurement.

        The sweep's name and the model's on-disk location are left out: renaming
        a sweep or moving a checkpoint does not make old results wrong. Optional
        settings join only when set, so adding one never changes the ids of
        trials that do not use it (resume).
        """
        d: dict[str, Any] = {}
        for name, value in self.point.items_:
            d.update(AXES[name].identity_part(value))
        # timeout_s limits the driver's patience, never the numbers: changing it re-runs nothing.
        d.update(dataset=self.dataset, seed=self.seed, measure=self.measure.identity(),
                 method_version=METHOD_VERSION)
        if self.layer_profile is not None:
            d["layer_profile"] = self.layer_profile
        if self.fidelity is not None:
            d["fidelity"] = self.fidelity.canonical_json()
        if self.serving is not None:
            d["serving"] = self.serving.identity()
        if self.prompts is not None:
            d["prompts"] = self.prompts.identity()
        if self.output_lengths != "fixed":
            d["output_lengths"] = self.output_lengths
        if self.scoring is not None:
            d["scoring"] = self.scoring.canonical_json()
        if self.shared_prefix is not None:
            d["shared_prefix"] = self.shared_prefix.identity()
            if self.serving is None and (self.batch_size or 0) < self.shared_prefix.num_prefixes:
                # Offline calls smaller than num_prefixes deal the prefixes across calls; results
                # from before sent only the first batch_size of them: measured again on resume.
                d["prefixes_dealt_across_calls"] = True
        return d

    @property
    def load_key(self) -> tuple[Any, ...]:
        """Trials with the same load key share one loaded model on one actor."""
        return tuple(self.point[a.name] for a in AXES.load_key_axes() if a.name in self.point)

    @property
    def reference_load_key(self) -> tuple[Any, ...] | None:
        """The load key of the configuration this trial's fidelity reference runs as (the same
        model at the reference precision, on the reference backend), or None: no fidelity pass.
        Equal to ``load_key`` for the reference itself."""
        settings = self.fidelity
        if settings is None:
            return None
        name = settings.reference_backend or self.backend
        choice = (self.backend_choice if name == self.backend
                  else BackendChoice(name, BACKENDS[name].default_options()))
        return self.with_axes(precision=settings.reference, **{BACKEND: choice}).load_key

    @property
    def shape(self) -> tuple[Any, ...]:
        """The workload's shape beside the batch size (prompt and output lengths)."""
        return tuple(self.point[a.name] for a in AXES.shape_axes() if a.name in self.point)

    def axes(self) -> dict[str, Any]:
        """Each axis's plain value: what ``exclude`` rules and the plan table see."""
        return self.point.keys_()

    def columns(self) -> dict[str, Any]:
        """The trial's identity, its axes' columns and its configuration, as flat trials-table columns."""
        d: dict[str, Any] = {"trial_id": self.trial_id, "sweep": self.sweep}
        for name, value in self.point.items_:
            d.update(AXES[name].columns(name, value))
        return {**d, **dict(self.configuration().items())}

    def configuration(self) -> Configuration:
        """What the sweep file set for this trial beyond its axes."""
        return Configuration(
            dataset=self.dataset, seed=self.seed, layer_profile=self.layer_profile,
            fidelity=self.fidelity.canonical_json() if self.fidelity is not None else None,
            scoring=self.scoring.canonical_json() if self.scoring is not None else None,
            mode=self.mode, output_lengths=self.output_lengths,
            **_shared_prefix_columns(self.shared_prefix),
            **_prompt_file_columns(self.prompts),
            num_prompts=_num_prompts(self.serving, self.prompts),
            **_arrival_columns(self.serving),
            # The time limits bound the driver's patience and never shape an ok row's
            # numbers, so they are no trials-table columns.
            **self.measure.model_dump(exclude={*MeasureSettings.PATIENCE, "min_window_s"}),
            min_window_s=self.measure.window_floor_s,  # the floor the window was held to
            capacity_id=self.capacity_id, probe_step=self.probe_step,
            slo_attainment_target=self.load_search.attainment if self.load_search is not None else None,
            search_id=self.search_id, search_step=self.search_step, search_params=self.search_params,
        )

    def variant(self) -> str:
        """What sets this trial apart beyond the main axes: tensor parallelism and
        backend options away from their defaults (e.g. ``tp=2 compile=True``)."""
        parts = [f"{a.title}={self.point[a.name]}" for a in AXES
                 if a.in_variant and a.name in self.point and a.identity_part(self.point[a.name])]
        return _variant_text(parts, non_default_options(self.backend_options), type(self.backend_options))

    def configuration_label(self) -> str:
        """The trial's label less its load (a capacity search's configuration: every load it probes)."""
        variant = self.variant()
        shape = f"in={self.input_len} out={self.output_len}" if self.prompts is None else f"out={self.output_len}"
        return (f"{self.model} {self.backend}/{self.precision}" + (f" {variant}" if variant else "") + f" {shape}"
                + (f" r{self.repeat}" if self.repeat else ""))

    def label(self) -> str:
        variant = self.variant()
        extra = [f"{name}={value}" for name, value in self.axes().items()
                 if name not in _LABELLED and not AXES[name].in_variant
                 and AXES[name].identity_part(self.point[name])]
        return (f"{self.model} {self.backend}/{self.precision} {self._load_label()} {self._prompts_label()} "
                f"{self._out_label()}"
                + (f" {variant}" if variant else "")
                + "".join(f" {e}" for e in extra)
                + (f" r{self.repeat}" if self.repeat else "")
                + (f" layers={self.layer_profile}" if self.layer_profile else ""))

    def _load_label(self) -> str:
        """``bs=8``, or ``rate=16/s`` (``conc=32`` beside it where capped)."""
        if self.serving is None:
            return f"bs={self.batch_size}"
        return f"rate={self.request_rate:g}/s" + (f" conc={self.max_concurrency}" if self.max_concurrency else "")

    def _prompts_label(self) -> str:
        """``in=128``, or ``data=FILE``; e.g. ``in=2176 (8 prefixes of 2048)``, ``data=chats.json
        (conversations, gap 1 s)``."""
        prompts = f"in={self.input_len}" if self.prompts is None else f"data={PurePath(self.dataset).name}"
        if self.shared_prefix is not None:
            prompts += f" ({self.shared_prefix.num_prefixes} prefixes of {self.shared_prefix.prefix_len})"
        if self.prompts is not None and self.prompts.conversations is not None:
            c = self.prompts.conversations
            prompts += " (conversations" + (f", gap {c.turn_gap_s:g} s" if c.turn_gap_s else "") + \
                (", reference history" if c.history == "reference" else "") + ")"
        return prompts

    def _out_label(self) -> str:
        return (f"out={self.output_len}" if self.output_lengths == "fixed"
                else f"out={self.output_lengths}<={self.output_len}")

@dataclass(frozen=True)
class GroupLoad:
    """What a group's load is told about the group beyond its first trial."""

    # One trial of each other group whose fidelity reference this group's model is: the
    # load computes their references with its own model (``actors.quality.reference``).
    serves_reference: tuple[Trial, ...] = ()
    # The tokens of each engine step the group's trials run (a decode step: one per
    # sequence of the batch; a prefill: the batch's prompt tokens), smallest first: what a
    # vLLM engine captures CUDA graphs for. None: not known in advance (serving arrivals,
    # dataset prompts, lengths that end at EOS).
    step_tokens: tuple[int, ...] | None = None
    # Where a server the group's backend launches writes its log: the run's results directory's
    # ``servers/`` (``ResultStore.server_log_dir``), a path on the node that launches it; None:
    # that node's sweeper cache. Told with each load rather than through the job's environment,
    # so it holds for a run in a process whose Ray driver was started by someone else.
    server_log_dir: str | None = None
    # Values from the driver's environment the load needs (an external server's key,
    # ``BackendSpec.actor_env``): an argument of the load call, never in a runtime environment.
    secrets: SecretValues = SecretValues()


def _shared_prefix_columns(prefix: SharedPrefix | None) -> dict[str, Any]:
    """prefix_repetition's configuration columns (None each: no shared prefixes)."""
    if prefix is None:
        return {"prefix_len": None, "num_prefixes": None}
    return {"prefix_len": prefix.prefix_len, "num_prefixes": prefix.num_prefixes}


def _prompt_file_columns(prompts: DatasetSettings | None) -> dict[str, Any]:
    """A prompt file's (or generated task's) configuration columns (None each: random prompts)."""
    if prompts is None:
        return {"dataset_sha256": None, "min_input_len": None, "max_input_len": None, "chat": None,
                **_conversation_columns(None)}
    return {"dataset_sha256": prompts.sha256, "min_input_len": prompts.min_input_len,
            "max_input_len": prompts.max_input_len, "chat": prompts.chat,
            **_conversation_columns(prompts.conversations)}


def _conversation_columns(conversations: ConversationSettings | None) -> dict[str, Any]:
    """A multi-turn replay's configuration columns (None each: one prompt per record)."""
    if conversations is None:
        return {"conversations": None, "turn_gap_s": None, "history": None}
    return {"conversations": True, "turn_gap_s": conversations.turn_gap_s, "history": conversations.history}


def _arrival_columns(serving: ServingSettings | None) -> dict[str, Any]:
    """How a serving trial's requests arrive and the SLO they are held to, as configuration
    columns (None each: an offline trial, or a bound its SLO does not set)."""
    if serving is None:
        return {"arrival": None, "burstiness": None, "arrivals_duration_s": None,
                "slo_ttft_s": None, "slo_tpot_s": None, "slo_e2e_s": None}
    slo = serving.slo.bounds_s() if serving.slo is not None else {}
    return {"arrival": serving.arrival, "burstiness": serving.burstiness, "arrivals_duration_s": serving.duration_s,
            "slo_ttft_s": slo.get("ttft"), "slo_tpot_s": slo.get("tpot"), "slo_e2e_s": slo.get("e2e")}


def _num_prompts(serving: ServingSettings | None, prompts: DatasetSettings | None) -> int | None:
    """The prompts a trial sends: serving's count where it sets one, else the prompt file's."""
    return (serving.num_prompts if serving is not None else None) or (prompts.num_prompts if prompts is not None else None)


def row_variant(backend: str, options_json: str | None, tensor_parallel: int | None = 1) -> str:
    """``Trial.variant`` for a stored trials row (``tp=2 compile=True``), from its columns."""
    from sweeper.core.backends import BACKENDS

    options: dict[str, Any] = json.loads(options_json) if options_json else {}
    spec = BACKENDS.get(backend)
    if spec is not None:
        # Compared as JSON, not re-validated: rows may come from an older sweeper.
        options = non_default_values(spec.options, options)
    parts = [f"tp={tensor_parallel}"] if tensor_parallel and tensor_parallel > 1 else []
    return _variant_text(parts, options, spec.options if spec is not None else None)


def _variant_text(axis_parts: list[str], options: dict[str, Any], options_type: type | None) -> str:
    """The variant's words: the axes that set it apart, then its non-default options, each as
    ``name=value`` (options models that say themselves briefly define ``describe``)."""
    describe = getattr(options_type, "describe", None)
    if describe is not None:
        options = describe(options)
    return " ".join(axis_parts + [f"{k}={v}" for k, v in sorted(options.items())])


def _content_hash(obj: dict[str, Any]) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]

