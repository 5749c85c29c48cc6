"""The layer profiler: forward hooks that time the chosen modules, per phase.

A pre-hook opens a range at a module's forward entry, a post-hook closes it;
ranges nest (a container's holds its units'). No hook synchronizes. What a
range's time is depends on the timer (``actors.layers.timers``; its kind is
each row's ``gpu_time_method``).

Besides the units, the profiler ranges the root (the whole forward) and every
called module that holds a unit (``rest_units``): a container's time minus its
ranged children's is its ``<role>_rest`` row, so a phase's rows add up to its
whole forward and nothing is counted twice.

A forward whose input is longer than one token, or the first forward after
``begin_generate``, is prefill; every other forward (one token, KV cache) is
decode.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from actors.layers import LayerProfileError
from actors.layers.select import Unit, assert_disjoint, rest_units
from actors.layers.timers import Timer, timer_for

PREFILL, DECODE = "prefill", "decode"
_PHASES = (PREFILL, DECODE)


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


def _sequence_length(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if value is not None:
            return int(value.shape[1])
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
        return int(args[0].shape[1])
    return None


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
        self._handles: list[RemovableHandle] = []
        self._session: AbstractContextManager[None] | None = None

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
        session = self._session = self.timer.session()
        session.__enter__()
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

    def _on_forward(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        length = _sequence_length(args, kwargs)
        prefill = self._next_is_prefill or (length is not None and length > 1)
        self._next_is_prefill = False
        self.phase = PREFILL if prefill else DECODE
        self._phase_i = 0 if prefill else 1
        self.forwards[self.phase] += 1

    def _pre(self, i: int) -> Callable[[nn.Module, tuple[Any, ...]], None]:
        stack, timer = self._open[i], self.timer

        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            key = 2 * i + self._phase_i
            stack.append((key, timer.begin(key)))

        return hook

    def _post(self, i: int) -> Callable[[nn.Module, tuple[Any, ...], Any], None]:
        stack, timer, calls = self._open[i], self.timer, self._calls
        pending: list[Any] | None = getattr(timer, "pending", None)  # interval timers: pairs held until a flush

        def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
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
        out: list[ModuleTime] = []
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
