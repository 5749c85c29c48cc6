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
ancestor of another), so no GPU time is counted twice. Code that runs in a
container but outside its units (a block's residual adds at ``submodule``,
the model's mask and position set-up, the attention kernel between leaves)
is timed too, as the container's ``<role>_rest`` row (``rest_units``), so a
phase's rows add up to its whole forward.

How they are timed (``LayerProfiler``)
--------------------------------------
A pre-hook opens a range at a module's forward entry, a post-hook closes it;
ranges nest (a container's holds its units'). No hook synchronizes. What a
range's time is depends on the timer (``timer_for``; the kind is each row's
``gpu_time_method``):

- ``cuda_kernel_time`` (the default on CUDA, ``KernelTimer``): the summed
  duration of the kernels (and memcpy/memset) launched inside the range,
  from ``torch.profiler``/CUPTI. This is what the GPU spent executing the
  module. An interval between two CUDA events around it would also count the
  gaps in which the GPU waits for the host to launch the module's next kernel;
  at small batches decode is launch-bound, those gaps are a large part of
  every interval, and the hooks' own host time widens them (on an H200, 1B
  model: event-pair sums were 1.00-1.43x the hook-free forward).
- ``cuda_event_interval`` (``CudaEventTimer``): the GPU timeline between two
  CUDA events, gaps included; kept for comparison.
- ``host_clock`` (the default on CPU, ``HostTimer``): exact there, CPU ops
  run synchronously.

A forward whose input is longer than one token, or the first forward after
``begin_generate``, is prefill; every other forward (one token, KV cache) is
decode.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from sweeper.core.trial import LAYER_GRANULARITIES

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
    gpu_time_method: str | None = None  # the timer's kind: what "GPU time" means here


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


def _labels(model: nn.Module) -> dict[int, tuple[str, int | None]]:
    """Role and block index of every module below a block or top-level unit (inherited from it)."""
    labels: dict[int, tuple[str, int | None]] = {}
    try:
        _, layers = find_decoder_layers(model)
        units = select_units(model, "submodule")
    except LayerProfileError:
        return labels
    for u in units:
        for mod in u.module.modules():
            labels.setdefault(id(mod), (u.module_type, u.layer_index))
    for i, block in enumerate(layers):
        labels[id(block)] = ("decoder_block", i)
    return labels


def rest_units(model: nn.Module, units: list[Unit]) -> list[Unit]:
    """The root and every called module that holds a unit: the profiler times them too.

    What a container runs outside its profiled children (a block's residual
    adds at ``submodule``, the model's mask and position set-up, the attention
    kernel itself at ``leaf``) would otherwise belong to no row; each gets a
    ``<role>_rest`` row, so the rows of a phase add up to its whole forward.
    The root's range is the forward itself: the reference for coverage.
    """
    names = {id(m): n for n, m in model.named_modules()}
    unit_ids = {id(u.module) for u in units}
    by_name = dict(model.named_modules())
    wanted: dict[str, nn.Module] = {"": model}
    for u in units:
        name = names.get(id(u.module), u.name)
        parts = name.split(".") if name else []
        for k in range(1, len(parts)):
            prefix = ".".join(parts[:k])
            mod = by_name.get(prefix)
            # ModuleList/ModuleDict are never called: no forward of their own to time.
            if mod is not None and not isinstance(mod, (nn.ModuleList, nn.ModuleDict)):
                wanted[prefix] = mod
    labels = _labels(model)
    out = []
    for name, mod in sorted(wanted.items(), key=lambda kv: (kv[0].count("."), kv[0]) if kv[0] else (-1, "")):
        if id(mod) in unit_ids:
            continue
        role, layer_index = labels.get(id(mod), ("model", None))
        out.append(Unit(name, f"{role}_rest", layer_index, mod))
    return out


# -- timers ---------------------------------------------------------------------------
#
# A timer times *ranges*: ``begin(key)`` in a module's pre-hook, ``end(key, token)``
# in its post-hook, ``read()`` afterwards gives each key's inclusive time (a range's
# time includes the ranges nested in it). Keys are (range, phase) pairs, as ints.


class IntervalTimer:
    """Times a range as the interval between two marks; subclasses say what a mark is."""

    kind = "interval"

    def __init__(self) -> None:
        self.pending: list[tuple[int, Any, Any]] = []

    def mark(self) -> Any:
        raise NotImplementedError

    def finish(self) -> None:
        """Make every recorded mark readable (one synchronize)."""

    def elapsed_s(self, start: Any, end: Any) -> float:
        raise NotImplementedError

    def reserve(self, n: int) -> None:
        """Have ``n`` marks ready before the timed work (where making one costs time)."""

    def recycle(self) -> None:
        """After ``finish`` and every ``elapsed_s``: marks may be reused."""

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        yield

    def begin(self, key: int) -> Any:
        return self.mark()

    def end(self, key: int, token: Any) -> None:
        self.pending.append((key, token, self.mark()))

    def read(self) -> dict[int, float]:
        if not self.pending:
            return {}
        self.finish()
        out: dict[int, float] = {}
        for key, start, end in self.pending:
            out[key] = out.get(key, 0.0) + self.elapsed_s(start, end)
        self.pending.clear()
        self.recycle()
        return out


class HostTimer(IntervalTimer):
    """Marks are host-clock readings: device time only where ops run synchronously (CPU)."""

    kind = "host_clock"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__()
        self._clock = clock

    def mark(self) -> float:
        return self._clock()

    def elapsed_s(self, start: float, end: float) -> float:
        return end - start


class CudaEventTimer(IntervalTimer):
    """Marks are CUDA events recorded on the current stream; read after one synchronize.

    An event pair measures the GPU timeline between two points, idle gaps
    included: where the GPU waits for the host to launch the next kernel
    (launch-bound decode), that wait, and any host work inside the pair, counts.
    Events come from a pool filled outside the timed work: creating one costs
    host time (measured on an H200: creating events inside the hooks inflated
    submodule times by 13-21 %).
    """

    kind = "cuda_event_interval"

    def __init__(self) -> None:
        super().__init__()
        self._free: list[torch.cuda.Event] = []
        self._used: list[torch.cuda.Event] = []

    def reserve(self, n: int) -> None:
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
        self._free.extend(self._used)
        self._used.clear()


_RANGE_PREFIX = "sweeper.layers#"
_DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})  # Kineto activity types that occupy the GPU
_LAUNCHES = frozenset({"cuda_runtime", "cuda_driver"})


def _activity(e: Any) -> str:
    """Kineto's activity type; torch < 2.12 lacks ``activity_type()``, so infer it there."""
    get = getattr(e, "activity_type", None)
    if get is not None:
        return get()
    if str(e.device_type()).endswith("CUDA"):
        return "kernel"  # any GPU-side activity (kernel, memcpy, memset) occupies the GPU
    if e.is_user_annotation():
        return "user_annotation"
    name = e.name()
    if name.startswith(("cuda", "cu")) and not name.startswith("cudnn"):
        return "cuda_runtime"
    return "cpu_op"


def range_name(key: int) -> str:
    return f"{_RANGE_PREFIX}{key}"


def _stack_index(ranges: list[tuple[int, int, int]]) -> tuple[list[int], list[tuple[int, ...]]]:
    """For properly nested ranges (start_ns, end_ns, key): the open keys from each boundary on.

    ``stacks[j]`` holds between ``starts[j]`` (inclusive) and the next boundary;
    at a shared instant a range closes before the next one opens.
    """
    points = sorted([(s, 1, k) for s, _, k in ranges] + [(e, 0, k) for _, e, k in ranges])
    starts: list[int] = []
    stacks: list[tuple[int, ...]] = []
    stack: list[int] = []
    for t, opening, key in points:
        if opening:
            stack.append(key)
        elif stack and stack[-1] == key:
            stack.pop()
        elif key in stack:  # not nested (cannot happen with module hooks): drop the last one open
            del stack[len(stack) - 1 - stack[::-1].index(key)]
        if starts and starts[-1] == t:
            stacks[-1] = tuple(stack)
        else:
            starts.append(t)
            stacks.append(tuple(stack))
    return starts, stacks


class KernelTimer:
    """A range's time is the busy time of the device work launched inside it (DESIGN §5).

    Ranges are ``record_function`` ranges opened and closed by the hooks; the
    work runs under ``torch.profiler`` (Kineto; CUPTI on CUDA). Afterwards each
    GPU kernel, memcpy or memset is attributed to the ranges open when the host
    launched it: Kineto links it to its launching CPU op by correlation id
    (``linked_correlation_id``, as torch's own ``FunctionEvent.device_time_total``
    does), or, failing that, to its ``cudaLaunchKernel``-style runtime call.
    Unlike an event pair, this excludes the gaps in which the GPU waits for the
    host, and the hooks' own host time: in a launch-bound forward those gaps
    are most of an event interval.

    On the CPU (``device="cpu"``) the work is the outermost CPU ops inside a
    range (op time, without the Python between ops): the same attribution,
    which is how the tests exercise it without a GPU.
    """

    def __init__(self, device: str = "cuda") -> None:
        self.device = device
        self.kind = "cuda_kernel_time" if device == "cuda" else "cpu_op_time"
        self._names: dict[int, str] = {}
        self.profiles: list[Any] = []  # torch.profiler sessions not yet read
        self._active = False
        # Diagnostics of everything read so far (counts and seconds), for benches and logs.
        self.stats: dict[str, Any] = {"work_items": 0, "linked_via_op": 0, "linked_via_launch": 0,
                                      "unlinked": 0, "unlinked_s": 0.0, "outside_ranges_s": 0.0,
                                      "items_per_key": {}}
        fast = getattr(torch._C._profiler, "_RecordFunctionFast", None)  # ~0.7 us a range, vs ~6 us
        self._range = fast if fast is not None else torch.autograd.profiler.record_function

    def reserve(self, n: int) -> None:
        pass

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        prof = profile(activities=activities)
        prof.start()
        self._active = True
        try:
            yield
        finally:
            prof.stop()  # synchronizes the device, then collects the trace
            self._active = False
            self.profiles.append(prof)

    def begin(self, key: int) -> Any:
        name = self._names.get(key)
        if name is None:
            name = self._names[key] = range_name(key)
        rf = self._range(name)
        rf.__enter__()
        return rf

    def end(self, key: int, token: Any) -> None:
        token.__exit__(None, None, None)

    def read(self) -> dict[int, float]:
        if self._active:
            raise LayerProfileError("kernel times are readable only after the profiled work (detach first)")
        out: dict[int, float] = {}
        for prof in self.profiles:
            # The raw Kineto events, not ``prof.events()``: torch's FunctionEvent tree
            # costs tens of microseconds an event, and a pass holds millions.
            for key, seconds in self.attribute(prof.profiler.kineto_results.events()).items():
                out[key] = out.get(key, 0.0) + seconds
        self.profiles.clear()
        return out

    def attribute(self, events: Iterable[Any]) -> dict[int, float]:
        """Inclusive seconds per range key from Kineto events (``_KinetoEvent``-like objects)."""
        ranges: dict[int, list[tuple[int, int, int]]] = {}
        ops: dict[int, tuple[int, int]] = {}  # correlation id -> (thread, host start), CPU ops
        launches: dict[int, tuple[int, int]] = {}  # correlation id -> (thread, host start), runtime calls
        cpu_ops: dict[int, list[tuple[int, int]]] = {}  # thread -> [(start, end)], the CPU-mode work
        device_work: list[tuple[int, int, int]] = []  # (linked op id, correlation id, duration ns)
        on_cuda = self.device == "cuda"
        for e in events:
            activity = _activity(e)
            if activity in _DEVICE_WORK:
                if on_cuda:
                    device_work.append((e.linked_correlation_id(), e.correlation_id(), e.duration_ns()))
                continue
            if activity in _LAUNCHES:
                launches[e.correlation_id()] = (e.start_thread_id(), e.start_ns())
                continue
            if activity not in ("cpu_op", "user_annotation"):
                continue
            name = e.name()
            if name.startswith(_RANGE_PREFIX):
                ranges.setdefault(e.start_thread_id(), []).append(
                    (e.start_ns(), e.end_ns(), int(name[len(_RANGE_PREFIX):])))
            elif on_cuda:
                ops[e.correlation_id()] = (e.start_thread_id(), e.start_ns())
            elif activity == "cpu_op" and not name.startswith("profiler::"):
                cpu_ops.setdefault(e.start_thread_id(), []).append((e.start_ns(), e.end_ns()))

        items: list[tuple[int, int, int]] = []  # (thread, host time, duration ns)
        stats = self.stats
        if on_cuda:
            for linked, corr, duration in device_work:
                where = ops.get(linked) if linked else None
                if where is not None:
                    stats["linked_via_op"] += 1
                else:
                    where = launches.get(corr)
                    if where is None:
                        stats["unlinked"] += 1
                        stats["unlinked_s"] += duration / 1e9
                        continue
                    stats["linked_via_launch"] += 1
                items.append((where[0], where[1], duration))
        else:
            # Outermost ops only: an op's children run inside its time.
            for thread, spans in cpu_ops.items():
                outer_end = None
                for start, end in sorted(spans, key=lambda se: (se[0], -se[1])):
                    if outer_end is None or start >= outer_end:
                        items.append((thread, start, end - start))
                        outer_end = end
        stats["work_items"] += len(items)

        index = {thread: _stack_index(rs) for thread, rs in ranges.items()}
        out: dict[int, float] = {}
        per_key = stats["items_per_key"]
        for thread, t, duration in items:
            starts, stacks = index.get(thread, ((), ()))
            j = bisect.bisect_right(starts, t) - 1
            open_keys = stacks[j] if j >= 0 else ()
            if not open_keys:
                stats["outside_ranges_s"] += duration / 1e9  # sampling, logits processors, ...
                continue
            for key in open_keys:  # every enclosing range: inclusive times
                out[key] = out.get(key, 0.0) + duration / 1e9
                per_key[key] = per_key.get(key, 0) + 1
        return out


Timer = HostTimer | CudaEventTimer | KernelTimer
TIMER_METHODS = ("kernel_time", "event_interval", "host_clock")


def timer_for(model: nn.Module, method: str | None = None) -> Timer:
    """The default: kernel time on CUDA, host clock on CPU (exact there: CPU ops are synchronous)."""
    param = next(model.parameters(), None)
    device = "cuda" if param is not None and param.device.type == "cuda" else "cpu"
    method = method or ("kernel_time" if device == "cuda" else "host_clock")
    if method == "kernel_time":
        return KernelTimer(device)
    if method == "event_interval":
        if device != "cuda":
            raise LayerProfileError("event_interval timing needs a CUDA model")
        return CudaEventTimer()
    if method == "host_clock":
        return HostTimer()
    raise LayerProfileError(f"unknown timing method {method!r}; known: {', '.join(TIMER_METHODS)}")


# -- the profiler ------------------------------------------------------------------------


def _sequence_length(args: tuple, kwargs: dict) -> int | None:
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if value is not None:
            return int(value.shape[1])
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
        return int(args[0].shape[1])
    return None


_PHASES = (PREFILL, DECODE)


class LayerProfiler:
    """Times ``units`` of ``model`` per phase while attached (a context manager).

    Besides the units it ranges the root (the whole forward) and every called
    module holding a unit (``rest_units``): a container's time minus its
    ranged children's is its ``_rest`` row. Times accumulate until ``flush``
    (one synchronize, or the profiler trace's attribution); call it after
    the timed work, outside any window it must not disturb.
    """

    def __init__(self, model: nn.Module, units: list[Unit], timer: Timer | None = None,
                 *, max_pending: int = 200_000) -> None:
        assert_disjoint(units)
        self.model = model
        self.units = list(units)
        self.rests = rest_units(model, self.units)
        self.timer = timer or timer_for(model)
        self.max_pending = max_pending  # interval timers: beyond this many open pairs, flush early
        self.phase = PREFILL
        self.forwards = {PREFILL: 0, DECODE: 0}
        self._phase_i = 0
        self._next_is_prefill = False
        ranges = self.units + self.rests
        self._ranges = ranges
        self._root = next((i for i, r in enumerate(ranges) if r.module is model), None)
        self._parent = self._parents(ranges)
        self._open: list[list[tuple[int, Any]]] = [[] for _ in ranges]  # per range: stack of (key, token)
        self._calls = [0] * (2 * len(ranges))
        self._time_s = [0.0] * (2 * len(ranges))
        self._handles: list[Any] = []
        self._session: Any = None

    def _parents(self, ranges: list[Unit]) -> list[int | None]:
        """Each range's nearest enclosing range, from the module tree (qualified names)."""
        names = {id(m): n for n, m in self.model.named_modules()}
        qualified = [names.get(id(r.module), r.name) for r in ranges]
        index = {q: i for i, q in enumerate(qualified)}
        parents: list[int | None] = []
        for q in qualified:
            parent = None
            parts = q.split(".") if q else []
            while parts and parent is None:
                parts = parts[:-1]
                parent = index.get(".".join(parts))
            parents.append(parent)
        return parents

    @property
    def method(self) -> str:
        return self.timer.kind

    def reserve(self, forwards: int) -> None:
        """Prepare for ``forwards`` forward calls (interval timers: a pool of marks, made now)."""
        self.timer.reserve(2 * len(self._ranges) * forwards)

    # -- hooks --------------------------------------------------------------------------
    def attach(self) -> LayerProfiler:
        if self._handles:
            raise LayerProfileError("profiler is already attached")
        # Registered first, so the phase is set before any range's pre-hook runs.
        self._handles.append(self.model.register_forward_pre_hook(self._on_forward, with_kwargs=True))
        for i, r in enumerate(self._ranges):
            self._handles.append(r.module.register_forward_pre_hook(self._pre(i)))
            self._handles.append(r.module.register_forward_hook(self._post(i)))
        self._session = self.timer.session()
        self._session.__enter__()
        return self

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self._session is not None:
            session, self._session = self._session, None
            session.__exit__(None, None, None)

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
        self._phase_i = 0 if prefill else 1
        self.forwards[self.phase] += 1

    def _pre(self, i: int) -> Callable:
        stack, timer = self._open[i], self.timer

        def hook(module: nn.Module, args: tuple) -> None:
            key = 2 * i + self._phase_i
            stack.append((key, timer.begin(key)))

        return hook

    def _post(self, i: int) -> Callable:
        stack, timer, calls = self._open[i], self.timer, self._calls
        pending = getattr(timer, "pending", None)  # interval timers: pairs held until a flush

        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            key, token = stack.pop()
            timer.end(key, token)
            calls[key] += 1
            if pending is not None and len(pending) >= self.max_pending:
                self.flush()

        return hook

    # -- results ------------------------------------------------------------------------
    def flush(self) -> None:
        """Fold every finished range into the totals (interval timers: one synchronize)."""
        for key, seconds in self.timer.read().items():
            self._time_s[key] += seconds

    def forward_time_s(self) -> dict[str, tuple[int, float]]:
        """Per phase: (forward calls, the forwards' time), the root's range."""
        self.flush()
        if self._root is None:
            return {}
        return {p: (self._calls[2 * self._root + k], self._time_s[2 * self._root + k])
                for k, p in enumerate(_PHASES) if self._calls[2 * self._root + k]}

    def results(self) -> list[ModuleTime]:
        """Per unit and phase, then each container's rest (prefill first); phases without calls are left out.

        A rest is its container's time less its ranged children's: the rows of a
        phase add up to the forward's time, and nothing is counted twice.
        """
        self.flush()
        n = len(self.units)
        children_s = [0.0] * len(self._time_s)
        for i, parent in enumerate(self._parent):
            if parent is not None:
                for k in range(2):
                    children_s[2 * parent + k] += self._time_s[2 * i + k]
        out = []
        for k, phase in enumerate(_PHASES):
            for i, r in enumerate(self._ranges):
                key = 2 * i + k
                if not self._calls[key]:
                    continue
                seconds = self._time_s[key]
                if i >= n:
                    # Float residue aside, children's ranges lie within their container's.
                    seconds = max(0.0, seconds - children_s[key])
                out.append(ModuleTime(r.name, r.module_type, r.layer_index, phase, self._calls[key], seconds,
                                      self.timer.kind))
        return out
