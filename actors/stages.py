"""Timing an actor's stages (``sweeper.core.stages``) where they happen.

The actor makes a ``StageClock`` current for each of its calls; code deep in
the data plane (weights materialised inside a backend's load) marks its stage
with ``stage(name)`` without being handed the clock. Outside a current clock
(a backend used directly, a benchmark) marking is free and records nothing.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sweeper.core.stages import STAGES, StageSpan

_CURRENT: contextvars.ContextVar[StageClock | None] = contextvars.ContextVar("sweeper_stage_clock", default=None)


# A stage shorter than this (a compile with nothing to compile, a baseline that is off)
# is counted in the stage around it, and a piece of a paused stage shorter than this is
# left to ``idle``: a trial's spans stay a handful, not one per boundary crossed.
MIN_SPAN_S = 1e-3


@dataclass
class _OpenStage:
    """A stage entered and not yet left."""

    name: str
    entered_s: float
    piece_s: float  # where its current piece began (after its last nested stage ended)
    split: bool = False  # a nested stage has split it into pieces


class StageClock:
    """Exclusive stage times: a nested stage that lasts pauses the one around it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        # Wall time of the monotonic clock's zero: spans get UTC start times without
        # reading the wall clock (which may step) at every boundary.
        self._wall_at_zero = datetime.now(timezone.utc) - timedelta(seconds=clock())
        self._stack: list[_OpenStage] = []  # open stages, innermost last
        self.spans: list[StageSpan] = []

    def _piece(self, name: str, start_s: float, end_s: float) -> None:
        if end_s - start_s >= MIN_SPAN_S:
            self.spans.append(StageSpan(name, self._wall_at_zero + timedelta(seconds=start_s), end_s - start_s))

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        if name not in STAGES:
            raise KeyError(f"unknown stage {name!r}")
        now = self._clock()
        self._stack.append(_OpenStage(name, now, now))
        try:
            yield
        finally:
            entry = self._stack.pop()
            now = self._clock()
            if now - entry.entered_s >= MIN_SPAN_S or entry.split:
                self._piece(entry.name, entry.piece_s, now)
                if self._stack:  # the stage around it: a piece up to here, then it resumes
                    outer = self._stack[-1]
                    self._piece(outer.name, outer.piece_s, entry.entered_s)
                    outer.piece_s, outer.split = now, True

    def carve(self, name: str, start_s: float, end_s: float) -> None:
        """A stage nested in the open one, timed after the fact on this clock (an engine's
        phases, read from its log once its start returned): cut out of the open stage's
        current piece. Carve in time order."""
        if name not in STAGES:
            raise KeyError(f"unknown stage {name!r}")
        if not self._stack:
            self._piece(name, start_s, end_s)
            return
        outer = self._stack[-1]
        start_s, end_s = max(start_s, outer.piece_s), min(end_s, self._clock())
        if end_s - start_s < MIN_SPAN_S:
            return
        self._piece(outer.name, outer.piece_s, start_s)
        self._piece(name, start_s, end_s)
        outer.piece_s, outer.split = end_s, True

    def add(self, name: str, started_at: datetime, duration_s: float) -> None:
        """A span timed elsewhere (the actor's own start, before any clock existed)."""
        if duration_s > 0:
            self.spans.append(StageSpan(name, started_at, duration_s))

    def take(self) -> list[StageSpan]:
        """The spans recorded so far, handed over once."""
        spans, self.spans = self.spans, []
        return spans

    @contextlib.contextmanager
    def current(self) -> Iterator[StageClock]:
        token = _CURRENT.set(self)
        try:
            yield self
        finally:
            _CURRENT.reset(token)


def carve(name: str, start_s: float, end_s: float) -> None:
    """``StageClock.carve`` on the current clock (monotonic times), if there is one."""
    clock = _CURRENT.get()
    if clock is not None:
        clock.carve(name, start_s, end_s)
    elif name not in STAGES:
        raise KeyError(f"unknown stage {name!r}")


def stage(name: str) -> contextlib.AbstractContextManager[None]:
    """Time the enclosed code as stage ``name`` on the current clock, if there is one."""
    clock = _CURRENT.get()
    if clock is not None:
        return clock.stage(name)  # which checks the name
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}")
    return contextlib.nullcontext()
