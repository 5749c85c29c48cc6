"""Typed errors of the control plane.

Every error a user can cause by what they typed (a sweep file, a flag, a path)
is a ``UserInputError``: the CLI prints its one-line message and exits with 2,
never a traceback.
"""

from __future__ import annotations


def first_line(exc: BaseException) -> str:
    """An exception's message as one line (its first, stripped), or its type's name when it
    has none: what a one-line error message or a stored ``error`` column shows of it."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


class SweeperError(Exception):
    """Base class of every error sweeper raises on purpose."""


class UserInputError(SweeperError):
    """Bad input: the CLI reports it on one line and exits with code 2."""


class SweepFileError(UserInputError):
    """A sweep file that cannot be read, parsed or validated: every problem found, one per line."""

    def __init__(self, path: str, field: str | None, message: str,
                 more: tuple[tuple[str | None, str], ...] = ()):
        self.path = path
        self.field = field
        self.message = message
        self.problems: tuple[tuple[str | None, str], ...] = ((field, message), *more)
        super().__init__("\n".join(f"{path}: {f}: {m}" if f else f"{path}: {m}" for f, m in self.problems))


class ModelResolutionError(UserInputError):
    """A model entry that is neither a preset, a local checkpoint nor a reachable hub id."""


class ResultsError(UserInputError):
    """A results directory that does not exist or holds no shards."""
