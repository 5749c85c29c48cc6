"""What a profiled module's time is: the timers the layer profiler uses.

A timer times *ranges*: ``begin(key)`` in a module's pre-hook, ``end(key, token)``
in its post-hook, ``read()`` afterwards gives each key's inclusive time (a range's
time includes the ranges nested in it). Keys are (range, phase) pairs, as ints.
No hook synchronizes the device; times are read after the timed work.

- ``KernelTimer`` (the default on CUDA; rows say ``cuda_kernel_time``): the summed
  duration of the kernels (and memcpy/memset) launched inside the range, from
  ``torch.profiler``/CUPTI. This is what the GPU spent executing the module. An
  interval between two CUDA events around it would also count the gaps in which
  the GPU waits for the host to launch the module's next kernel; at small batches
  decode is launch-bound, those gaps are a large part of every interval, and the
  hooks' own host time widens them (on an H200, 1B model: event-pair sums were
  1.00-1.43x the hook-free forward). So production times kernels; the event-pair
  timer lives with the benchmark that compares the two (``bench/layer_timers.py``).
- ``HostTimer`` (the default on CPU; ``host_clock``): exact there, CPU ops run
  synchronously.

``Timer`` is what the profiler needs of a timer; ``IntervalTimer`` is the base of
timers that time a range as the interval between two marks. Any other timer is
handed to ``LayerProfiler`` as an object: ``timer_for`` knows only these two.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import torch
from torch import nn

from actors.layers import LayerProfileError


class Timer(Protocol):
    """What ``LayerProfiler`` needs of a timer."""

    @property
    def kind(self) -> str:
        """What a row's time means: its ``gpu_time_method``."""
        ...

    def reserve(self, n: int) -> None:
        """Prepare for ``n`` ranges before the timed work (where preparing costs time)."""
        ...

    def session(self) -> contextlib.AbstractContextManager[None]:
        """Held while the hooks are attached: whatever must run around the timed work."""
        ...

    def begin(self, key: int) -> Any:
        """Open a range (in a pre-hook); the token goes back to ``end``."""
        ...

    def end(self, key: int, token: Any) -> None:
        """Close the range ``begin`` opened (in a post-hook)."""
        ...

    def read(self) -> dict[int, float]:
        """Seconds per key of every range closed since the last read."""
        ...


M = TypeVar("M")  # a mark: whatever an interval timer records at a range's ends


class IntervalTimer(Generic[M]):
    """Times a range as the interval between two marks; subclasses say what a mark is."""

    kind = "interval"

    def __init__(self) -> None:
        self.pending: list[tuple[int, M, M]] = []

    def mark(self) -> M:
        raise NotImplementedError

    def finish(self) -> None:
        """Make every recorded mark readable (one synchronize)."""

    def elapsed_s(self, start: M, end: M) -> float:
        raise NotImplementedError

    def reserve(self, n: int) -> None:
        """Have ``n`` marks ready before the timed work (where making one costs time)."""

    def recycle(self) -> None:
        """After ``finish`` and every ``elapsed_s``: marks may be reused."""

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        yield

    def begin(self, key: int) -> M:
        return self.mark()

    def end(self, key: int, token: M) -> None:
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


class HostTimer(IntervalTimer[float]):
    """Marks are host-clock readings: device time only where ops run synchronously (CPU)."""

    kind = "host_clock"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        super().__init__()
        self._clock = clock

    def mark(self) -> float:
        return self._clock()

    def elapsed_s(self, start: float, end: float) -> float:
        return end - start


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
    """A range's time is the busy time of the device work launched inside it.

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
        """Inclusive seconds per range key from Kineto events (``_KinetoEvent``-like objects):
        sort the events, time each piece of work at its host-side start, charge it to every
        range open on its thread at that moment."""
        sorted_events = self._sort(events)
        items = self._device_items(sorted_events) if self.device == "cuda" else _outermost_ops(sorted_events.cpu_ops)
        self.stats["work_items"] += len(items)
        return self._by_range(items, sorted_events.ranges)

    def _sort(self, events: Iterable[Any]) -> _KinetoEvents:
        out = _KinetoEvents()
        on_cuda = self.device == "cuda"
        for e in events:
            activity = _activity(e)
            if activity in _DEVICE_WORK:
                if on_cuda:
                    out.device_work.append((e.linked_correlation_id(), e.correlation_id(), e.duration_ns()))
                continue
            if activity in _LAUNCHES:
                out.launches[e.correlation_id()] = (e.start_thread_id(), e.start_ns())
                continue
            if activity not in ("cpu_op", "user_annotation"):
                continue
            name = e.name()
            if name.startswith(_RANGE_PREFIX):
                out.ranges.setdefault(e.start_thread_id(), []).append(
                    (e.start_ns(), e.end_ns(), int(name[len(_RANGE_PREFIX):])))
            elif on_cuda:
                out.ops[e.correlation_id()] = (e.start_thread_id(), e.start_ns())
            elif activity == "cpu_op" and not name.startswith("profiler::"):
                out.cpu_ops.setdefault(e.start_thread_id(), []).append((e.start_ns(), e.end_ns()))
        return out

    def _device_items(self, ev: _KinetoEvents) -> list[tuple[int, int, int]]:
        """Each kernel or copy at the host thread and time of the op that issued it (its linked
        CPU op, else its runtime launch); work linked to neither is counted as unlinked."""
        items: list[tuple[int, int, int]] = []
        stats = self.stats
        for linked, corr, duration in ev.device_work:
            where = ev.ops.get(linked) if linked else None
            if where is not None:
                stats["linked_via_op"] += 1
            else:
                where = ev.launches.get(corr)
                if where is None:
                    stats["unlinked"] += 1
                    stats["unlinked_s"] += duration / 1e9
                    continue
                stats["linked_via_launch"] += 1
            items.append((where[0], where[1], duration))
        return items

    def _by_range(self, items: list[tuple[int, int, int]],
                  ranges: dict[int, list[tuple[int, int, int]]]) -> dict[int, float]:
        index = {thread: _stack_index(rs) for thread, rs in ranges.items()}
        out: dict[int, float] = {}
        stats = self.stats
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


@dataclass
class _KinetoEvents:
    """One profile's events, sorted by kind (thread ids and host times in ns)."""

    ranges: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)  # thread -> [(start, end, key)]
    ops: dict[int, tuple[int, int]] = field(default_factory=dict)  # correlation id -> (thread, start): CPU ops
    launches: dict[int, tuple[int, int]] = field(default_factory=dict)  # correlation id -> (thread, start): runtime
    cpu_ops: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # thread -> [(start, end)]: CPU mode
    device_work: list[tuple[int, int, int]] = field(default_factory=list)  # (linked op id, correlation id, ns)


def _outermost_ops(cpu_ops: dict[int, list[tuple[int, int]]]) -> list[tuple[int, int, int]]:
    """CPU mode: the outermost ops only (an op's children run inside its time)."""
    items: list[tuple[int, int, int]] = []
    for thread, spans in cpu_ops.items():
        outer_end = None
        for start, end in sorted(spans, key=lambda se: (se[0], -se[1])):
            if outer_end is None or start >= outer_end:
                items.append((thread, start, end - start))
                outer_end = end
    return items


TIMER_METHODS = ("kernel_time", "host_clock")


def device_of(model: nn.Module) -> str:
    """``"cuda"`` if the model's parameters are on a CUDA device, else ``"cpu"``."""
    param = next(model.parameters(), None)
    return "cuda" if param is not None and param.device.type == "cuda" else "cpu"


def timer_for(model: nn.Module, method: str | None = None) -> Timer:
    """The default: kernel time on CUDA, host clock on CPU (exact there: CPU ops are synchronous).

    ``method`` forces one of the two; ``kernel_time`` on a CPU model attributes
    CPU op time, which is how the kernel attribution runs without a GPU.
    """
    device = device_of(model)
    method = method or ("kernel_time" if device == "cuda" else "host_clock")
    if method == "kernel_time":
        return KernelTimer(device)
    if method == "host_clock":
        return HostTimer()
    raise LayerProfileError(f"unknown timing method {method!r}; known: {', '.join(TIMER_METHODS)}")
