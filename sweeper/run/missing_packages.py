"""Failures a missing Python package caused, and whether this environment has it now.

A trial that failed because a package was not installed (an engine's serving extras, a
quantization library) stays failed in the results after the package is installed: a plain
re-run keeps failed results. The end of a run says so for those failures, so that the user
knows ``--retry-failed`` will now get further.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterable
from dataclasses import dataclass

# Python's own words for an import that found no module, with the module's name.
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
# An import failure that names no module (a library's own "pip install x[extra]" message).
_IMPORT_FAILURE = re.compile(r"\b(?:ModuleNotFoundError|ImportError)\b|\bpip install\b")


@dataclass(frozen=True)
class MissingPackageFailure:
    """A stored failure whose error text says a package was missing; ``modules`` are the ones it needed."""

    trial_id: str
    modules: tuple[str, ...]

    @property
    def installed_now(self) -> bool:
        """Whether every module it needed imports in this environment now (nothing is imported)."""
        return all(_importable(m) for m in self.modules)


def missing_package_failure(trial_id: str, error: str | None,
                            required: Iterable[str]) -> MissingPackageFailure | None:
    """The failure as a missing-package one, or None if its text says nothing of the kind.

    Modules named in the text (``No module named 'x'``) are what it needed; a text that is an
    import failure without a name (``ImportError: ... pip install transformers[serving]``)
    needed the modules the trial's backend requires, which the plan checks on the nodes.
    """
    if not error:
        return None
    named = tuple(dict.fromkeys(_NO_MODULE.findall(error)))
    if named:
        return MissingPackageFailure(trial_id, named)
    required = tuple(required)
    if required and _IMPORT_FAILURE.search(error):
        return MissingPackageFailure(trial_id, required)
    return None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False
