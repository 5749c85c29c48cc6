"""Per-module GPU time of a transformers causal LM, from forward hooks (DESIGN §5).

Which modules (``select_units``)
--------------------------------
The decoder blocks are found, not named: the homogeneous ``ModuleList`` whose
length is the config's layer count (``model.model.layers`` for llama, qwen2 and
mistral; ``transformer.h`` for GPT-2). Every module on the path from the root
to that list is a container; their other children (embeddings, rotary
embedding, final norm, lm_head) are *top-level units*. Then

- ``block``: the top-level units and each decoder block;
- ``submodule``: the top-level units and each block's children, by role
  (attention, mlp, norm);
- ``leaf``: every leaf module, labelled with the role of the unit it sits in.

The units of a granularity are disjoint subtrees (checked: no unit is an
ancestor of another), so no GPU time is counted twice, and together they cover
the model's modules, so their times add up to nearly the whole forward.

How they are timed (``LayerProfiler``)
--------------------------------------
A pre-hook marks a module's forward entry, a post-hook its exit. On CUDA a mark
is a recorded CUDA event: host clocks around asynchronous kernels would time
their launch, not their execution. No hook synchronizes; ``flush`` synchronizes
once and reads the elapsed time of every event pair. On CPU a mark is the host
clock, which is exact there because CPU ops run synchronously. A forward whose
input is longer than one token, or the first forward after ``begin_generate``,
is prefill; every other forward (one token, KV cache) is decode.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sweeper.spec import LAYER_GRANULARITIES

PREFILL, DECODE = "prefill", "decode"


class LayerProfileError(Exception):
    """The model's layers cannot be profiled (no decoder blocks found, overlapping units)."""


@dataclass(frozen=True)
class Unit:
    """One profiled module."""

    name: str  # qualified name in the model, "" for the root
    module_type: str  # role: decoder_block, attention, mlp, norm, embedding, ...
    layer_index: int | None  # decoder block index, None outside the blocks
    module: nn.Module = field(repr=False, compare=False)


@dataclass(frozen=True)
class ModuleTime:
    """A unit's calls and GPU time in one phase, summed over everything profiled."""

    module: str
    module_type: str
    layer_index: int | None
    phase: str
    calls: int
    gpu_time_s: float


# -- selection -------------------------------------------------------------------------


def _is_norm(attr: str, module: nn.Module) -> bool:
    a, cls = attr.lower(), type(module).__name__.lower()
    return "norm" in a or a.startswith("ln") or cls.endswith("norm")


def block_child_role(attr: str, module: nn.Module) -> str:
    """A block child's role from its attribute and class name (norm first: "post_attention_layernorm")."""
    a = attr.lower()
    if _is_norm(attr, module):
        return "norm"
    if "attn" in a or "attention" in a:
        return "attention"
    if any(k in a for k in ("mlp", "feed_forward", "ffn", "moe", "experts")):
        return "mlp"
    return "other"


def _top_role(attr: str, module: nn.Module, lm_head: nn.Module | None) -> str:
    a, cls = attr.lower(), type(module).__name__.lower()
    if lm_head is not None and module is lm_head:
        return "lm_head"
    if "rotary" in a or "rotary" in cls:
        return "rotary_embedding"
    if isinstance(module, nn.Embedding) or "embed" in a or a in ("wte", "wpe"):
        return "embedding"
    if _is_norm(attr, module):
        return "final_norm"
    return "other"


def _join(prefix: str, attr: str) -> str:
    return f"{prefix}.{attr}" if prefix and attr else prefix or attr


def _n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The qualified name and ``ModuleList`` of the model's decoder blocks.

    Candidates are non-empty ``ModuleList``s of one class; one as long as the
    config's layer count wins, the largest by parameters among equals (so an
    MoE block's list of experts never beats the list of blocks holding it).
    """
    config = getattr(model, "config", None)
    n_layers = getattr(config, "num_hidden_layers", None) if config is not None else None
    candidates = [
        (name, mod) for name, mod in model.named_modules()
        if isinstance(mod, nn.ModuleList) and len(mod) > 0 and len({type(c) for c in mod}) == 1
    ]
    if not candidates:
        raise LayerProfileError(f"{type(model).__name__}: no list of decoder blocks (no ModuleList) found")
    matching = [c for c in candidates if n_layers is not None and len(c[1]) == n_layers]
    name, layers = max(matching or candidates, key=lambda c: _n_params(c[1]))
    return name, layers


def _top_level_units(model: nn.Module, layers_name: str) -> list[Unit]:
    """The children of every container on the path root -> block list, except that path."""
    try:
        lm_head = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        lm_head = None
    units: list[Unit] = []
    parts = layers_name.split(".")
    container, prefix = model, ""
    for step in parts:
        for attr, child in container.named_children():
            if attr != step:
                units.append(Unit(_join(prefix, attr), _top_role(attr, child, lm_head), None, child))
        container, prefix = getattr(container, step), _join(prefix, step)
    return units


def _leaves(unit: Unit) -> list[Unit]:
    """Leaf modules under ``unit`` (itself if it is a leaf), labelled with its role and layer."""
    out = []
    for name, mod in unit.module.named_modules():
        if next(mod.children(), None) is None:
            out.append(Unit(_join(unit.name, name), unit.module_type, unit.layer_index, mod))
    return out


def select_units(model: nn.Module, granularity: str) -> list[Unit]:
    """The modules to time at ``granularity``, in model order, disjoint (checked)."""
    if granularity not in LAYER_GRANULARITIES:
        raise LayerProfileError(f"unknown granularity {granularity!r}; known: {', '.join(LAYER_GRANULARITIES)}")
    layers_name, layers = find_decoder_layers(model)
    top = _top_level_units(model, layers_name)
    blocks = [Unit(_join(layers_name, str(i)), "decoder_block", i, b) for i, b in enumerate(layers)]
    if granularity == "block":
        inner = blocks
    else:
        inner = []
        for b in blocks:
            children = [Unit(_join(b.name, attr), block_child_role(attr, child), b.layer_index, child)
                        for attr, child in b.module.named_children()]
            inner += children or [b]  # a block without children is its own unit
    # Embeddings before the blocks, lm_head and final norm after them: model order.
    before = [u for u in top if u.module_type in ("embedding", "rotary_embedding")]
    after = [u for u in top if u not in before]
    units = before + inner + after
    if granularity == "leaf":
        # A leaf reused by several units (a shared activation, say) is hooked once.
        leaves: dict[int, Unit] = {}
        for u in units:
            for leaf in _leaves(u):
                leaves.setdefault(id(leaf.module), leaf)
        units = list(leaves.values())
    assert_disjoint(units)
    return units


def assert_disjoint(units: list[Unit]) -> None:
    """Raise if a unit is another's ancestor, or listed twice: its time would count twice.

    Two units may share a descendant (a module reused by two blocks): each call
    of it happens inside one unit's interval, so nothing is counted twice.
    """
    ids = [id(u.module) for u in units]
    if len(set(ids)) != len(ids):
        raise LayerProfileError("a module is selected twice: its time would count twice")
    selected = {id(u.module): u.name for u in units}
    for u in units:
        for mod in u.module.modules():
            if mod is not u.module and id(mod) in selected:
                raise LayerProfileError(
                    f"modules {u.name!r} and {selected[id(mod)]!r} overlap: time would count twice")


def forward_unit(model: nn.Module) -> Unit:
    """The whole model as one unit: the reference forward time, without per-layer hooks."""
    return Unit("", "forward", None, model)


# -- timers ---------------------------------------------------------------------------


class HostTimer:
    """Marks are host-clock readings: GPU time only where ops run synchronously (CPU)."""

    kind = "host_clock"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock

    def mark(self) -> float:
        return self._clock()

    def finish(self) -> None:
        pass

    def reserve(self, n: int) -> None:
        pass  # host marks cost nothing to make

    def recycle(self) -> None:
        pass

    def elapsed_s(self, start: float, end: float) -> float:
        return end - start


class CudaEventTimer:
    """Marks are CUDA events recorded on the current stream; read after one synchronize.

    Events come from a pool filled outside the timed work: creating one costs
    host time, and in a launch-bound decode step every microsecond of host time
    between two records is GPU time inside the interval (measured on an H200:
    creating events inside the hooks inflated submodule times by 13-21 %).
    """

    kind = "cuda_events"

    def __init__(self) -> None:
        self._free: list[torch.cuda.Event] = []
        self._used: list[torch.cuda.Event] = []

    def reserve(self, n: int) -> None:
        """Have at least ``n`` events ready; call it where no interval is open."""
        missing = n - len(self._free)
        if missing > 0:
            self._free.extend(torch.cuda.Event(enable_timing=True) for _ in range(missing))

    def mark(self) -> torch.cuda.Event:
        event = self._free.pop() if self._free else torch.cuda.Event(enable_timing=True)
        event.record()
        self._used.append(event)
        return event

    def finish(self) -> None:
        torch.cuda.synchronize()

    def elapsed_s(self, start: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return start.elapsed_time(end) / 1000.0  # elapsed_time is in ms

    def recycle(self) -> None:
        """After ``finish`` and every ``elapsed_s``: recorded events may be recorded again."""
        self._free.extend(self._used)
        self._used.clear()


def timer_for(model: nn.Module) -> HostTimer | CudaEventTimer:
    param = next(model.parameters(), None)
    on_cuda = param is not None and param.device.type == "cuda"
    return CudaEventTimer() if on_cuda else HostTimer()


# -- the profiler ------------------------------------------------------------------------


def _sequence_length(args: tuple, kwargs: dict) -> int | None:
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if value is not None:
            return int(value.shape[1])
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
        return int(args[0].shape[1])
    return None


class LayerProfiler:
    """Times ``units`` of ``model`` per phase while attached (a context manager).

    Marks accumulate until ``flush``, which synchronizes once and folds them
    into per-unit, per-phase totals; call it after the timed work, outside
    any window it must not disturb.
    """

    def __init__(self, model: nn.Module, units: list[Unit], timer: HostTimer | CudaEventTimer | None = None,
                 *, max_pending: int = 200_000) -> None:
        assert_disjoint(units)
        self.model = model
        self.units = list(units)
        self.timer = timer or timer_for(model)
        self.max_pending = max_pending  # bounds memory: beyond this many open pairs, flush early
        self.phase = PREFILL
        self.forwards = {PREFILL: 0, DECODE: 0}
        self._next_is_prefill = False
        self._open: list[list[tuple[str, Any]]] = [[] for _ in self.units]  # per unit: stack of (phase, start)
        self._pending: list[tuple[int, str, Any, Any]] = []
        self._calls: dict[tuple[int, str], int] = {}
        self._time_s: dict[tuple[int, str], float] = {}
        self._handles: list[Any] = []

    # -- hooks --------------------------------------------------------------------------
    def attach(self) -> LayerProfiler:
        if self._handles:
            raise LayerProfileError("profiler is already attached")
        # Registered first, so the phase is set before any unit's pre-hook runs (the
        # root itself may be a unit).
        self._handles.append(self.model.register_forward_pre_hook(self._on_forward, with_kwargs=True))
        for i, unit in enumerate(self.units):
            self._handles.append(unit.module.register_forward_pre_hook(self._pre(i)))
            self._handles.append(unit.module.register_forward_hook(self._post(i)))
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> LayerProfiler:
        return self.attach()

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def begin_generate(self) -> None:
        """The next forward starts a generate call: prefill, even with a one-token prompt."""
        self._next_is_prefill = True

    def _on_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        length = _sequence_length(args, kwargs)
        prefill = self._next_is_prefill or (length is not None and length > 1)
        self._next_is_prefill = False
        self.phase = PREFILL if prefill else DECODE
        self.forwards[self.phase] += 1

    def _pre(self, i: int) -> Callable:
        stack, timer = self._open[i], self.timer

        def hook(module: nn.Module, args: tuple) -> None:
            stack.append((self.phase, timer.mark()))

        return hook

    def _post(self, i: int) -> Callable:
        stack, timer, pending = self._open[i], self.timer, self._pending

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            end = timer.mark()  # first: the hook's own work stays outside the interval
            phase, start = stack.pop()
            pending.append((i, phase, start, end))
            if len(pending) >= self.max_pending:
                self.flush()

        return hook

    # -- results ------------------------------------------------------------------------
    def flush(self) -> None:
        """Synchronize once and fold every finished mark pair into the totals."""
        if not self._pending:
            return
        self.timer.finish()
        for i, phase, start, end in self._pending:
            key = (i, phase)
            self._calls[key] = self._calls.get(key, 0) + 1
            self._time_s[key] = self._time_s.get(key, 0.0) + self.timer.elapsed_s(start, end)
        self._pending.clear()
        self.timer.recycle()

    def results(self) -> list[ModuleTime]:
        """Per unit and phase (units in model order, prefill first); phases without calls are left out."""
        self.flush()
        out = []
        for phase in (PREFILL, DECODE):
            for i, u in enumerate(self.units):
                calls = self._calls.get((i, phase), 0)
                if calls:
                    out.append(ModuleTime(u.name, u.module_type, u.layer_index, phase, calls,
                                          self._time_s[(i, phase)]))
        return out
