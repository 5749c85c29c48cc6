"""What the plan says of the engine versions its trials will run on: each engine's versions on
the nodes that run its trials (a note), and one warning per engine whose version there is
outside the range sweeper is tested with (``sweeper.core.engine_versions.TESTED``)."""

from __future__ import annotations

from collections.abc import Iterable

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sweeper.core.backends import BACKENDS
from sweeper.core.engine_versions import TESTED
from sweeper.core.settings import Device
from sweeper.core.trial import Trial
from sweeper.plan.capabilities import Capabilities


def engine_versions(trials: Iterable[Trial], device: Device, capabilities: Capabilities) -> dict[str, set[str]]:
    """Each tested engine the trials need, with its versions on the nodes they fit."""
    # Asked of the nodes once per engine and trial width, not once per trial (a plan may hold thousands).
    needs = {(module, t.num_gpus) for t in trials
             for module in BACKENDS[t.backend].required_modules(t.backend_options) if module in TESTED}
    found: dict[str, set[str]] = {}
    for module, gpus in needs:
        found.setdefault(module, set()).update(capabilities.versions(module, device, gpus))
    return found


def _tested(version: str, specifier: str) -> bool:
    try:
        return Version(version) in SpecifierSet(specifier)
    except InvalidVersion:
        return False


def version_lines(trials: Iterable[Trial], device: Device, capabilities: Capabilities) -> tuple[list[str], list[str]]:
    """The plan's notes and warnings on engine versions."""
    notes, warnings = [], []
    for module, versions in sorted(engine_versions(trials, device, capabilities).items()):
        shown = ", ".join(sorted(versions)) or "unknown (its nodes are not up yet)"
        notes.append(f"{module} on the nodes that run its trials: {shown} (tested: {TESTED[module]})")
        outside = sorted(v for v in versions if not _tested(v, TESTED[module]))
        if outside:
            warnings.append(f"{module} {', '.join(outside)} is outside the versions sweeper is tested with "
                            f"({TESTED[module]}): its trials run, but what sweeper reads of the engine may have "
                            "moved (docs/ARCHITECTURE.md, \"Engine versions\")")
    return notes, warnings
