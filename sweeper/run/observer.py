"""Where a run's messages and events go: an ``Observer`` (the command line prints them and
draws its live view from the events; a notebook or a test keeps them). The session and the
scheduler both speak to one, so that nothing in ``sweeper.run`` prints on its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sweeper.run.events import Notice, Polled, RunEvent


class Observer(Protocol):
    """Where a run's messages and events go."""

    def say(self, line: str) -> None:
        """What the run is doing (connecting, resuming, how many trials)."""

    def warn(self, line: str) -> None:
        """Something the user should know and may want to change (the run goes on)."""

    def on_event(self, event: RunEvent) -> None:
        """What happened in the run (``sweeper.run.events``); a ``Notice`` is also a line to say."""


@dataclass
class Quiet:
    """An ``Observer`` that keeps every message and event and shows nothing (but the ``Polled``
    ticks, several a second: they say only that time passed, and a long run would pile them up)."""

    said: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    events: list[RunEvent] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.said.append(line)

    def warn(self, line: str) -> None:
        self.warnings.append(line)

    def on_event(self, event: RunEvent) -> None:
        if isinstance(event, Polled):
            return
        self.events.append(event)
        if isinstance(event, Notice):
            self.say(event.text)
