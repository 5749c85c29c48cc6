"""Where a run's messages go: an ``Observer`` (the command line prints them; a notebook or a
test keeps them). The session and the scheduler both speak to one, so that nothing in
``sweeper.run`` prints on its own."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rich.console import Console


class Observer(Protocol):
    """Where a run's messages go (the command line prints them; a notebook may keep them)."""

    console: Console | None  # the live progress view's console; None: no view

    def say(self, line: str) -> None:
        """What the run is doing (connecting, resuming, how many trials)."""

    def warn(self, line: str) -> None:
        """Something the user should know and may want to change (the run goes on)."""


@dataclass
class Quiet:
    """An ``Observer`` that keeps every message and shows nothing."""

    console: Console | None = None
    said: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        self.said.append(line)

    def warn(self, line: str) -> None:
        self.warnings.append(line)
