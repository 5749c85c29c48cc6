"""Trial records: frozen, fully resolved, identified by a hash of their content."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Literal, get_args

# Bumped when the measurement method changes in a way that makes old results
# incomparable: every trial id changes and a resumed sweep re-runs everything.
# 2: energy windows stamped after the meter's counter reads; backend options
#    at their defaults left out of the identity.
METHOD_VERSION = 2

# Layer-profiling granularities: decoder blocks, the attention / MLP / norms
# inside each block, or every leaf module.
LayerGranularity = Literal["block", "submodule", "leaf"]
LAYER_GRANULARITIES: tuple[str, ...] = get_args(LayerGranularity)


@dataclass(frozen=True)
class MeasureSettings:
    warmup_iters: int = 1
    # Warm-up lasts at least this long too: host-bound decode loops (CPU boost,
    # allocator, caches) settle over seconds, not over one call.
    warmup_s: float = 0.0
    min_iters: int = 5
    min_duration_s: float = 10.0
    idle_s: float = 2.0
    sample_interval_s: float = 0.1
    min_window_s: float = 10.0
    max_iteration_cv: float = 0.05
    # Wall-clock limit of one trial on its actor (warm-up included), or None: no limit.
    timeout_s: float | None = None


@dataclass(frozen=True)
class Trial:
    sweep: str
    model: str
    model_source: str  # synthetic | path | hub
    model_location: str  # preset name, directory or hub id
    backend: str
    precision: str
    batch_size: int
    input_len: int
    output_len: int
    dataset: str
    seed: int
    repeat: int
    backend_options: str  # canonical JSON of the backend's validated options
    measure: MeasureSettings = MeasureSettings()
    # Layer-profiling granularity (block | submodule | leaf), or None: no profiling pass.
    layer_profile: str | None = None
    # GPUs one trial holds, on one node; the backend shards the model over them.
    tensor_parallel: int = 1
    # Canonical JSON of the sweep's fidelity settings (reference precision, prompts),
    # or None: no fidelity pass.
    fidelity: str | None = None
    trial_id: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "trial_id", _content_hash(self.identity()))

    def identity(self) -> dict:
        """What makes two trials the same measurement.

        The sweep's name and the model's on-disk location are left out: renaming
        a sweep or moving a checkpoint does not make old results wrong.
        """
        skip = {"sweep", "model_location", "trial_id", "measure"}
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in skip}
        d["measure"] = asdict(self.measure)
        d["method_version"] = METHOD_VERSION
        # Optional settings join the identity only when set, so that adding
        # one never changes the ids of trials that do not use it (resume).
        for name in ("layer_profile", "fidelity"):
            if d[name] is None:
                del d[name]
        if d["tensor_parallel"] == 1:
            del d["tensor_parallel"]
        if d["measure"]["timeout_s"] is None:
            del d["measure"]["timeout_s"]
        if d["measure"]["warmup_s"] == 0:
            del d["measure"]["warmup_s"]
        # Likewise backend options at their defaults: a new option never
        # changes the ids of trials that leave it alone.
        d["backend_options"] = _non_default_options(self.backend, self.backend_options)
        return d

    @property
    def load_key(self) -> tuple:
        """Trials with the same load key share one loaded model on one actor."""
        return (self.model, self.model_source, self.backend, self.precision, self.backend_options,
                self.tensor_parallel)

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel

    def axes(self) -> dict:
        return {
            "model": self.model, "backend": self.backend, "precision": self.precision,
            "batch_size": self.batch_size, "input_len": self.input_len,
            "output_len": self.output_len, "tensor_parallel": self.tensor_parallel,
            "repeat": self.repeat,
        }

    def columns(self) -> dict:
        """The trial's configuration as flat trials-table columns."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "measure"}
        d.update(asdict(self.measure))
        # A limit on the driver's patience, not a measurement setting: it never
        # shapes an ok row's numbers, so it is no trials-table column.
        del d["timeout_s"]
        return d

    def variant(self) -> str:
        """What sets this trial apart beyond the main axes: tensor parallelism and
        backend options away from their defaults (e.g. ``tp=2 compile=True``)."""
        return variant_label(self.backend, self.backend_options, self.tensor_parallel)

    def label(self) -> str:
        variant = self.variant()
        return (f"{self.model} {self.backend}/{self.precision} bs={self.batch_size} "
                f"in={self.input_len} out={self.output_len}"
                + (f" {variant}" if variant else "")
                + (f" r{self.repeat}" if self.repeat else "")
                + (f" layers={self.layer_profile}" if self.layer_profile else ""))


def variant_label(backend: str, options_json: str | None, tensor_parallel: int | None = 1) -> str:
    """``tp=2 compile=True``-style text for a trial's non-default options (also from table rows)."""
    options = _non_default_options(backend, options_json) if options_json else {}
    parts = [f"tp={tensor_parallel}"] if tensor_parallel and tensor_parallel > 1 else []
    return " ".join(parts + [f"{k}={v}" for k, v in sorted(options.items())])


@functools.cache
def _default_options(backend: str) -> dict | None:
    """The backend's options at their defaults (None: not a registered backend)."""
    from sweeper.core.backends import BACKENDS

    spec = BACKENDS.get(backend)
    return None if spec is None else spec.options().model_dump(mode="json")


def _non_default_options(backend: str, options_json: str) -> dict:
    # Every trial's id goes through here: the defaults are built once per backend.
    options = json.loads(options_json)
    defaults = _default_options(backend)
    if defaults is None:
        return options
    return {k: v for k, v in options.items() if defaults.get(k, object()) != v}


def _content_hash(obj: dict) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
